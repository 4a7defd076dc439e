package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/projector/projector/source"
)

// GroupConfig is a consumer group on one topic, and how its partitions are
// read.
type GroupConfig struct {
	Config
	Topic string
	// Group is the consumer group the operator named; empty for the one
	// the projection recorded, else Fresh for a new projection.
	Group, Fresh string
	// Owner names this instance in logs.
	Owner string
	// The group protocol's timings (kafka-go's ConsumerGroupConfig).
	HeartbeatInterval, SessionTimeout, RebalanceTimeout, JoinGroupBackoff, PartitionWatchInterval time.Duration
	// MaxWait is how long the broker holds a fetch with nothing to return;
	// BatchSize and Linger bound one batch.
	MaxWait   time.Duration
	BatchSize int
	Linger    time.Duration
	// RereadMaxBytes and RereadMaxTime bound one re-read of the log.
	RereadMaxBytes int64
	RereadMaxTime  time.Duration
}

// Group is a Kafka topic read through a consumer group, as a
// [source.Source]: each generation's assignment is handed to the engine
// as one fenced lane per partition, and the stored positions the engine
// acknowledges are committed to the group (for lag tools only; the
// positions that count are the store's).
type Group struct {
	c       GroupConfig
	clients *Clients
	log     *slog.Logger

	// name is the group joined, once recorded; generation, member and
	// partitions the last generation's; topic what is known of the
	// topic's existence.
	name       atomic.Pointer[string]
	generation atomic.Int32
	member     atomic.Bool
	partitions atomic.Pointer[[]int]
	topic      atomic.Int32
	// owns says this instance has been assigned partitions (told to the
	// group's leader); rec is what the projection recorded.
	owns atomic.Bool
	rec  source.Recorded
	// running counts the functions handed to generations: kafka-go does
	// not track one started on a generation that has already ended, so Run
	// waits on this too.
	running sync.WaitGroup
}

var _ source.Source = (*Group)(nil)

// topic states
const (
	topicUnknown int32 = iota
	topicExists
	topicMissing
)

// Timings of the group's background work.
const (
	// EndsEvery is how often the log ends are read, so the lag is
	// current even when nothing is fetched.
	EndsEvery = 5 * time.Second
	// missingTopicLogEvery is the most often a missing topic is logged.
	missingTopicLogEvery = 30 * time.Second
)

// NewGroup checks c's connection settings and returns the group, not
// joined yet: [Group.Run] joins.
func NewGroup(c GroupConfig, log *slog.Logger) (*Group, error) {
	if c.Topic == "" {
		return nil, errors.New("kafka: a topic is required")
	}
	kc, err := Connect(c.Config)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	g := &Group{c: c, clients: kc, log: log}
	g.name.Store(&c.Group)
	return g, nil
}

// Run records the group, waits for the topic and works the group's
// generations until ctx ends. See [source.Source].
func (g *Group) Run(ctx context.Context, host source.Host) error {
	defer g.clients.Close()
	mctx, stopMonitors := context.WithCancel(ctx)
	var monitors sync.WaitGroup
	monitors.Go(func() { g.watchEnds(mctx, host) })
	monitors.Go(func() { g.clients.Watch.Run(mctx, g.log) })
	defer monitors.Wait()
	defer stopMonitors()

	rec, err := host.Record(ctx, source.Consumer{Kind: source.ConsumerGroup, Explicit: g.c.Group, Fresh: g.c.Fresh, Legacy: LegacyGroup})
	if err != nil {
		return err
	}
	g.rec = rec
	g.name.Store(&rec.Name)
	switch {
	case rec.Previous != "":
		g.log.Warn("the projection moves to another consumer group: instances still in the one it recorded claim its partitions too until they are restarted with this --group",
			"group", rec.Name, "recorded_group", rec.Previous)
	case rec.Legacy:
		g.log.Info("the projection keeps the consumer group it ran in before groups were recorded", "group", rec.Name)
	}
	g.log.Info("projector started", "topic", g.c.Topic, "group", rec.Name, "owner", g.c.Owner,
		"brokers", g.c.Brokers, "tls", g.c.TLS != nil, "sasl", g.c.SASL, "projection", rec.Projection)
	for err == nil && ctx.Err() == nil {
		if err = g.waitTopic(ctx, host); err != nil {
			break
		}
		if err = g.runGroup(ctx, host); errors.Is(err, ErrTopicMissing) {
			err = nil
		}
	}
	g.member.Store(false)
	g.running.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// Name is the consumer group this instance joins (the configured one until
// [Group.Run] recorded it).
func (g *Group) Name() string { return *g.name.Load() }

// Rereader reads the topic again as the lanes read it. See
// [source.Source].
func (g *Group) Rereader() source.Rereader {
	return &Rereader{Dialer: g.clients.Dialer, Brokers: g.c.Brokers, Topic: g.c.Topic, ReadCommitted: g.c.ReadsCommitted(),
		MaxBytes: g.c.RereadMaxBytes, MaxTime: g.c.RereadMaxTime}
}

// Status is the group and its last generation. See [source.Source].
func (g *Group) Status() source.Status {
	return source.Status{Group: g.Name(), Generation: g.generation.Load()}
}

// Checks are the topic's existence and the instance's membership of a
// generation. See [source.Source].
func (g *Group) Checks() []source.Check {
	var checks []source.Check
	switch g.topic.Load() {
	case topicExists:
		checks = append(checks, source.Check{Name: "topic", OK: true, Detail: fmt.Sprintf("topic %q exists", g.c.Topic)})
	case topicMissing:
		checks = append(checks, source.Check{Name: "topic", Detail: fmt.Sprintf("topic %q does not exist; waiting for it", g.c.Topic)})
	default:
		checks = append(checks, source.Check{Name: "topic", Detail: fmt.Sprintf("topic %q not checked yet (brokers not reached)", g.c.Topic)})
	}
	if g.member.Load() {
		var parts []int
		if ps := g.partitions.Load(); ps != nil {
			parts = *ps
		}
		checks = append(checks, source.Check{Name: "group", OK: true,
			Detail: fmt.Sprintf("member of group %q, generation %d, partitions %v", g.Name(), g.generation.Load(), parts)})
	} else {
		checks = append(checks, source.Check{Name: "group", Detail: fmt.Sprintf("not in a generation of group %q", g.Name())})
	}
	return checks
}

// waitTopic returns once the topic exists, waiting with backoff while it
// does not; it returns an *AuthError at once, and ctx's error when it ends.
// A topic that does not exist is waited for, not joined: the instance is
// not ready and logs the topic's name at most every 30 s. It is checked
// before joining the group and at every generation, so a topic deleted
// under a running group sends the instance back to waiting rather than
// into a rebalance loop.
func (g *Group) waitTopic(ctx context.Context, host source.Host) error {
	bo := source.Backoff(10 * time.Second)
	var logged time.Time
	for {
		lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, err := g.clients.PartitionsFresh(lctx, g.c.Topic)
		cancel()
		var ae *AuthError
		switch {
		case err == nil:
			g.topic.Store(topicExists)
			host.Answered()
			if !logged.IsZero() {
				g.log.Info("topic exists now; joining the group", "topic", g.c.Topic)
			}
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &ae):
			return ae
		case errors.Is(err, ErrTopicMissing):
			g.topic.Store(topicMissing)
			host.Answered()
			if time.Since(logged) >= missingTopicLogEvery {
				logged = time.Now()
				g.log.Error("topic does not exist; waiting for it (not ready): create it, or fix --topic",
					"topic", g.c.Topic, "brokers", g.c.Brokers)
			}
		}
		d := bo.NextBackOff()
		if err != nil && !errors.Is(err, ErrTopicMissing) {
			// The retry said in the outage's log is the one slept.
			host.Failed(err, d)
		}
		sleep(ctx, d)
	}
}

// groupRequestTimeout is kafka-go's deadline for a request to the group
// coordinator (heartbeats, commits), and its margin on the two that the
// coordinator may hold: a JoinGroup gets RebalanceTimeout + this, a
// SyncGroup SessionTimeout + this. A coordinator holds a join at most the
// rebalance timeout, so a join is never abandoned while it may still be
// answered; an abandoned one stays parked at the broker, since kafka-go
// learns its member ID only from the answer and cannot leave, and the
// next attempt joins as a new member and starts the rebalance again. It
// is kafka-go's default, said here so that it stays so.
const groupRequestTimeout = 5 * time.Second

// runGroup joins the group and works its generations until ctx ends (nil),
// the topic disappears (ErrTopicMissing) or the brokers refuse us
// (*AuthError). It leaves the group and waits for its lanes before
// returning.
func (g *Group) runGroup(ctx context.Context, host source.Host) error {
	c := g.c
	klog := func(level func(string, ...any)) kafkago.LoggerFunc {
		return func(msg string, args ...any) { level("kafka: " + fmt.Sprintf(msg, args...)) }
	}
	groupID := g.Name()
	// A group that another projection works is refused before joining it:
	// joining would start a rebalance of the other projection's members.
	if err := g.conflict(ctx, groupID); err != nil {
		return err
	}
	balancer := &projectionBalancer{self: g.rec, owns: &g.owns, log: g.log}
	group, err := kafkago.NewConsumerGroup(kafkago.ConsumerGroupConfig{
		ID:                     groupID,
		GroupBalancers:         []kafkago.GroupBalancer{balancer},
		Brokers:                c.Brokers,
		Dialer:                 g.clients.Dialer,
		Topics:                 []string{c.Topic},
		HeartbeatInterval:      c.HeartbeatInterval,
		SessionTimeout:         c.SessionTimeout,
		RebalanceTimeout:       c.RebalanceTimeout,
		JoinGroupBackoff:       c.JoinGroupBackoff,
		Timeout:                groupRequestTimeout,
		WatchPartitionChanges:  true,
		PartitionWatchInterval: c.PartitionWatchInterval,
		StartOffset:            kafkago.FirstOffset,
		Logger:                 klog(g.log.Debug),
		ErrorLogger:            klog(g.log.Debug),
	})
	if err != nil {
		return fmt.Errorf("kafka: consumer group %q: %w", groupID, err)
	}
	// Close ends the generation and waits for every lane it started.
	defer func() {
		g.member.Store(false)
		_ = group.Close()
		g.running.Wait()
	}()
	for {
		gen, err := group.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, kafkago.ErrGroupClosed) {
				return nil
			}
			g.member.Store(false)
			if ae := AsAuthError(c.Config, err); ae != nil {
				return ae
			}
			host.Failed(fmt.Errorf("joining consumer group %q: %w", groupID, err), c.JoinGroupBackoff)
			continue
		}
		host.Answered()
		// kafka-go ends a generation when its partition watcher cannot
		// find the topic, and joins again at once: check the topic at
		// every generation, and wait for it outside the group.
		lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, err = g.clients.PartitionsFresh(lctx, c.Topic)
		cancel()
		if errors.Is(err, ErrTopicMissing) {
			g.topic.Store(topicMissing)
			g.log.Error("topic does not exist any more; leaving the group to wait for it (not ready)", "topic", c.Topic)
			return err
		}
		if len(gen.Assignments[c.Topic]) == 0 {
			// No partition: more instances than partitions, or refused
			// by a leader whose projection holds the group.
			if err := g.conflict(ctx, groupID); err != nil {
				return err
			}
		}
		g.startGeneration(gen, host)
	}
}

func (g *Group) startGeneration(gen *kafkago.Generation, host source.Host) {
	c := g.c
	assigned := gen.Assignments[c.Topic]
	g.generation.Store(gen.ID)
	parts := make([]int, len(assigned))
	for i, a := range assigned {
		parts[i] = a.ID
	}
	g.partitions.Store(&parts)
	g.member.Store(true)
	if len(parts) > 0 {
		g.owns.Store(true)
	}
	g.log.Info("generation joined", "generation", gen.ID, "partitions", parts)

	cm := &committer{gen: gen, topic: c.Topic, pending: map[int]int64{}, sent: map[int]int64{}, log: g.log}
	cm.lanes.Add(len(assigned))
	g.start(gen, func(ctx context.Context) {
		cm.run(ctx)
		// The generation ended: not a member until the next one.
		if g.generation.Load() == gen.ID {
			g.member.Store(false)
		}
	})
	for _, a := range assigned {
		lane := NewLane(LaneConfig{Topic: c.Topic, Partition: a.ID, Brokers: c.Brokers, Dialer: g.clients.Dialer,
			ReadCommitted: c.ReadsCommitted(), MaxWait: c.MaxWait, BatchSize: c.BatchSize, Linger: c.Linger,
			Log: g.log.With("topic", c.Topic, "partition", a.ID), Committed: cm.offer})
		g.start(gen, func(ctx context.Context) {
			defer cm.lanes.Done()
			if err := host.Serve(ctx, lane); err != nil {
				lane.c.Log.Error("partition worker stopped", "err", err)
			}
		})
	}
}

// start runs fn for a generation and counts it until it returns.
func (g *Group) start(gen *kafkago.Generation, fn func(ctx context.Context)) {
	g.running.Add(1)
	gen.Start(func(ctx context.Context) {
		defer g.running.Done()
		fn(ctx)
	})
}

// watchEnds reads the topic's log ends every EndsEvery, so the lag (and
// readiness with a lag bound) is current even when nothing is fetched, and
// the topic's existence is known.
func (g *Group) watchEnds(ctx context.Context, host source.Host) {
	// A turn: a read bounded by EndsEvery, then the next tick.
	beat, done := host.Alive("broker monitor", 2*(EndsEvery+EndsEvery))
	defer done()
	t := time.NewTicker(EndsEvery)
	defer t.Stop()
	for {
		beat()
		hctx, cancel := context.WithTimeout(ctx, EndsEvery)
		ends, err := g.clients.LogEnds(hctx, g.c.Topic)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, ErrTopicMissing):
			g.topic.Store(topicMissing)
			host.Answered()
		case err != nil:
			host.Failed(err, EndsEvery)
		default:
			g.topic.Store(topicExists)
			host.Answered()
			host.Ends(ends)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// committer forwards stored positions to the Kafka group, for lag tooling
// only. It is the one goroutine that commits and never sends a lower
// offset than it sent before.
type committer struct {
	gen   *kafkago.Generation
	topic string
	log   *slog.Logger
	// lanes are the generation's lanes: when the generation ends, the
	// last flush waits for them, since a batch in flight is still
	// committed within the shutdown grace.
	lanes   sync.WaitGroup
	mu      sync.Mutex
	pending map[int]int64
	sent    map[int]int64
}

func (c *committer) offer(partition int, next int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if next > c.pending[partition] {
		c.pending[partition] = next
	}
}

func (c *committer) run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			// The group connection stays open until every function of
			// the generation has returned, this one included.
			c.lanes.Wait()
			c.flush(slog.LevelWarn)
			return
		case <-t.C:
			c.flush(slog.LevelDebug)
		}
	}
}

// flush commits the positions not yet sent. A failure is logged at level:
// quietly on the way (the next tick sends them again), louder for the last
// flush of a generation, after which lag tools show the older offsets.
func (c *committer) flush(level slog.Level) {
	c.mu.Lock()
	offsets := map[int]int64{}
	for p, off := range c.pending {
		if off > c.sent[p] {
			offsets[p] = off
		}
	}
	c.mu.Unlock()
	if len(offsets) == 0 {
		return
	}
	if err := c.gen.CommitOffsets(map[string]map[int]int64{c.topic: offsets}); err != nil {
		c.log.Log(context.Background(), level, "group offset commit failed (positions in PostgreSQL are unaffected; lag tools show the older offsets)", "offsets", offsets, "err", err)
		return
	}
	c.mu.Lock()
	for p, off := range offsets {
		c.sent[p] = off
	}
	c.mu.Unlock()
}

// Ends reads where every partition's log ends, on connections of its own
// that it closes. See [source.Source].
func (g *Group) Ends(ctx context.Context) (map[int]source.LogEnd, error) {
	return LogEnds(ctx, g.c.Config, g.c.Topic)
}

// Starts reads where the partitions' logs start. See [source.Source].
func (g *Group) Starts(ctx context.Context, partitions []int) (map[int]int64, error) {
	return LogStarts(ctx, g.c.Config, g.c.Topic, partitions)
}

func init() {
	source.Register("kafka", func(s source.Settings) (source.Source, error) {
		return NewGroup(GroupConfig{
			Config: s.Kafka, Topic: s.Topic, Group: s.Group, Fresh: s.Fresh, Owner: s.Owner,
			HeartbeatInterval: s.HeartbeatInterval, SessionTimeout: s.SessionTimeout, RebalanceTimeout: s.RebalanceTimeout,
			JoinGroupBackoff: s.JoinGroupBackoff, PartitionWatchInterval: s.PartitionWatchInterval,
			MaxWait: s.MaxWait, BatchSize: s.BatchSize, Linger: s.Linger,
			RereadMaxBytes: s.RereadMaxBytes, RereadMaxTime: s.RereadMaxTime,
		}, s.Logger)
	})
}

package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/snapshot"
	kafkasrc "github.com/projector/projector/source/kafka"
	sqssrc "github.com/projector/projector/source/sqs"
	"github.com/projector/projector/store"
)

// Projector runs the projection of one topic into one store.
type Projector struct {
	cfg   Config
	kafka *kafkasrc.Clients
	// dialer is kafka's, for every Conn and Reader.
	dialer   *kafka.Dialer
	resolver *gapfill.Resolver
	// policy is how held jobs are healed, from the configuration.
	policy gapfill.Policy
	// snapshots is the authority's client, nil when the snapshot step is
	// off; its lanes are reported in /metrics.
	snapshots *snapshot.Client
	// budget is the memory every partition's job cache shares.
	budget *cacheBudget
	// fetchers ask the authority for every partition's held jobs.
	fetchers *fetchPool
	counters counters
	book     partitionBook
	metrics  *metrics
	health   health
	stall    stallState
	// swapWaitAt is when a worker last found a rebuild's swap holding its
	// partition (unix nanoseconds): a pause the watchdog does not count.
	swapWaitAt atomic.Int64
	// applying holds, per partition, when its batch transaction in flight
	// started (unix nanoseconds): a batch that PostgreSQL makes wait is
	// bounded by its own time limit, and the watchdog does not count it.
	applying sync.Map

	// dbOutage is PostgreSQL's outage; sourceOutage is the source's,
	// whichever it is (Kafka's brokers, the SQS queue): the workers, the
	// monitors, the watchdog and readiness share it.
	dbOutage, sourceOutage outage
	// sqs is the queue side of an engine with Source SourceSQS; nil for
	// Kafka.
	sqs *sqsState
	// quarantineLog rate-limits the log line of each quarantined record.
	quarantineLog sampler

	generation atomic.Int32
	// identity is the projection's, and group the consumer group it
	// joins, both resolved when Run starts (recordGroup); owns says this
	// instance has been assigned partitions (told to the group's leader).
	identity store.Identity
	group    atomic.Pointer[string]
	owns     atomic.Bool
	// running counts the functions handed to generations: kafka-go does
	// not track one started on a generation that has already ended, so Run
	// waits on this too.
	running sync.WaitGroup
	// testStallWarning, when set by a test before Run, replaces
	// stallWarning.
	testStallWarning time.Duration
	// testOpenTxnLogAfter, when set by a test before Run, replaces
	// openTxnLogAfter.
	testOpenTxnLogAfter time.Duration
}

// New checks cfg and returns a Projector ready to [Projector.Run].
func New(cfg Config) (*Projector, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	kc, err := cfg.Kafka().Connect()
	if err != nil {
		return nil, err
	}
	p := &Projector{
		cfg:           cfg,
		kafka:         kc,
		dialer:        kc.Dialer,
		budget:        newCacheBudget(cfg.CacheBytes),
		dbOutage:      outage{service: "PostgreSQL", log: cfg.Logger},
		sourceOutage:  outage{service: "Kafka", log: cfg.Logger},
		quarantineLog: sampler{window: 10 * time.Second, burst: 10},
	}
	p.book.stable = cfg.Kafka().ReadsCommitted()
	if cfg.Source == SourceSQS {
		// Builds the client only (the region and credential chain): the
		// queue is first asked at Run.
		qc, err := cfg.SQS.Connect(context.Background())
		if err != nil {
			return nil, err
		}
		p.sourceOutage.service = "SQS"
		p.sqs = &sqsState{client: qc, adoptEvery: heldAdoptEvery}
		p.sqs.reader = sqssrc.NewReader(qc, cfg.Logger, cfg.BatchSize)
	}
	p.metrics = newMetrics(p)
	p.policy = cfg.gapPolicy()
	pol := p.policy
	if pol.Reread || pol.Snapshot {
		p.resolver = &gapfill.Resolver{Window: cfg.RereadWindow, Concurrency: cfg.SnapshotConcurrency}
		if pol.Reread {
			p.resolver.Store = storeRows{cfg.Store}
			// A queue cannot be read again: re-read checks the store only.
			if cfg.Source != SourceSQS {
				p.resolver.Log = &logReader{p: p}
			}
		}
		if pol.Snapshot {
			sc, err := snapshot.NewClient(cfg.SnapshotURL)
			if err != nil {
				return nil, fmt.Errorf("snapshot-url: %w", err)
			}
			sc.Timeout = cfg.SnapshotTimeout
			sc.Redirects = cfg.SnapshotRedirects
			sc.MaxConcurrent = cfg.SnapshotConcurrency
			// A request running past a few median answer times leaves
			// the main lane for a slow lane as wide, or is cut when that
			// is full, and frees its slot for the prompt answers behind
			// it; jobs found slow start there.
			sc.SlowConcurrent = cfg.SnapshotConcurrency
			// Connections to the authority are kept for reuse, one for
			// every slot of both lanes, rather than dialled afresh for
			// every request past the transport's default two.
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.MaxIdleConnsPerHost = 2 * cfg.SnapshotConcurrency
			sc.HTTP = &http.Client{Transport: tr}
			sc.MaxElapsedTime = cfg.SnapshotMaxElapsed
			p.snapshots = sc
			p.resolver.Snapshots = countedSnapshots{src: sc, c: &p.counters}
		}
	}
	return p, nil
}

// Config is the configuration in force, defaults filled in.
func (p *Projector) Config() Config { return p.cfg }

// Run consumes until ctx ends, then finishes or abandons the batches in
// flight, leaves the group, and returns after every goroutine it started
// has returned. It returns nil on a clean stop, and an error when it cannot
// go on: the brokers refuse its credentials or certificate (*AuthError).
//
// A topic that does not exist is waited for, not joined: the instance is
// not ready and logs the topic's name at most every 30 s. It is checked
// before joining the group and at every generation, so a topic deleted
// under a running group sends the instance back to waiting rather than
// into a rebalance loop.
//
// A partition with lag whose position has not moved for StallTimeout ends
// Run with an error wrapping [ErrStalled] (see [Projector.runWatched]).
func (p *Projector) Run(ctx context.Context) error {
	return p.runWatched(ctx, p.run)
}

func (p *Projector) run(ctx context.Context) error {
	cfg := p.cfg
	defer p.kafka.Close()
	mctx, stopMonitors := context.WithCancel(ctx)
	var monitors sync.WaitGroup
	monitors.Go(func() { p.watchDatabase(mctx) })
	if p.sqs != nil {
		monitors.Go(func() { p.watchQueue(mctx) })
	} else {
		monitors.Go(func() { p.watchBrokers(mctx) })
		monitors.Go(func() { p.kafka.Watch.Run(mctx, cfg.Logger) })
	}
	monitors.Go(func() { p.pruneGapLog(mctx) })
	monitors.Go(func() { p.pruneTombstones(mctx) })
	defer monitors.Wait()
	defer stopMonitors()
	// Held jobs' attempts ask the authority through one pool of fetchers
	// for the whole instance; it stops after every worker has.
	fctx, stopFetchers := context.WithCancel(context.Background())
	var fetchers sync.WaitGroup
	if p.resolver != nil && p.resolver.Snapshots != nil {
		main, slow := fetchPoolSizes(cfg.SnapshotConcurrency)
		p.fetchers = startFetchPool(fctx, &fetchers, p.resolver, main, slow, cfg.testAuthorityRequest)
	}
	defer fetchers.Wait()
	defer stopFetchers()

	var err error
	if p.sqs != nil {
		cfg.Logger.Info("projector started", "source", cfg.Source, "queue", cfg.SQS.QueueURL, "owner", cfg.Owner, "projection", cfg.Store.Projection())
		defer p.sqs.client.Close()
		if err = p.claimQueue(ctx); err == nil {
			err = p.runSQS(ctx)
		}
	} else {
		if err = p.recordGroup(ctx); err == nil {
			cfg.Logger.Info("projector started", "topic", cfg.Topic, "group", p.groupName(), "owner", cfg.Owner,
				"brokers", cfg.Brokers, "tls", cfg.TLS != nil, "sasl", cfg.SASL, "projection", cfg.Store.Projection())
		}
	}
	for p.sqs == nil && err == nil && ctx.Err() == nil {
		if err = p.waitTopic(ctx); err != nil {
			break
		}
		if err = p.runGroup(ctx); errors.Is(err, kafkasrc.ErrTopicMissing) {
			err = nil
		}
	}
	p.health.inGroup.Store(false)
	p.running.Wait()
	if ctx.Err() != nil {
		err = nil
	}
	if err != nil {
		cfg.Logger.Error("projector stopped", "err", err, "counters", p.counters.snapshot())
		return err
	}
	cfg.Logger.Info("projector stopped", "counters", p.counters.snapshot())
	return nil
}

// waitTopic returns once the topic exists, waiting with backoff while it
// does not; it returns an *AuthError at once, and ctx's error when it ends.
func (p *Projector) waitTopic(ctx context.Context) error {
	bo := retryPolicy()
	bo.MaxInterval = 10 * time.Second
	var logged time.Time
	for {
		lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, err := p.kafka.PartitionsFresh(lctx, p.cfg.Topic)
		cancel()
		var ae *AuthError
		switch {
		case err == nil:
			p.health.topic.Store(topicExists)
			p.sourceOutage.ok()
			if !logged.IsZero() {
				p.cfg.Logger.Info("topic exists now; joining the group", "topic", p.cfg.Topic)
			}
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &ae):
			return ae
		case errors.Is(err, kafkasrc.ErrTopicMissing):
			p.health.topic.Store(topicMissing)
			p.sourceOutage.ok()
			if time.Since(logged) >= missingTopicLogEvery {
				logged = time.Now()
				p.cfg.Logger.Error("topic does not exist; waiting for it (not ready): create it, or fix --topic",
					"topic", p.cfg.Topic, "brokers", p.cfg.Brokers)
			}
		default:
			p.sourceOutage.failed(err, bo.NextBackOff())
		}
		sleep(ctx, bo.NextBackOff())
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
// the topic disappears (kafkasrc.ErrTopicMissing) or the brokers refuse us
// (*AuthError). It leaves the group and waits for its workers before
// returning.
func (p *Projector) runGroup(ctx context.Context) error {
	cfg := p.cfg
	klog := func(level func(string, ...any)) kafka.LoggerFunc {
		return func(msg string, args ...any) { level("kafka: " + fmt.Sprintf(msg, args...)) }
	}
	groupID := p.groupName()
	// A group that another projection works is refused before joining it:
	// joining would start a rebalance of the other projection's members.
	if err := p.groupConflict(ctx, groupID); err != nil {
		return err
	}
	balancer := &projectionBalancer{self: p.identity, owns: &p.owns, log: cfg.Logger}
	group, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                     groupID,
		GroupBalancers:         []kafka.GroupBalancer{balancer},
		Brokers:                cfg.Brokers,
		Dialer:                 p.dialer,
		Topics:                 []string{cfg.Topic},
		HeartbeatInterval:      cfg.HeartbeatInterval,
		SessionTimeout:         cfg.SessionTimeout,
		RebalanceTimeout:       cfg.RebalanceTimeout,
		JoinGroupBackoff:       cfg.JoinGroupBackoff,
		Timeout:                groupRequestTimeout,
		WatchPartitionChanges:  true,
		PartitionWatchInterval: cfg.PartitionWatchInterval,
		StartOffset:            kafka.FirstOffset,
		Logger:                 klog(cfg.Logger.Debug),
		ErrorLogger:            klog(cfg.Logger.Debug),
	})
	if err != nil {
		return fmt.Errorf("projection: consumer group %q: %w", groupID, err)
	}
	// Close ends the generation and waits for every worker it started.
	defer func() {
		p.health.inGroup.Store(false)
		_ = group.Close()
		p.running.Wait()
	}()
	for {
		gen, err := group.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, kafka.ErrGroupClosed) {
				return nil
			}
			p.health.inGroup.Store(false)
			if ae := cfg.Kafka().AsAuthError(err); ae != nil {
				return ae
			}
			p.sourceOutage.failed(fmt.Errorf("joining consumer group %q: %w", groupID, err), cfg.JoinGroupBackoff)
			continue
		}
		p.sourceOutage.ok()
		// kafka-go ends a generation when its partition watcher cannot
		// find the topic, and joins again at once: check the topic at
		// every generation, and wait for it outside the group.
		lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, err = p.kafka.PartitionsFresh(lctx, cfg.Topic)
		cancel()
		if errors.Is(err, kafkasrc.ErrTopicMissing) {
			p.health.topic.Store(topicMissing)
			cfg.Logger.Error("topic does not exist any more; leaving the group to wait for it (not ready)", "topic", cfg.Topic)
			return err
		}
		if len(gen.Assignments[cfg.Topic]) == 0 {
			// No partition: more instances than partitions, or refused
			// by a leader whose projection holds the group.
			if err := p.groupConflict(ctx, groupID); err != nil {
				return err
			}
		}
		p.startGeneration(gen)
	}
}

func (p *Projector) startGeneration(gen *kafka.Generation) {
	cfg := p.cfg
	assigned := gen.Assignments[cfg.Topic]
	p.generation.Store(gen.ID)
	parts := make([]int, len(assigned))
	for i, a := range assigned {
		parts[i] = a.ID
	}
	p.health.partitions.Store(&parts)
	p.health.inGroup.Store(true)
	if len(parts) > 0 {
		p.owns.Store(true)
	}
	cfg.Logger.Info("generation joined", "generation", gen.ID, "partitions", parts)

	c := &committer{gen: gen, topic: cfg.Topic, pending: map[int]int64{}, sent: map[int]int64{}, log: cfg.Logger}
	c.workers.Add(len(assigned))
	p.start(gen, func(ctx context.Context) {
		c.run(ctx)
		// The generation ended: not a member until the next one.
		if p.generation.Load() == gen.ID {
			p.health.inGroup.Store(false)
		}
	})
	for _, a := range assigned {
		b, alive := p.health.loop(fmt.Sprintf("partition %d worker", a.ID), 0)
		log := cfg.Logger.With("topic", cfg.Topic, "partition", a.ID)
		w := &worker{
			workerDeps: p.workerDeps(),
			beat:       b,
			topic:      cfg.Topic,
			partition:  a.ID,
			log:        log,
			cache:      newJobCache(p.budget),
			position:   -1,
			committed:  c.offer,
			lane: kafkasrc.NewLane(kafkasrc.LaneConfig{Topic: cfg.Topic, Partition: a.ID, Brokers: cfg.Brokers, Dialer: p.dialer,
				ReadCommitted: cfg.Kafka().ReadsCommitted(), MaxWait: cfg.MaxWait, BatchSize: cfg.BatchSize, Linger: cfg.BatchLinger,
				Log: log, Committed: c.offer}),
		}
		p.start(gen, func(ctx context.Context) {
			defer c.workers.Done()
			defer alive()
			defer p.book.drop(w.partition, w)
			switch err := w.run(ctx); {
			case err == nil || errors.Is(err, context.Canceled) || ctx.Err() != nil:
			case errors.Is(err, errFenced):
				// Said when the fence was met; a new owner or a rebuild's
				// swap took the partition. The generation ends, and the
				// instance joins the group again and claims anew.
				w.log.Info("partition worker stopped: fenced; joining the group again")
			default:
				w.log.Error("partition worker stopped", "err", err)
			}
		})
	}
}

// start runs fn for a generation and counts it until it returns.
func (p *Projector) start(gen *kafka.Generation, fn func(ctx context.Context)) {
	p.running.Add(1)
	gen.Start(func(ctx context.Context) {
		defer p.running.Done()
		fn(ctx)
	})
}

// committer forwards stored positions to the Kafka group, for lag tooling
// only. It is the one goroutine that commits and never sends a lower
// offset than it sent before.
type committer struct {
	gen   *kafka.Generation
	topic string
	log   *slog.Logger
	// workers are the generation's partition workers: when the generation
	// ends, the last flush waits for them, since a batch in flight is
	// still committed within the shutdown grace.
	workers sync.WaitGroup
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
			c.workers.Wait()
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

// Status reports this instance's partitions and counters, with its
// DefaultHeldLimit oldest held jobs.
func (p *Projector) Status() Status {
	s, _ := p.StatusPage(HeldQuery{})
	return s
}

// StatusPage is [Projector.Status] with the held jobs q asks for. A query
// it cannot answer (a limit out of range, a cursor no status gave) is an
// error.
func (p *Projector) StatusPage(q HeldQuery) (Status, error) {
	parts := p.book.list()
	page, err := pageHeld(parts, q)
	if err != nil {
		return Status{}, err
	}
	c := p.counters.snapshot()
	for _, ps := range parts {
		c.HeldJobs += int64(ps.HeldJobs)
	}
	ready := p.Readiness()
	st := Status{
		Topic:      p.cfg.Topic,
		Group:      p.groupName(),
		Owner:      p.cfg.Owner,
		Generation: p.generation.Load(),
		Ready:      ready.OK,
		Readiness:  ready,
		Partitions: parts,
		Counters:   c,
		Source:     p.cfg.Source,
		SQS:        p.sqsStatus(),
		HeldPage:   page,
	}
	if p.cfg.Source == SourceKafka {
		st.Isolation, st.LagMeasuredTo = p.cfg.Isolation, lagToHighWatermark
		if p.book.stable {
			st.LagMeasuredTo = lagToStable
		}
	}
	return st, nil
}

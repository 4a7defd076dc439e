package projection

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/snapshot"
)

// Projector runs the projection of one topic into one store.
type Projector struct {
	cfg      Config
	dialer   *kafka.Dialer
	resolver *gapfill.Resolver
	// budget is the memory every partition's job cache shares.
	budget *cacheBudget
	// fetchers ask the authority for every partition's held jobs.
	fetchers *fetchPool
	counters counters
	book     partitionBook

	generation atomic.Int32
	ready      atomic.Bool
	// running counts the functions handed to generations: kafka-go does
	// not track one started on a generation that has already ended, so Run
	// waits on this too.
	running sync.WaitGroup
}

// New checks cfg and returns a Projector ready to [Projector.Run].
func New(cfg Config) (*Projector, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Projector{
		cfg:    cfg,
		dialer: &kafka.Dialer{ClientID: "projector", Timeout: 10 * time.Second, DualStack: true},
		budget: newCacheBudget(cfg.CacheBytes),
	}
	pol := cfg.gapPolicy()
	if pol.Reread || pol.Snapshot {
		p.resolver = &gapfill.Resolver{Window: cfg.RereadWindow, Concurrency: cfg.SnapshotConcurrency}
		if pol.Reread {
			p.resolver.Store = storeRows{cfg.Store}
			p.resolver.Log = &logReader{p: p}
		}
		if pol.Snapshot {
			sc, err := snapshot.NewClient(cfg.SnapshotURL)
			if err != nil {
				return nil, fmt.Errorf("snapshot-url: %w", err)
			}
			sc.Timeout = cfg.SnapshotTimeout
			sc.MaxConcurrent = cfg.SnapshotConcurrency
			sc.MaxElapsedTime = cfg.SnapshotMaxElapsed
			p.resolver.Snapshots = sc
		}
	}
	return p, nil
}

// Config is the configuration in force, defaults filled in.
func (p *Projector) Config() Config { return p.cfg }

// Run consumes until ctx ends, then finishes or abandons the batches in
// flight, leaves the group, and returns after every goroutine it started
// has returned. It returns nil on a clean stop.
func (p *Projector) Run(ctx context.Context) error {
	cfg := p.cfg
	klog := func(level func(string, ...any)) kafka.LoggerFunc {
		return func(msg string, args ...any) { level("kafka: " + fmt.Sprintf(msg, args...)) }
	}
	group, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                     cfg.Group,
		Brokers:                cfg.Brokers,
		Dialer:                 p.dialer,
		Topics:                 []string{cfg.Topic},
		HeartbeatInterval:      cfg.HeartbeatInterval,
		SessionTimeout:         cfg.SessionTimeout,
		RebalanceTimeout:       cfg.RebalanceTimeout,
		JoinGroupBackoff:       cfg.JoinGroupBackoff,
		WatchPartitionChanges:  true,
		PartitionWatchInterval: cfg.PartitionWatchInterval,
		StartOffset:            kafka.FirstOffset,
		Logger:                 klog(cfg.Logger.Debug),
		ErrorLogger:            klog(cfg.Logger.Debug),
	})
	if err != nil {
		return fmt.Errorf("projection: consumer group %q: %w", cfg.Group, err)
	}
	var bg sync.WaitGroup
	bgctx, stopBackground := context.WithCancel(ctx)
	defer func() {
		stopBackground()
		bg.Wait()
	}()
	bg.Go(func() { p.pruneGapLog(bgctx) })
	fctx, stopFetchers := context.WithCancel(context.Background())
	defer stopFetchers()
	var fetchers sync.WaitGroup
	if p.resolver != nil && p.resolver.Snapshots != nil {
		p.fetchers = startFetchPool(fctx, &fetchers, p.resolver, 2*cfg.SnapshotConcurrency)
	}
	cfg.Logger.Info("projector started", "topic", cfg.Topic, "group", cfg.Group, "owner", cfg.Owner,
		"brokers", cfg.Brokers, "projection", cfg.Store.Projection())
	pctx, stopPruner := context.WithCancel(ctx)
	var pruner sync.WaitGroup
	pruner.Go(func() { p.pruneTombstones(pctx) })
	defer func() {
		stopPruner()
		pruner.Wait()
	}()
	for {
		gen, err := group.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, kafka.ErrGroupClosed) {
				break
			}
			p.ready.Store(false)
			cfg.Logger.Warn("joining the consumer group failed; retrying", "group", cfg.Group, "err", err)
			continue
		}
		p.startGeneration(gen)
	}
	p.ready.Store(false)
	// Close ends the generation and waits for every worker it started.
	_ = group.Close()
	p.running.Wait()
	stopFetchers()
	fetchers.Wait()
	cfg.Logger.Info("projector stopped", "counters", p.counters.snapshot())
	return nil
}

func (p *Projector) startGeneration(gen *kafka.Generation) {
	cfg := p.cfg
	assigned := gen.Assignments[cfg.Topic]
	p.generation.Store(gen.ID)
	p.ready.Store(true)
	parts := make([]int, len(assigned))
	for i, a := range assigned {
		parts[i] = a.ID
	}
	cfg.Logger.Info("generation joined", "generation", gen.ID, "partitions", parts)

	c := &committer{gen: gen, topic: cfg.Topic, pending: map[int]int64{}, sent: map[int]int64{}, log: cfg.Logger}
	c.workers.Add(len(assigned))
	p.start(gen, c.run)
	for _, a := range assigned {
		w := &worker{
			p:         p,
			topic:     cfg.Topic,
			partition: a.ID,
			log:       cfg.Logger.With("topic", cfg.Topic, "partition", a.ID),
			cache:     newJobCache(p.budget),
			position:  -1,
			committed: c.offer,
		}
		p.start(gen, func(ctx context.Context) {
			defer c.workers.Done()
			defer p.book.drop(w.partition, w)
			if err := w.run(ctx); err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
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
	log   interface{ Debug(string, ...any) }
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
			c.flush()
			return
		case <-t.C:
			c.flush()
		}
	}
}

func (c *committer) flush() {
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
		c.log.Debug("group offset commit failed (positions in PostgreSQL are unaffected)", "err", err)
		return
	}
	c.mu.Lock()
	for p, off := range offsets {
		c.sent[p] = off
	}
	c.mu.Unlock()
}

// Status reports this instance's partitions and counters.
func (p *Projector) Status() Status {
	parts := p.book.list()
	c := p.counters.snapshot()
	for _, ps := range parts {
		c.HeldJobs += int64(len(ps.Held))
	}
	return Status{
		Topic:      p.cfg.Topic,
		Group:      p.cfg.Group,
		Owner:      p.cfg.Owner,
		Generation: p.generation.Load(),
		Ready:      p.ready.Load(),
		Partitions: parts,
		Counters:   c,
	}
}

// Ready reports whether the instance has joined the group.
func (p *Projector) Ready() bool { return p.ready.Load() }

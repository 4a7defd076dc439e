package projection

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/observe"
	"github.com/projector/projector/snapshot"
	"github.com/projector/projector/source"
)

// Projector runs the projection of one topic into one store.
type Projector struct {
	cfg Config
	// written is set by a rebuild that started from an empty shadow: the
	// jobs it has written, so it reads only those ([writtenSet]).
	written *writtenSet
	// src hands the engine its lanes (Config.From, or the source the
	// configuration describes).
	src      source.Source
	resolver *gapfill.Resolver
	// policy is how held jobs are healed, from the configuration.
	policy gapfill.Policy
	// snapshots is the authority's client, nil when the snapshot step is
	// off; its lanes are reported in /metrics.
	snapshots *snapshot.Client
	// budget is the memory every partition's job cache shares.
	budget *cacheBudget
	// slots bounds the batches every partition's worker holds at once.
	slots *batchSlots
	// fetchers ask the authority for every partition's held jobs.
	fetchers *fetchPool
	counters counters
	book     partitionBook
	metrics  *observe.Metrics
	health   health
	// watchdog stops Run at a stall, and says so on /healthz.
	watchdog *observe.Watchdog
	// swapWaitAt is when a worker last found a rebuild's swap holding its
	// partition (unix nanoseconds): a pause the watchdog does not count.
	swapWaitAt atomic.Int64
	// applying holds, per partition, when its batch transaction in flight
	// started (unix nanoseconds): a batch that PostgreSQL makes wait is
	// bounded by its own time limit, and the watchdog does not count it.
	applying sync.Map

	// dbOutage is PostgreSQL's outage; sourceOutage is the source's,
	// whichever it is (Kafka's brokers, the SQS queue): the workers, the
	// source's monitors, the watchdog and readiness share it.
	dbOutage, sourceOutage observe.Outage
	// quarantineLog rate-limits the log line of each quarantined record.
	quarantineLog observe.Sampler
	// adoptEvery is how often a shared lane's worker adopts the held
	// deltas other instances stored: heldAdoptEvery, shorter in tests.
	adoptEvery time.Duration

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
	src := cfg.From
	if src == nil {
		var err error
		if src, err = cfg.source(); err != nil {
			return nil, err
		}
	}
	p := &Projector{
		cfg:           cfg,
		src:           src,
		budget:        newCacheBudget(cfg.CacheBytes),
		slots:         newBatchSlots(cfg.BatchesInFlight),
		dbOutage:      observe.Outage{Service: "PostgreSQL", Log: cfg.Logger},
		sourceOutage:  observe.Outage{Service: "Kafka", Log: cfg.Logger},
		quarantineLog: observe.Sampler{Window: 10 * time.Second, Burst: 10},
		adoptEvery:    heldAdoptEvery,
	}
	p.book.stable = cfg.Source == SourceKafka && cfg.Kafka().ReadsCommitted()
	if cfg.Source == SourceSQS {
		p.sourceOutage.Service = "SQS"
	}
	p.metrics = newMetrics(p)
	p.watchdog = &observe.Watchdog{Timeout: cfg.StallTimeout, Topic: cfg.Topic, Log: cfg.Logger,
		Engine: watched{p}, Stalls: &p.counters.stalls}
	p.policy = cfg.gapPolicy()
	pol := p.policy
	if pol.Reread || pol.Snapshot {
		p.resolver = &gapfill.Resolver{Window: cfg.RereadWindow, Concurrency: cfg.SnapshotConcurrency}
		if pol.Reread {
			p.resolver.Store = storeRows{cfg.Store}
			// A queue cannot be read again: re-read checks the store only.
			if rr := src.Rereader(); rr != nil {
				p.resolver.Log = &logReader{r: rr}
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
// flight, leaves the group (or stops receiving), and returns after every
// goroutine it started has returned. It returns nil on a clean stop, and an
// error when it cannot go on: the brokers refuse its credentials or
// certificate (*AuthError), or another projection works the group or the
// queue (*GroupConflictError).
//
// A topic that does not exist is waited for, not joined: the instance is
// not ready and logs the topic's name at most every 30 s.
//
// A partition with lag whose position has not moved for StallTimeout ends
// Run with an error wrapping [ErrStalled] (see [observe.Watchdog.Run]).
func (p *Projector) Run(ctx context.Context) error {
	return p.watchdog.Run(ctx, p.run)
}

func (p *Projector) run(ctx context.Context) error {
	cfg := p.cfg
	mctx, stopMonitors := context.WithCancel(ctx)
	var monitors sync.WaitGroup
	monitors.Go(func() { p.watchDatabase(mctx) })
	monitors.Go(func() { p.logProgress(mctx) })
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

	err := p.src.Run(ctx, host{p})
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
	page, err := observe.PageHeld(parts, q)
	if err != nil {
		return Status{}, err
	}
	c := p.counters.snapshot()
	for _, ps := range parts {
		c.HeldJobs += int64(ps.HeldJobs)
	}
	ready := p.Readiness()
	ss := p.src.Status()
	st := Status{
		Topic:      p.cfg.Topic,
		Group:      ss.Group,
		Owner:      p.cfg.Owner,
		Generation: ss.Generation,
		Ready:      ready.OK,
		Readiness:  ready,
		Partitions: parts,
		Counters:   c,
		Source:     p.cfg.Source,
		SQS:        ss.Queue,
		HeldPage:   page,
	}
	if p.cfg.Source == SourceKafka {
		st.Isolation, st.LagMeasuredTo = p.cfg.Isolation, observe.LagToHighWatermark
		if p.book.stable {
			st.LagMeasuredTo = observe.LagToStable
		}
	}
	return st, nil
}

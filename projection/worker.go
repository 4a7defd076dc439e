package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/internal/buildhook/failpoint"
	"github.com/projector/projector/observe"
	"github.com/projector/projector/source"
	"github.com/projector/projector/store"
)

// worker owns one partition for one generation: nothing else reads its
// records or writes under its epoch. Its loop runs in stages, one file
// each: claim.go (claim the partition, restore its held deltas), fetch.go
// (wait for records from its lane's [Reader]), plan.go (turn them into one
// transaction's writes) and commit.go (apply, then settle the cache, the
// detector and the counters, and acknowledge); isolate.go takes over a
// batch PostgreSQL refuses for its data.
type worker struct {
	workerDeps
	topic     string
	partition int
	epoch     int64
	log       *slog.Logger
	cache     *jobCache
	detector  *gapfill.Detector
	// position is where the partition is read from: the stored position,
	// or where the source moved it without a batch (records deleted
	// before they were read, offsets that hold nothing to deliver), which
	// the worker stores on its own when no batch follows; stored is the
	// position as last committed.
	position, stored int64
	// hwm and stable are the partition's high watermark and last stable
	// offset as its source last saw them.
	hwm, stable int64
	// open is the transaction the partition waits on, if any.
	open openTxn
	// last is the last record a committed batch read (from the claim
	// until one does): what the log is compared with.
	last *store.LogMark
	// beat is this worker's sign of life for /healthz.
	beat *observe.Beat

	// lane is what the worker runs, and src its records once opened.
	lane Lane
	src  Reader
	// adoptEvery is how often a shared lane's worker adopts the held
	// deltas other instances stored ([worker.adoptHeld]).
	adoptEvery time.Duration

	// attempts runs the held jobs' attempts in the background.
	attempts *attempts

	// heldView is the MaxHeldLimit oldest held jobs as last published,
	// out of heldViewOf, rebuilt only when the detector changed, and at
	// most every heldViewEvery.
	heldView     []HeldJob
	heldViewOf   int
	heldVersion  uint64
	heldBuiltAt  time.Time
	heldViewSeen bool

	// swapLogged is when the worker last said it waits for a swap.
	swapLogged time.Time

	// jobOf is [worker.plan]'s index of each decoded record's job, reused
	// from batch to batch; empty between them.
	jobOf []int
	// jobsSeen is how many jobs the last batch planned had: the size the
	// next batch's maps keyed by job start at.
	jobsSeen int
}

// workerDeps is what a partition worker uses besides its own state: the
// store, the gap resolution machinery, the settings it reads, and where it
// reports (logs, counters, metrics, status, health). Its Projector builds
// it ([Projector.workerDeps]); the pointers are shared by every worker of
// the instance.
type workerDeps struct {
	store *store.Store
	cfg   workerConfig
	// slots bounds the instance's batches in flight.
	slots *batchSlots
	// resolver runs held jobs' re-reads and snapshot fetches, nil when the
	// gap policy has neither; fetchers is the instance's pool that asks the
	// authority, nil without the snapshot step.
	resolver *gapfill.Resolver
	fetchers *fetchPool
	// instanceLog is the instance's logger; a worker's own log adds its
	// topic, partition and epoch.
	instanceLog *slog.Logger
	counters    *counters
	metrics     *observe.Metrics
	book        *partitionBook
	// dbOutage and sourceOutage log outages of PostgreSQL and of the
	// source; databaseAnswered and databaseFailed report to the health
	// checks as well.
	dbOutage, sourceOutage *observe.Outage
	databaseAnswered       func()
	databaseFailed         func(err error, next time.Duration)
	// quarantineLog rate-limits the log line of each quarantined record.
	quarantineLog *observe.Sampler
	// swapWaitAt and applying tell the stall watchdog about pauses it does
	// not count (see [Projector]).
	swapWaitAt *atomic.Int64
	applying   *sync.Map
	// beforeApply, when set (by tests), runs before each batch commit.
	beforeApply func(partition int)
	// written is the jobs a rebuild from an empty shadow has written, nil
	// elsewhere ([writtenSet]).
	written *writtenSet
}

// workerConfig is the part of [Config] a worker reads.
type workerConfig struct {
	Owner, Start string
	GapPolicy    gapfill.Policy
	BatchSize    int
	BatchLinger  time.Duration
	// ReadCommitted: a lane's log is read committed, so it may wait on a
	// transaction still open.
	ReadCommitted bool
	StallTimeout  time.Duration
	// StallWarning, when set (by tests), replaces stallWarning;
	// OpenTxnLogAfter replaces openTxnLogAfter.
	StallWarning, OpenTxnLogAfter time.Duration
}

// workerDeps is what p's partition workers use of it.
func (p *Projector) workerDeps() workerDeps {
	cfg := p.cfg
	return workerDeps{
		store: cfg.Store,
		slots: p.slots,
		cfg: workerConfig{
			Owner: cfg.Owner, Start: cfg.Start, GapPolicy: p.policy,
			BatchSize: cfg.BatchSize, BatchLinger: cfg.BatchLinger, ReadCommitted: cfg.Kafka().ReadsCommitted(),
			StallTimeout: cfg.StallTimeout,
			StallWarning: p.testStallWarning, OpenTxnLogAfter: p.testOpenTxnLogAfter,
		},
		resolver: p.resolver, fetchers: p.fetchers,
		instanceLog: cfg.Logger, counters: &p.counters, metrics: p.metrics, book: &p.book,
		dbOutage: &p.dbOutage, sourceOutage: &p.sourceOutage,
		databaseAnswered: p.databaseAnswered, databaseFailed: p.databaseFailed,
		quarantineLog: &p.quarantineLog, swapWaitAt: &p.swapWaitAt, applying: &p.applying,
		beforeApply: cfg.testBeforeApply,
		written:     p.written,
	}
}

// errFenced stops a worker whose partition was claimed by another owner.
var errFenced = errors.New("partition fenced")

func (w *worker) run(ctx context.Context) error {
	cfg := w.cfg
	caps := w.lane.Caps()
	w.detector = gapfill.NewDetector(cfg.GapPolicy)
	if caps.Fenced {
		claim, err := w.claim(ctx)
		if err != nil {
			return err
		}
		failpoint.Hit(failpoint.Claimed)
		w.epoch = claim.Epoch
		w.storedAt(claim.NextOffset)
		w.log = w.log.With("epoch", w.epoch)
		if caps.Log {
			if claim, err = w.checkLog(ctx, claim); err != nil {
				return err
			}
			w.storedAt(claim.NextOffset)
			w.last = claim.Last
		}
	}
	if err := w.restore(ctx); err != nil {
		return err
	}
	w.publish()

	start := w.stored
	switch {
	case start >= 0:
	case cfg.Start == "latest":
		start = StartLast
	default:
		start = StartFirst
	}
	if caps.Fenced {
		w.log.Info("partition claimed", "next_offset", w.stored, "held_jobs", w.detector.Len())
	} else {
		w.log.Info("reading, unfenced", "held_jobs", w.detector.Len())
	}
	src, err := w.lane.Open(ctx, w.stored, start, LaneHooks{
		Lost:   &w.counters.lost,
		Moved:  func(next int64) { w.position = next },
		NewLog: w.newLogAt,
	})
	if err != nil {
		return err
	}
	// Closed last: once the attempts have stopped.
	defer src.Close()
	w.src = src

	var wg sync.WaitGroup
	defer wg.Wait()
	rctx, stopAttempts := context.WithCancel(ctx)
	defer stopAttempts()
	w.attempts = w.startAttempts(rctx, &wg)
	adopted := time.Now()
	for {
		w.beat.Now()
		if caps.Shared && time.Since(adopted) >= w.adoptEvery {
			adopted = time.Now()
			if err := w.adoptHeld(ctx); err != nil && ctx.Err() == nil {
				w.log.Warn("reading the lane's held deltas failed; trying again later", "err", err)
			}
		}
		// Fetch first: it waits only briefly while attempts are in flight,
		// and at most idleWake when none is, so no answer waits behind it.
		msgs := w.fetch(ctx)
		if err := src.Err(); err != nil && len(msgs) == 0 {
			w.log.Error("the source refused the credentials; stopping", "err", err)
			return err
		}
		res := w.attempts.collect(w)
		if caps.Log {
			w.hwm, w.stable = src.Ends()
			w.detector.Lane(w.readPosition(), w.logEnd(), time.Now())
		}
		// A position the source moved without records is stored on its
		// own when nothing else is to be committed: the stored position
		// passes the markers and aborted transactions at the log's end.
		if len(msgs) > 0 || len(res) > 0 || w.position != w.stored {
			// commit acknowledges what it committed; what it did not
			// stays unacknowledged and comes back.
			if err := w.commit(ctx, msgs, res); err != nil {
				if errors.Is(err, errFenced) && !caps.Fenced {
					err = fmt.Errorf("projection: an unfenced batch was fenced: %w", err)
				}
				return err
			}
		}
		w.reschedule(res)
		if ctx.Err() != nil {
			return nil
		}
		w.attempts.schedule(w)
		w.publish()
	}
}

// heldViewEvery bounds how often the list of held jobs is rebuilt for the
// status when more than heldViewSmall are held: the list is rebuilt only
// when the detector changed, never on every turn of the worker's loop.
// It holds the MaxHeldLimit oldest, whatever the number held.
const (
	heldViewEvery = time.Second
	heldViewSmall = 100
)

func (w *worker) publish() {
	v := w.detector.Version()
	stale := !w.heldViewSeen || v != w.heldVersion
	if stale && (w.detector.Len() <= heldViewSmall || time.Since(w.heldBuiltAt) >= heldViewEvery) {
		gaps := w.detector.Oldest(MaxHeldLimit)
		held := make([]HeldJob, 0, len(gaps))
		for _, g := range gaps {
			j, _ := w.cache.peek(g.JobID)
			held = append(held, HeldJob{
				JobID: g.JobID, Version: j.Version, Missing: j.Missing(10), HeldDeltas: len(j.Held),
				// By the wall clock, as the status orders them.
				Since: g.Since.Round(0), Attempts: g.Attempts, NextAttempt: g.NextAttempt.Round(0), LastStep: string(g.LastStep), LastError: g.LastErr,
				ReadsTo: readsTo(g.ReadsTo),
			})
		}
		w.heldView, w.heldViewOf = observe.SortHeld(w.partition, held), w.detector.Len()
		w.heldVersion, w.heldBuiltAt, w.heldViewSeen = v, time.Now(), true
	}
	w.book.set(PartitionStatus{Partition: w.partition, Position: w.stored, HighWatermark: w.hwm, LastStable: w.stable,
		OpenTransaction: w.waitsOnTransaction(), Epoch: w.epoch,
		HeldJobs: w.detector.Len(), View: w.heldView, ViewOf: w.heldViewOf}, w)
}

// storedAt records that the partition's position next is committed.
func (w *worker) storedAt(next int64) { w.position, w.stored = next, next }

// logEnd is where the lane's log ends as its reader last saw it, as far as
// this worker reads (the last stable offset reading committed); -1 for a
// lane that is not a log. A job that begins to wait now has its first
// attempt wait until the lane has read this far (gapfill's HoldUntil).
func (w *worker) logEnd() int64 {
	if w.lane == nil || !w.lane.Caps().Log {
		return -1
	}
	if w.cfg.ReadCommitted {
		return w.stable
	}
	return w.hwm
}

// readPosition is where the lane reads next, for gapfill's Take; -1 for a
// lane that is not a log.
func (w *worker) readPosition() int64 {
	if w.lane == nil || !w.lane.Caps().Log {
		return -1
	}
	return w.position
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// retryPolicy never gives up by itself: a projection that stops retrying
// loses its place; the caller's context ends it.
func retryPolicy() *backoff.ExponentialBackOff { return source.Backoff(30 * time.Second) }

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// readsTo is a held job's [gapfill.Gap.ReadsTo] as /status shows it: absent
// when its attempts do not wait for the partition to be read further.
func readsTo(offset int64) *int64 {
	if offset < 0 {
		return nil
	}
	return &offset
}

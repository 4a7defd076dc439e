package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/segmentio/kafka-go"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/internal/failpoint"
	"github.com/projector/projector/store"
)

// worker owns one partition for one generation: nothing else reads its
// records or writes under its epoch.
type worker struct {
	p         *Projector
	topic     string
	partition int
	epoch     int64
	log       *slog.Logger
	cache     *jobCache
	detector  *gapfill.Detector
	position  int64
	hwm       int64
	committed func(partition int, next int64)
	// beat is this worker's sign of life for /healthz.
	beat *beat

	// src is where the partition's records come from, from the claim on.
	src Source

	// attempts runs the held jobs' attempts in the background.
	attempts *attempts

	// heldView is the held jobs as last published, rebuilt only when the
	// detector changed, and at most every heldViewEvery.
	heldView     []HeldJob
	heldVersion  uint64
	heldBuiltAt  time.Time
	heldViewSeen bool

	// swapLogged is when the worker last said it waits for a swap.
	swapLogged time.Time
}

// minApplyTimeout is the least a batch transaction is given (see
// [batchTimeout]); shutdownGrace bounds the one in flight when the worker
// is stopped.
const (
	minApplyTimeout = 2 * time.Minute
	shutdownGrace   = 15 * time.Second
)

// batchTimeout bounds one batch transaction: twice the store's statement
// timeout, and at least minApplyTimeout, so an operator who raises the
// statement timeout for batches that legitimately run long is not undone
// by a shorter bound on the whole transaction.
func batchTimeout(st *store.Store) time.Duration {
	return max(minApplyTimeout, 2*st.StatementTimeout())
}

// applyContext is the context of one batch transaction: it outlives ctx,
// because a batch in flight at shutdown is finished rather than thrown away,
// but by no more than shutdownGrace.
func (w *worker) applyContext(ctx context.Context) (context.Context, context.CancelFunc) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchTimeout(w.p.cfg.Store))
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(shutdownGrace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-actx.Done():
		}
	})
	return actx, func() {
		stop()
		cancel()
	}
}

// errFenced stops a worker whose partition was claimed by another owner.
var errFenced = errors.New("partition fenced")

// testHookBeforeApply, when set by a test, runs before each batch commit.
var testHookBeforeApply func(partition int)

func (w *worker) run(ctx context.Context) error {
	cfg := w.p.cfg
	w.detector = gapfill.NewDetector(cfg.gapPolicy())
	claim, err := w.claim(ctx)
	if err != nil {
		return err
	}
	failpoint.Hit(failpoint.Claimed)
	w.epoch = claim.Epoch
	w.position = claim.NextOffset
	w.log = w.log.With("epoch", w.epoch)
	if err := w.restore(ctx); err != nil {
		return err
	}
	w.publish()

	start := claim.NextOffset
	if start < 0 {
		start = kafka.FirstOffset
		if cfg.Start == "latest" {
			start = kafka.LastOffset
		}
	}
	w.log.Info("partition claimed", "next_offset", claim.NextOffset, "held_jobs", w.detector.Len())
	src, err := openKafkaSource(kafkaSourceConfig{
		Brokers: cfg.Brokers, Topic: w.topic, Partition: w.partition, Dialer: w.p.dialer,
		MaxWait: cfg.MaxWait, BatchSize: cfg.BatchSize, Linger: cfg.BatchLinger, Log: w.log,
		Bounds: w.logBounds, Committed: w.committed, Lost: &w.p.counters.lost,
		Moved: func(next int64) { w.position = next },
	}, claim.NextOffset, start)
	if err != nil {
		return err
	}
	defer src.Close()
	w.src = src

	var wg sync.WaitGroup
	defer wg.Wait()
	rctx, stopAttempts := context.WithCancel(ctx)
	defer stopAttempts()
	w.attempts = w.startAttempts(rctx, &wg)
	for {
		w.beat.now()
		// Fetch first: it waits only briefly while attempts are in flight,
		// and at most idleWake when none is, so no answer waits behind it.
		msgs := w.fetch(ctx)
		res := w.attempts.collect(w)
		if e, ok := w.src.(interface{ end() int64 }); ok {
			w.hwm = e.end()
		}
		if len(msgs) > 0 || len(res) > 0 {
			if err := w.commit(ctx, msgs, res); err != nil {
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

// restore loads the held deltas this partition's previous owners stored,
// with their jobs' rows, into a fresh cache and detector.
func (w *worker) restore(ctx context.Context) error {
	w.cache.reset()
	w.detector.Reset()
	if w.attempts != nil {
		w.attempts.reset()
	}
	var held []store.Held
	var rows map[string]store.Job
	op := func() error {
		var err error
		if held, err = w.p.cfg.Store.LoadHeld(ctx, w.topic, w.partition); err != nil {
			return err
		}
		ids := map[string]bool{}
		var list []string
		for _, h := range held {
			if !ids[h.JobID] {
				ids[h.JobID] = true
				list = append(list, h.JobID)
			}
		}
		rows, err = w.p.cfg.Store.LoadJobs(ctx, list)
		return err
	}
	if err := w.retryDatabase(ctx, op); err != nil {
		return err
	}
	for _, h := range held {
		j, ok := w.cache.get(h.JobID)
		if !ok {
			j = gapfill.Job{ID: h.JobID, Held: map[int64]gapfill.Held{}}
			if row, ok := rows[h.JobID]; ok {
				var err error
				if j, err = jobOf(h.JobID, row, map[int64]gapfill.Held{}); err != nil {
					return err
				}
			}
		}
		ops, err := delta.ParseOps(h.Ops)
		if err != nil {
			return fmt.Errorf("projection: held delta %q v%d: %w", h.JobID, h.Version, err)
		}
		ev := event.Event{JobID: h.JobID, Version: h.Version, Kind: event.Delta, Ops: ops, RawOps: h.Ops, EventID: h.EventID}
		j.Held[h.Version] = gapfill.Held{Input: gapfill.Input{Event: ev, Partition: h.SourcePartition, Offset: h.Offset, At: h.Since, LogTime: h.LogTime}, Since: h.Since}

		w.cache.put(j)
		w.detector.Hold(h.JobID, h.Since)
	}
	// Held deltas that a row already covers (another writer moved it while
	// nobody owned the partition) are released by the next attempt: make
	// every restored gap due at once.
	return nil
}

func (w *worker) claim(ctx context.Context) (store.Claim, error) {
	start := int64(-1)
	if w.p.cfg.Start == "latest" {
		var err error
		if start, err = w.latestStart(ctx); err != nil {
			return store.Claim{}, err
		}
	}
	var claim store.Claim
	var waited time.Duration
	var logged time.Time
	op := func() error {
		var err error
		claim, err = w.p.cfg.Store.ClaimFrom(ctx, w.topic, w.partition, w.p.cfg.Owner, start)
		var wait *store.ClaimWaitError
		var swap *store.SwapWaitError
		for (errors.As(err, &wait) || errors.As(err, &swap)) && ctx.Err() == nil {
			// Not an outage: PostgreSQL answered, another owner's open
			// transaction holds the row. Say so when the wait starts and
			// then every claimWaitLogEvery while it lasts (a batch may
			// legitimately run long), and ask again.
			if swap != nil {
				w.swapWait(swap)
				swap = nil
			} else if waited += wait.Waited; time.Since(logged) >= claimWaitLogEvery {
				logged = time.Now()
				w.log.Warn("claim waits for the previous owner's open batch transaction on this partition (a slow, stalled or frozen owner); PostgreSQL ends it once its client is idle past the bound; retrying",
					"previous_owner", wait.Owner, "waited", waited.String())
			}
			w.beat.now()
			sleep(ctx, claimRetryPause)
			claim, err = w.p.cfg.Store.ClaimFrom(ctx, w.topic, w.partition, w.p.cfg.Owner, start)
		}
		return err
	}
	err := w.retryDatabase(ctx, op)
	if err == nil && waited > 0 {
		w.log.Info("claimed after waiting for the previous owner's transaction", "waited", waited.String())
	}
	if err == nil && start >= 0 && claim.NextOffset == start {
		w.log.Info("start latest: the partition's end was stored as its position by the claim", "next_offset", start)
	}
	return claim, err
}

// swapWait logs, at most every swapWaitLogEvery per partition, that the
// partition waits for a rebuild's swap.
func (w *worker) swapWait(e *store.SwapWaitError) {
	w.p.swapWaitAt.Store(time.Now().UnixNano())
	if !w.swapLogged.IsZero() && time.Since(w.swapLogged) < swapWaitLogEvery {
		return
	}
	w.swapLogged = time.Now()
	attrs := []any{"table", e.Table}
	if e.Running > 0 {
		attrs = append(attrs, "swap_running_for", e.Running.Round(time.Second).String())
	}
	w.log.Warn("waiting for a rebuild's swap into the read model: this partition's writes pause until it commits, then it is claimed again from the rebuilt positions",
		attrs...)
}

// swapWaitLogEvery is the most often a partition logs that it still waits
// for a rebuild's swap.
const swapWaitLogEvery = 15 * time.Second

// claimRetryPause separates claims that gave up waiting for the partition
// row; each of them already waited the store's ClaimLockTimeout.
const claimRetryPause = 500 * time.Millisecond

// claimWaitLogEvery is how often a claim that keeps waiting for the
// previous owner's transaction says so again.
const claimWaitLogEvery = 30 * time.Second

// stallWarning is how long a batch transaction runs before the worker
// says so, and then again each time as long again: well before
// the batch timeout, so a stalled database is visible while it lasts. Tests
// shorten it per instance ([Projector] testStallWarning).
const stallWarning = 10 * time.Second

// watchStall logs while a batch transaction runs past stallWarning, until
// the returned stop is called; stop waits for the watcher to end. While
// the batch is within its own time limit it also beats for the worker: a
// batch PostgreSQL makes wait is bounded, not wedged, and /healthz must
// not fail (and a liveness probe restart the instance) in its middle.
func (w *worker) watchStall(records int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	bound := batchTimeout(w.p.cfg.Store) + shutdownGrace
	wg.Go(func() {
		every := stallWarning
		if w.p.testStallWarning > 0 {
			every = w.p.testStallWarning
		}
		t := time.NewTicker(every)
		defer t.Stop()
		alive := time.NewTicker(max(min(time.Second, w.p.cfg.StallTimeout/4), 10*time.Millisecond))
		defer alive.Stop()
		for {
			select {
			case <-done:
				return
			case <-alive.C:
				if time.Since(start) < bound {
					w.beat.now()
				}
			case <-t.C:
				w.log.Warn("batch transaction still running: PostgreSQL is slow, stalled or unreachable",
					"running_for", time.Since(start).Round(time.Second).String(), "records", records, "gives_up_after", batchTimeout(w.p.cfg.Store).String())
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// latestStart is where a partition starts under --start latest: its end,
// read from the broker before the claim, when no position is stored yet;
// -1 when one is (the stored position wins). The claim stores the end in
// the statement that takes the partition: were "latest" stored later, a
// crash or a rebalance in between would resolve it again and skip what
// was produced meanwhile. Records produced between this read and the
// claim are projected, not skipped.
func (w *worker) latestStart(ctx context.Context) (int64, error) {
	next := int64(-1)
	if err := w.retryDatabase(ctx, func() error {
		var err error
		next, err = w.p.cfg.Store.NextOffset(ctx, w.topic, w.partition)
		return err
	}); err != nil {
		return -1, err
	}
	if next >= 0 {
		return -1, nil
	}
	var end int64
	op := func() error {
		_, last, err := w.logBounds(ctx)
		if err != nil {
			w.log.Warn("reading the partition's end for --start latest failed; retrying", "err", err)
			return err
		}
		end = last
		return nil
	}
	if err := backoff.Retry(op, backoff.WithContext(retryPolicy(), ctx)); err != nil {
		return -1, err
	}
	return end, nil
}

// fetch waits for the first record, or until a held gap falls due or a
// resolution arrives, then gathers more for up to the linger time or the
// batch size. It returns early when ctx ends.
func (w *worker) fetch(ctx context.Context) []Record {
	// An idle worker still wakes up every idleWake, so its beat shows it
	// alive.
	wait := idleWake
	if w.attempts != nil && w.attempts.busy() {
		// Answers join the next batch as soon as they are ready.
		wait = attemptPoll
	}
	if due, ok := w.detector.NextDue(); ok && time.Until(due) < wait {
		wait = max(time.Until(due), 10*time.Millisecond)
	}
	recs, err := w.src.Fetch(ctx, wait)
	if err != nil {
		w.p.kafkaOutage.failed(err, time.Second)
		sleep(ctx, time.Second)
		return nil
	}
	return recs
}

func (w *worker) logBounds(ctx context.Context) (first, last int64, err error) {
	cfg := w.p.cfg
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := dialLeader(dctx, w.p.dialer, cfg.Brokers, w.topic, w.partition)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	return conn.ReadOffsets()
}

// reschedule ends the attempts whose results were just committed: a job
// still held backs off, unless it moved forward, in which case the fresh
// wait [worker.settle] gave it stands (the detector knows).
func (w *worker) reschedule(res []gapfill.Resolution) {
	now := time.Now()
	for _, r := range res {
		g, held := w.detector.Gap(r.JobID)
		if !held {
			continue
		}
		reason := errString(r.Err)
		if reason == "" {
			reason = "still held after " + string(r.Last)
		}
		w.detector.Failed(r.JobID, now, r.Last, reason)
		if after, _ := w.detector.Gap(r.JobID); after.Attempts > g.Attempts {
			w.log.Warn("gap still held", "job_id", r.JobID, "step", r.Last, "err", reason, "attempts", after.Attempts)
		}
	}
}

// commit plans and applies one batch, retrying transient failures until
// it lands, the partition is fenced, or ctx ends. An attempt already
// running when ctx ends is finished (its work is done, only the commit
// remains); a batch that never landed is abandoned, to be read again by
// whoever owns the partition next.
func (w *worker) commit(ctx context.Context, msgs []Record, res []gapfill.Resolution) error {
	bo := retryPolicy()
	staleRetries := 0
	for {
		w.beat.now()
		actx, cancel := w.applyContext(ctx)
		now := time.Now()
		pl, err := w.plan(actx, msgs, res, now)
		var result store.Result
		if err == nil {
			if testHookBeforeApply != nil {
				testHookBeforeApply(w.partition)
			}
			failpoint.Hit(failpoint.Planned)
			stop := w.watchStall(len(msgs))
			started := time.Now().UnixNano()
			w.p.applying.Store(w.partition, started)
			result, err = w.p.cfg.Store.Apply(actx, pl.batch)
			w.p.applying.CompareAndDelete(w.partition, started)
			stop()
		}
		cancel()
		if err == nil {
			failpoint.Hit(failpoint.AfterCommit)
			w.p.databaseAnswered()
			w.p.metrics.batch(time.Since(now), len(msgs))
			w.settle(pl, result, now)
			if len(msgs) > 0 {
				w.position = pl.batch.NextOffset
				w.ack(ctx, msgs)
			}
			return nil
		}
		var stale *store.StaleError
		var swap *store.SwapWaitError
		switch {
		case errors.As(err, &swap) && ctx.Err() == nil:
			// Not an outage: the swap holds the partition's row. The
			// batch wrote nothing; it is tried again until the swap
			// commits and fences it.
			w.swapWait(swap)
			w.beat.now()
			if err := w.restore(ctx); err != nil {
				return w.unrestored(ctx, err)
			}
			sleep(ctx, claimRetryPause)
			continue
		case errors.Is(err, store.ErrFenced):
			w.p.counters.fenced.Add(1)
			w.log.Warn("fenced: another owner claimed this partition, or a rebuild swapped its model in; the batch was rolled back and the partition stopped",
				"first_offset", firstOffset(msgs), "records", len(msgs))
			return errFenced
		case errors.As(err, &stale) && ctx.Err() != nil:
			w.log.Warn("batch abandoned at shutdown; it will be read again", "err", err, "first_offset", firstOffset(msgs))
			return nil
		case errors.As(err, &stale):
			w.log.Info("rows moved under the batch; reloading them", "jobs", len(stale.Jobs), "first", stale.Jobs[0])
			for _, id := range stale.Jobs {
				if err = w.forgetRow(ctx, id); err != nil {
					break
				}
			}
			if err == nil {
				if staleRetries++; staleRetries > 3 {
					// Another writer keeps moving these rows: do not spin.
					sleep(ctx, bo.NextBackOff())
				}
				continue
			}
		}
		if store.IsBadData(err) {
			return w.isolate(ctx, msgs, res, err)
		}
		if ctx.Err() != nil {
			w.log.Warn("batch abandoned at shutdown; it will be read again", "err", err, "first_offset", firstOffset(msgs))
			return nil
		}
		d := bo.NextBackOff()
		if store.IsStatementTimeout(err) {
			w.log.Warn("a statement of the batch ran past the statement timeout and was cancelled; if batches legitimately take this long, raise --statement-timeout (or lower --batch-size)",
				"statement_timeout", w.p.cfg.Store.StatementTimeout().String(), "records", len(msgs), "first_offset", firstOffset(msgs))
		}
		w.p.databaseFailed(fmt.Errorf("batch %s/%d@%d: %w", w.topic, w.partition, firstOffset(msgs), err), d)
		w.p.dbOutage.wait(ctx, d)
		if ctx.Err() != nil {
			w.log.Warn("batch abandoned: the partition's generation ended before a retry; it will be read again", "first_offset", firstOffset(msgs))
			return nil
		}
		// The cache may hold what the failed transaction would have
		// written: start again from what is stored.
		if err := w.restore(ctx); err != nil {
			return w.unrestored(ctx, err)
		}
	}
}

// ack acknowledges records whose batch committed. A failure is logged
// only: the records are delivered again and dropped as duplicates.
func (w *worker) ack(ctx context.Context, recs []Record) {
	if err := w.src.Ack(ctx, recs); err != nil {
		w.log.Warn("acknowledging a committed batch failed; its records will be delivered again and dropped as duplicates",
			"records", len(recs), "first_offset", firstOffset(recs), "err", err)
	}
}

// unrestored ends the worker when its memory of the partition could not
// be rebuilt from the store: the batch in flight is not committed, so the
// next owner reads it again. A stop is a warning (the batch is
// abandoned); anything else is an error that ends the partition's worker,
// loudly.
func (w *worker) unrestored(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		w.log.Warn("batch abandoned: the partition's generation ended while its memory was reloaded; it will be read again", "err", err)
		return nil
	}
	return fmt.Errorf("projection: %s/%d: reload after a failed batch: %w", w.topic, w.partition, err)
}

// forgetRow reads a held job's row again, keeping its held deltas; a job
// that holds nothing is just dropped from the cache, for the next plan to
// read.
func (w *worker) forgetRow(ctx context.Context, id string) error {
	j, ok := w.cache.get(id)
	if !ok {
		return nil
	}
	if len(j.Held) == 0 {
		w.cache.forget(id)
		return nil
	}
	rows, err := w.p.cfg.Store.LoadJobs(ctx, []string{id})
	if err != nil {
		return err
	}
	fresh := gapfill.Job{ID: id, Held: j.Held} // no row: version 0
	if r, ok := rows[id]; ok {
		if fresh, err = jobOf(id, r, j.Held); err != nil {
			return err
		}
	}
	w.cache.put(fresh)
	return nil
}

// settle records a committed batch in the cache, the detector and the
// counters.
func (w *worker) settle(pl *plan, res store.Result, now time.Time) {
	t := pl.tally
	settleWholeState := func(s store.Write, written map[string]int64, conflicts map[string]bool) {
		f := pl.folds[s.JobID]
		before, ok := written[s.JobID]
		if !ok {
			// The job was at or past the winner: every one was stale,
			// unless the winner met a row at its own version with other
			// content, which is a conflict.
			_, stale := f.Count(s.Version)
			t.stale += int64(stale)
			if conflicts[s.JobID] {
				t.stale--
				t.conflicts++
				w.log.Warn("conflict: same job and version with different content; the first applied wins",
					"job_id", s.JobID, "version", s.Version, "dropped_event_id", s.EventID, "dropped_offset", s.Offset)
			}
			w.cache.forget(s.JobID)
			return
		}
		applied, stale := f.Count(before)
		deleted := f.Deletes(before)
		t.applied += int64(applied - deleted)
		t.deleted += int64(deleted)
		t.stale += int64(stale)
		if s.Deleted {
			w.cache.put(gapfill.Job{ID: s.JobID, Version: s.Version, EventID: s.EventID, Deleted: true})
		} else {
			// The state is kept raw: decoded only if a delta for the job
			// comes.
			w.cache.put(gapfill.Job{ID: s.JobID, Version: s.Version, Raw: s.State, EventID: s.EventID})
		}
	}
	for _, s := range pl.batch.Snapshots {
		settleWholeState(s, res.SnapshotsApplied, res.SnapshotConflicts)
	}
	for _, s := range pl.batch.Deletes {
		settleWholeState(s, res.DeletesApplied, res.DeleteConflicts)
	}
	for _, j := range pl.jobs {
		w.cache.put(j)
	}
	for id, by := range pl.closed {
		w.detector.Close(id)
		switch by {
		case gapfill.FromLog:
			w.p.counters.closedWait.Add(1)
		case gapfill.FromReread:
			w.p.counters.closedReread.Add(1)
		case gapfill.FromAuthority:
			w.p.counters.closedSnapshot.Add(1)
		}
		w.log.Info("gap closed", "job_id", id, "by", by.String())
	}
	for id, since := range pl.holding {
		switch _, held := w.detector.Gap(id); {
		case !held:
			w.detector.Hold(id, since)
			w.p.counters.gapsOpened.Add(1)
		case pl.progress[id]:
			// It moved forward but waits for a later version: the wait
			// starts afresh for that one.
			w.detector.Progress(id, now)
		}
	}
	w.p.counters.add(t)
	for _, b := range pl.batch.Bad {
		part := b.Partition
		if part < 0 {
			part = w.partition
		}
		w.logQuarantined(part, b.Offset, b.Err)
	}
}

// heldViewEvery bounds how often the list of held jobs is rebuilt for the
// status when more than heldViewSmall are held: the list is rebuilt only
// when the detector changed, never on every turn of the worker's loop.
const (
	heldViewEvery = time.Second
	heldViewSmall = 100
)

func (w *worker) publish() {
	v := w.detector.Version()
	stale := !w.heldViewSeen || v != w.heldVersion
	if stale && (w.detector.Len() <= heldViewSmall || time.Since(w.heldBuiltAt) >= heldViewEvery) {
		gaps := w.detector.Gaps()
		held := make([]HeldJob, 0, len(gaps))
		for _, g := range gaps {
			j, _ := w.cache.peek(g.JobID)
			held = append(held, HeldJob{
				JobID: g.JobID, Version: j.Version, Missing: j.Missing(10), HeldDeltas: len(j.Held),
				Since: g.Since, Attempts: g.Attempts, NextAttempt: g.NextAttempt, LastStep: string(g.LastStep), LastError: g.LastErr,
			})
		}
		w.heldView, w.heldVersion, w.heldBuiltAt, w.heldViewSeen = held, v, time.Now(), true
	}
	w.p.book.set(PartitionStatus{Partition: w.partition, Position: w.position, HighWatermark: w.hwm, Epoch: w.epoch, Held: w.heldView}, w)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// retryPolicy never gives up by itself: a projection that stops retrying
// loses its place; the caller's context ends it.
func retryPolicy() *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 200 * time.Millisecond
	bo.MaxInterval = 30 * time.Second
	bo.MaxElapsedTime = 0
	return bo
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

package projection

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/internal/buildhook/failpoint"
	"github.com/projector/projector/snapshot"
	"github.com/projector/projector/store"
)

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

// slotBeatEvery is how often a worker waiting for a batch slot shows it is
// alive: well within the stall timeout.
func slotBeatEvery(stall time.Duration) time.Duration {
	if stall <= 0 {
		return time.Second
	}
	return max(min(time.Second, stall/4), 10*time.Millisecond)
}

// applyContext is the context of one batch transaction: it outlives ctx,
// because a batch in flight at shutdown is finished rather than thrown away,
// but by no more than shutdownGrace.
func (w *worker) applyContext(ctx context.Context) (context.Context, context.CancelFunc) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchTimeout(w.store))
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
	bound := batchTimeout(w.store) + shutdownGrace
	wg.Go(func() {
		every := stallWarning
		if w.cfg.StallWarning > 0 {
			every = w.cfg.StallWarning
		}
		t := time.NewTicker(every)
		defer t.Stop()
		alive := time.NewTicker(max(min(time.Second, w.cfg.StallTimeout/4), 10*time.Millisecond))
		defer alive.Stop()
		for {
			select {
			case <-done:
				return
			case <-alive.C:
				if time.Since(start) < bound {
					w.beat.Now()
				}
			case <-t.C:
				w.log.Warn("batch transaction still running: PostgreSQL is slow, stalled or unreachable",
					"running_for", time.Since(start).Round(time.Second).String(), "records", records, "gives_up_after", batchTimeout(w.store).String())
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
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
		// A cut with the slow lane full says nothing of the job, unless
		// it happens every time.
		var timeout *snapshot.TimeoutError
		switch {
		case r.Last != gapfill.StepSnapshot:
		case errors.Is(r.Err, snapshot.ErrSlowLaneFull):
			w.detector.SlowLaneFull(r.JobID)
		default:
			w.detector.Slow(r.JobID, errors.Is(r.Err, snapshot.ErrSlow))
			if errors.As(r.Err, &timeout) {
				w.timedOut(r.JobID, timeout)
			}
		}
		w.detector.Failed(r.JobID, now, r.Last, reason)
		if after, _ := w.detector.Gap(r.JobID); after.Attempts > g.Attempts {
			w.log.Warn("gap still held", "job_id", r.JobID, "step", r.Last, "err", reason, "attempts", after.Attempts)
		}
	}
}

// timedOut gives the next request of a job whose request was cut by its
// timeout more time. The first time in the job's hold it says so, with
// how long the cut request ran: the authority takes at least that long.
func (w *worker) timedOut(id string, cut *snapshot.TimeoutError) {
	w.detector.TimedOut(id)
	g, _ := w.detector.Gap(id)
	if g.TimedOut != 1 {
		return
	}
	pol := w.detector.Policy()
	w.log.Warn("the authority is slower than --snapshot-timeout for this job: its next requests get more time, in the slow lane, up to --snapshot-timeout-max",
		"job_id", id, "took_at_least", cut.Timeout, "snapshot_timeout", pol.SnapshotTimeout,
		"next_timeout", g.Timeout, "snapshot_timeout_max", pol.SnapshotTimeoutMax)
}

// commit plans and applies one batch, retrying transient failures until
// it lands, the partition is fenced, or ctx ends. An attempt already
// running when ctx ends is finished (its work is done, only the commit
// remains); a batch that never landed is abandoned, to be read again by
// whoever owns the partition next.
func (w *worker) commit(ctx context.Context, msgs []Record, res []gapfill.Resolution) error {
	bo := retryPolicy()
	staleRetries := 0
	guessedAgain := false
	for {
		w.beat.Now()
		// A slot is held from planning to settling, each attempt apart:
		// never while the worker waits out an outage or a swap, or
		// isolates a refused batch.
		slot, ok := w.slots.acquire(ctx, w.partition, w.beat.Now, slotBeatEvery(w.cfg.StallTimeout), batchTimeout(w.store)+shutdownGrace)
		if !ok {
			w.log.Warn("batch abandoned while it waited for a batch slot (the instance stops, or the partition's generation ended); it will be read again",
				"first_offset", firstOffset(msgs))
			return nil
		}
		w.beat.Now()
		actx, cancel := w.applyContext(ctx)
		now := time.Now()
		pl, err := w.plan(actx, msgs, res, now)
		var result store.Result
		if err == nil {
			if w.beforeApply != nil {
				w.beforeApply(w.partition)
			}
			failpoint.Hit(failpoint.Planned)
			stop := w.watchStall(len(msgs))
			started := time.Now().UnixNano()
			w.applying.Store(w.partition, started)
			result, err = w.store.Apply(actx, pl.batch)
			w.applying.CompareAndDelete(w.partition, started)
			stop()
		}
		cancel()
		if err == nil {
			failpoint.Hit(failpoint.AfterCommit)
			w.databaseAnswered()
			w.metrics.Batch(time.Since(now), len(msgs))
			w.settle(pl, result, now)
			w.slots.release(w.partition, slot)
			moved := pl.batch.NextOffset != w.stored
			w.storedAt(pl.batch.NextOffset)
			switch {
			case len(msgs) > 0:
				if pl.batch.Last != nil {
					w.last = pl.batch.Last
				}
				w.ack(ctx, msgs)
			case moved:
				// Moved without records: the source hears of the stored
				// position all the same (Kafka's group offset follows it).
				w.ack(ctx, nil)
			}
			return nil
		}
		w.slots.release(w.partition, slot)
		var stale *store.StaleError
		var swap *store.SwapWaitError
		switch {
		case errors.As(err, &swap) && ctx.Err() == nil:
			// Not an outage: the swap holds the partition's row. The
			// batch wrote nothing; it is tried again until the swap
			// commits and fences it.
			w.swapWait(swap)
			w.beat.Now()
			if err := w.restore(ctx); err != nil {
				return w.unrestored(ctx, err)
			}
			sleep(ctx, claimRetryPause)
			continue
		case errors.Is(err, store.ErrFenced):
			w.counters.fenced.Add(1)
			w.log.Warn("fenced: another owner claimed this partition, or a rebuild swapped its model in; the batch was rolled back and the partition stopped",
				"first_offset", firstOffset(msgs), "records", len(msgs))
			return errFenced
		case errors.As(err, &stale) && ctx.Err() != nil:
			w.log.Warn("batch abandoned at shutdown; it will be read again", "err", err, "first_offset", firstOffset(msgs))
			return nil
		case errors.As(err, &stale):
			w.log.Info("rows moved under the batch; reloading them", "jobs", len(stale.Jobs), "first", stale.Jobs[0])
			if err = w.reload(ctx, stale.Jobs); err == nil {
				if staleRetries++; staleRetries > 3 {
					// Another writer keeps moving these rows: do not spin.
					sleep(ctx, bo.NextBackOff())
				}
				continue
			}
		}
		if store.IsBadData(err) {
			if pl != nil && len(pl.guessed) > 0 && !guessedAgain && ctx.Err() == nil {
				// Jobs taken as new without a read were planned from
				// nothing: should one have a row after all (written by
				// anything but this rebuild), a check constraint may
				// refuse the state planned for it before the copy's key
				// could say so. Plan once more with their rows
				// read before calling any record bad. The jobs the
				// batch wrote are in the set already (plan); the others
				// join it here all the same.
				guessedAgain = true
				for _, id := range pl.guessed {
					w.written.add(id)
				}
				w.log.Info("a batch with jobs planned as new was refused as bad data; planning it again with their rows read before isolating its records",
					"jobs", len(pl.guessed), "first", pl.guessed[0], "err", err)
				continue
			}
			return w.isolate(ctx, msgs, res, err)
		}
		if ctx.Err() != nil {
			w.log.Warn("batch abandoned at shutdown; it will be read again", "err", err, "first_offset", firstOffset(msgs))
			return nil
		}
		d := bo.NextBackOff()
		if store.IsStatementTimeout(err) {
			w.log.Warn("a statement of the batch ran past the statement timeout and was cancelled; if batches legitimately take this long, raise --statement-timeout (or lower --batch-size)",
				"statement_timeout", w.store.StatementTimeout().String(), "records", len(msgs), "first_offset", firstOffset(msgs))
		}
		w.databaseFailed(fmt.Errorf("batch %s/%d@%d: %w", w.topic, w.partition, firstOffset(msgs), err), d)
		w.dbOutage.Wait(ctx, d)
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
//
// A batch in flight when ctx ends is still committed (see
// [worker.applyContext]), and its acknowledgement must still reach the
// source (an SQS delete, the position for the group's last flush): the
// source is given a context that outlives ctx, by at most shutdownGrace.
func (w *worker) ack(ctx context.Context, recs []Record) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := w.src.Ack(actx, recs); err != nil {
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
	rows, err := w.store.LoadJobs(ctx, []string{id})
	if err != nil {
		return err
	}
	w.cache.put(storedJob(id, rows, j.Held))
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
		g, _ := w.detector.Gap(id)
		w.detector.Close(id)
		switch by {
		case gapfill.FromLog:
			w.counters.closedWait.Add(1)
		case gapfill.FromReread:
			w.counters.closedReread.Add(1)
		case gapfill.FromAuthority:
			w.counters.closedSnapshot.Add(1)
		}
		if by == gapfill.FromAuthority && g.TimedOut > 0 {
			// The answer came within the job's grown timeout; with the
			// cut before it, that brackets how slow the authority is.
			w.log.Info("gap closed", "job_id", id, "by", by.String(), "timed_out", g.TimedOut, "answered_within", g.Timeout)
			continue
		}
		w.log.Info("gap closed", "job_id", id, "by", by.String())
	}
	for id, since := range pl.holding {
		switch _, held := w.detector.Gap(id); {
		case !held:
			w.detector.HoldUntil(id, since, w.logEnd())
			w.counters.gapsOpened.Add(1)
		case pl.progress[id]:
			// It moved forward but waits for a later version: the wait
			// starts afresh for that one.
			w.detector.ProgressUntil(id, now, w.logEnd())
		}
	}
	w.counters.add(t)
	for _, b := range pl.batch.Bad {
		part := b.Partition
		if part < 0 {
			part = w.partition
		}
		w.logQuarantined(part, b.Offset, b.Err)
	}
}

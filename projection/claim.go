package projection

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/store"
)

// restoreChunk is how many held jobs restore reads at a time.
const restoreChunk = 1000

// restore loads the held deltas this partition's previous owners stored,
// with their jobs' rows, into a fresh cache and detector. It reads what
// is held without the ops first, then the rows and the ops a chunk of
// jobs at a time, and the ops only while the cache keeps them (pinned
// bytes within half the budget): past that they stay in PostgreSQL, as
// for deltas held while running, and a partition with many held deltas
// is never all in memory at once.
func (w *worker) restore(ctx context.Context) error {
	w.cache.reset()
	w.detector.Reset()
	if w.attempts != nil {
		w.attempts.reset()
	}
	var held []store.Held
	if err := w.retryDatabase(ctx, func() error {
		var err error
		held, err = w.store.LoadHeldIndex(ctx, w.topic, w.partition)
		return err
	}); err != nil {
		return err
	}
	// held is ordered by job: a chunk ends between two jobs.
	for start := 0; start < len(held); {
		end, jobs := start, 0
		for end < len(held) {
			if end == start || held[end].JobID != held[end-1].JobID {
				if jobs == restoreChunk {
					break
				}
				jobs++
			}
			end++
		}
		if err := w.restoreChunk(ctx, held[start:end]); err != nil {
			return err
		}
		start = end
	}
	// Held deltas that a row already covers (another writer moved it while
	// nobody owned the partition) are released by the next attempt, due at
	// once; the rest wait for the lane first (see holdStored).
	return nil
}

// restoreChunk loads the rows of held's jobs, and the ops of held while
// the cache keeps them, into the cache and the detector.
func (w *worker) restoreChunk(ctx context.Context, held []store.Held) error {
	var ids []string
	keys := make([]store.HeldKey, len(held))
	for i, h := range held {
		if i == 0 || h.JobID != held[i-1].JobID {
			ids = append(ids, h.JobID)
		}
		keys[i] = store.HeldKey{JobID: h.JobID, Version: h.Version}
	}
	keepOps := w.cache.keepsOps()
	var rows map[string]store.Job
	var ops map[store.HeldKey]json.RawMessage
	if err := w.retryDatabase(ctx, func() error {
		var err error
		if rows, err = w.store.LoadJobs(ctx, ids); err != nil {
			return err
		}
		if keepOps {
			ops, err = w.store.LoadHeldOps(ctx, keys)
		}
		return err
	}); err != nil {
		return err
	}
	for i, h := range held {
		if raw, ok := ops[store.HeldKey{JobID: h.JobID, Version: h.Version}]; ok {
			held[i].Ops = raw
		}
	}
	return w.holdStored(held, rows)
}

// holdStored puts held rows read from the store, with their jobs' rows,
// into the cache and the detector. A held row read without its ops (left
// in PostgreSQL) is read back when a batch offers anything to the job.
//
// A cached job's held set may be shared with a gap attempt running on
// another goroutine (an SQS instance adopts held rows without a reset):
// it is never written to, each job gets a copy to add to.
func (w *worker) holdStored(held []store.Held, rows map[string]store.Job) error {
	// Each job is read from the cache once and put back once, with all
	// its rows added: a job holding thousands of deltas costs one copy of
	// its held set, not one per row.
	jobs := map[string]gapfill.Job{}
	var order []string
	since := map[string]time.Time{}
	for _, h := range held {
		j, ok := jobs[h.JobID]
		if !ok {
			if j, ok = w.cache.get(h.JobID); !ok {
				j = storedJob(h.JobID, rows, nil)
			}
			// The cache keeps what put is given, or a copy of it: after
			// this, the job's held set is this call's alone.
			j.Held = maps.Clone(j.Held)
			if j.Held == nil {
				j.Held = map[int64]gapfill.Held{}
			}
			order = append(order, h.JobID)
		}
		hd, err := heldOf(h)
		if err != nil {
			return err
		}
		j.Held[h.Version] = hd
		jobs[h.JobID] = j
		if s, ok := since[h.JobID]; !ok || h.Since.Before(s) {
			since[h.JobID] = h.Since
		}
	}
	for _, id := range order {
		w.cache.put(jobs[id])
	}
	// On a log, a restored job whose next version is missing waits, as
	// one held while running does, for the lane to read as far as its log
	// ends before its first attempt: a partition claimed behind its end
	// (a rebalance while catching up) would otherwise re-read its log for
	// every such job at once, for versions its lane is about to read. One
	// whose held deltas its row already reaches or covers (another writer
	// moved it) is due at once: its attempt closes or releases them.
	now := time.Now()
	for id, s := range since {
		j, _ := w.cache.peek(id)
		if w.lane != nil && w.lane.Caps().Log && lowestHeld(j) > j.Version+1 {
			w.detector.HoldRestored(id, s, now)
		} else {
			w.detector.Hold(id, s)
		}
	}
	return nil
}

// lowestHeld is the lowest version j holds; 0 when none.
func lowestHeld(j gapfill.Job) int64 {
	var low int64
	for v := range j.Held {
		if low == 0 || v < low {
			low = v
		}
	}
	return low
}

// heldOf is a held row as the detector keeps it; a row read without its
// ops keeps none (they are read back when needed).
func heldOf(h store.Held) (gapfill.Held, error) {
	ev := event.Event{JobID: h.JobID, Version: h.Version, Kind: event.Delta, EventID: h.EventID}
	if h.Ops != nil {
		ops, err := delta.ParseOps(h.Ops)
		if err != nil {
			return gapfill.Held{}, fmt.Errorf("projection: held delta %q v%d: %w", h.JobID, h.Version, err)
		}
		ev.Ops, ev.RawOps = ops, h.Ops
	}
	return gapfill.Held{Input: gapfill.Input{Event: ev, Partition: h.SourcePartition, Offset: h.Offset, At: h.Since, LogTime: h.LogTime}, Since: h.Since}, nil
}

// resync makes the worker's view of jobs what the store holds: their rows,
// and the held deltas stored for them under the worker's partition. Held
// deltas the view had that are stored no more (another writer applied or
// covered them) are dropped, ones it did not have (another instance held
// them) are taken on, and a job left holding nothing leaves the detector.
// It returns the jobs as read, every held delta with its ops, for a plan
// to use whatever the cache keeps of them.
//
// A worker that owns its partition knows every held delta of it; one
// without an owner's view (an SQS queue, read by several instances at
// once) calls this when the store finds its view out of date.
func (w *worker) resync(ctx context.Context, ids []string) (map[string]gapfill.Job, error) {
	rows, err := w.store.LoadJobs(ctx, ids)
	if err != nil {
		return nil, err
	}
	stored, err := w.store.LoadHeldOf(ctx, w.topic, w.partition, ids)
	if err != nil {
		return nil, err
	}
	out := make(map[string]gapfill.Job, len(ids))
	for _, id := range ids {
		out[id] = storedJob(id, rows, nil)
	}
	since := map[string]time.Time{}
	for _, h := range stored {
		held, err := heldOf(h)
		if err != nil {
			return nil, err
		}
		j := out[h.JobID]
		if j.Held == nil {
			j.Held = map[int64]gapfill.Held{}
			since[h.JobID] = h.Since
		}
		j.Held[h.Version] = held
		out[h.JobID] = j
		if h.Since.Before(since[h.JobID]) {
			since[h.JobID] = h.Since
		}
	}
	for id, j := range out {
		// The cache may leave the ops in PostgreSQL (see jobCache.put);
		// out keeps them for the caller.
		w.cache.put(j)
		if len(j.Held) == 0 {
			w.detector.Close(id)
			continue
		}
		w.detector.Hold(id, since[id])
	}
	return out, nil
}

// reload reads again the rows of jobs a batch found moved (a
// *store.StaleError). A worker that owns its partition keeps the held
// deltas it knows; one without an owner's view takes the stored held
// deltas as they are ([worker.resync]).
func (w *worker) reload(ctx context.Context, ids []string) error {
	if w.written != nil {
		// Rows the set said were never written moved under the batch:
		// the next plan reads them ([writtenSet]).
		for _, id := range ids {
			w.written.add(id)
		}
	}
	if w.unowned() {
		_, err := w.resync(ctx, ids)
		return err
	}
	for _, id := range ids {
		if err := w.forgetRow(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

func (w *worker) claim(ctx context.Context) (store.Claim, error) {
	start := int64(-1)
	if w.cfg.Start == "latest" {
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
		claim, err = w.store.ClaimFrom(ctx, w.topic, w.partition, w.cfg.Owner, start)
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
			w.beat.Now()
			sleep(ctx, claimRetryPause)
			claim, err = w.store.ClaimFrom(ctx, w.topic, w.partition, w.cfg.Owner, start)
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
	w.swapWaitAt.Store(time.Now().UnixNano())
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
		next, err = w.store.NextOffset(ctx, w.topic, w.partition)
		return err
	}); err != nil {
		return -1, err
	}
	if next >= 0 {
		return -1, nil
	}
	var end int64
	op := func() error {
		_, last, err := w.lane.Bounds(ctx)
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

package projection

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/internal/buildhook/failpoint"
	"github.com/projector/projector/snapshot"
	"github.com/projector/projector/store"
)

// plan is one batch transaction and what it will have done once committed.
type plan struct {
	batch *store.Batch
	tally tally
	// jobs are the rows and held sets after the batch, for the cache.
	jobs map[string]gapfill.Job
	// closed and held tell the detector what changed.
	closed   map[string]gapfill.Source
	progress map[string]bool
	holding  map[string]time.Time
	// folds are the fast-path jobs' folds: with the row's version before
	// the write they tell which snapshots and deletes would have applied
	// one by one.
	folds map[string]snapshot.Folded
	// messages name the SQS message of each record read in the batch, for
	// its held row: the batch's coordinates by offset alone are ambiguous
	// when two messages share an offset. Nil for Kafka.
	messages map[messageKey]store.Coordinate
	// guessed are the jobs planned as new without a read ([writtenSet]).
	guessed []string
}

// messageKey finds the SQS message a held delta was read from.
type messageKey struct {
	offset  int64
	job     string
	version int64
}

// newBatch is an empty batch of this worker's partition that moves its
// position to next. The batch of an unordered source (an SQS queue) is
// unfenced, and names the SQS messages of recs for its held and
// quarantine rows. A failpoints build can turn the fence off for Kafka
// too ([failpoint.Unfenced]), to prove the writes need no owner.
func (w *worker) newBatch(next int64, recs ...Record) *store.Batch {
	return &store.Batch{Topic: w.topic, Partition: w.partition, Epoch: w.epoch, NextOffset: next,
		Unfenced: w.unowned(), Coordinates: coordinatesOf(recs), Last: logMark(recs)}
}

// unowned reports whether the worker's records are not its alone: its
// source has no ordered positions and no owners to fence (an SQS queue),
// or a failpoints build turned the fence off.
func (w *worker) unowned() bool {
	return (w.lane != nil && !w.lane.Caps().Fenced) || failpoint.Unfenced()
}

// coordinatesOf names the SQS messages among recs by the offsets that
// stand for them; nil when there are none (Kafka).
func coordinatesOf(recs []Record) map[int64]store.Coordinate {
	var out map[int64]store.Coordinate
	for _, r := range recs {
		if r.Coord.MessageID == "" {
			continue
		}
		if out == nil {
			out = make(map[int64]store.Coordinate, len(recs))
		}
		out[r.Coord.Offset] = store.Coordinate{MessageID: r.Coord.MessageID, SequenceNumber: r.Coord.Sequence}
	}
	return out
}

// inputArrays holds the arrays [worker.plan] decodes a batch's records in
// and groups them by job in, as *[]gapfill.Input, empty. New ones per
// batch were a fifth and a seventh of what a replay allocated; kept by
// each partition's worker they would hold about 1 MiB a partition for the
// worker's life (224 bytes a record of the batch size), where the pool
// holds about as many as plans run at once, and the collector may drop them.
var inputArrays sync.Pool

// getInputs is an empty array from the pool with room for n records.
func getInputs(n int) *[]gapfill.Input {
	if a, ok := inputArrays.Get().(*[]gapfill.Input); ok && cap(*a) >= n {
		return a
	}
	a := make([]gapfill.Input, 0, n)
	return &a
}

// putInputs clears used, the part of a's array a plan filled, so the pool
// keeps nothing of the batch alive, and returns a to the pool.
func putInputs(a *[]gapfill.Input, used []gapfill.Input) {
	clear(used)
	*a = (*a)[:0]
	inputArrays.Put(a)
}

// plan turns fetched records and finished gap resolutions into the writes
// of one transaction. It reads rows it does not know, but changes nothing
// the worker keeps until [worker.settle] runs after the commit.
func (w *worker) plan(ctx context.Context, msgs []Record, res []gapfill.Resolution, now time.Time) (*plan, error) {
	next := w.position
	if len(msgs) > 0 {
		next = msgs[len(msgs)-1].Next()
	}
	p := &plan{
		batch:    w.newBatch(next, msgs...),
		tally:    tally{consumed: int64(len(msgs))},
		closed:   map[string]gapfill.Source{},
		progress: map[string]bool{},
		holding:  map[string]time.Time{},
	}

	// Decode and group by job, keeping each job's records in log order.
	// Each job's records are counted first and then placed in one array
	// cut to size: growing a slice per job was a tenth of a batch's CPU.
	// The decoded records are copied into their jobs' groups below, so
	// their array goes back to the pool ([inputArrays]) once grouped.
	decodedArray := getInputs(len(msgs))
	decoded := (*decodedArray)[:0]
	// Each job gets an index in order at its first record; a record then
	// costs one map lookup (four did: the count, its increment, the delta
	// flag and the grouping, each hashing the job id).
	// The maps keyed by job start at the size the last batch needed:
	// grown by doubling they were a tenth of planning's CPU where a batch
	// meets thousands of jobs, and sized for a job a record they would
	// allocate and clear hundreds of KB for a batch that meets a few.
	hint := min(w.jobsSeen, len(msgs))
	slot := make(map[string]int, hint)
	var (
		order     []string
		counts    []int
		deltaSeen []bool
	)
	jobOf := w.jobOf[:0]
	hasDelta := make(map[string]bool, hint)
	for _, m := range msgs {
		ev, err := event.Decode(m.Key, m.Value)
		if err != nil {
			p.quarantine(store.Bad{Partition: -1, Offset: m.Coord.Offset, Key: m.Key, Value: m.Value, Err: err.Error(), Coordinate: sqsCoordinate(m.Coord)})
			continue
		}
		i, seen := slot[ev.JobID]
		if !seen {
			i = len(order)
			slot[ev.JobID] = i
			order = append(order, ev.JobID)
			counts = append(counts, 0)
			deltaSeen = append(deltaSeen, false)
		}
		counts[i]++
		if ev.Kind == event.Delta && !deltaSeen[i] {
			deltaSeen[i] = true
			hasDelta[ev.JobID] = true
		}
		if m.Coord.MessageID != "" {
			if p.messages == nil {
				p.messages = map[messageKey]store.Coordinate{}
			}
			p.messages[messageKey{m.Coord.Offset, ev.JobID, ev.Version}] = sqsCoordinate(m.Coord)
		}
		decoded = append(decoded, gapfill.Input{Event: ev, Partition: w.partition, Offset: m.Coord.Offset, Source: gapfill.FromLog, At: now, LogTime: m.Time})
		jobOf = append(jobOf, i)
	}
	groups := make([][]gapfill.Input, len(order))
	// Nothing the plan returns points into this array (the version rules
	// copy what they keep): it goes back to the pool once the plan is made.
	groupedArray := getInputs(len(decoded))
	all := (*groupedArray)[:len(decoded)]
	defer putInputs(groupedArray, all)
	for i, n := range counts {
		groups[i], all = all[:0:n], all[n:]
	}
	for k, in := range decoded {
		groups[jobOf[k]] = append(groups[jobOf[k]], in)
	}
	w.jobsSeen = len(order)
	inputs := make(map[string][]gapfill.Input, len(order))
	for i, id := range order {
		inputs[id] = groups[i]
	}
	w.jobOf = jobOf[:0]
	putInputs(decodedArray, decoded)
	// Gap resolutions go first: they are older news than this batch.
	rows := map[string]*gapfill.Row{}
	for _, r := range res {
		if r.Row != nil {
			rows[r.JobID] = r.Row
		}
		if _, seen := inputs[r.JobID]; !seen {
			order = append(order, r.JobID)
		}
		inputs[r.JobID] = append(append([]gapfill.Input(nil), r.Inputs...), inputs[r.JobID]...)
		hasDelta[r.JobID] = true
	}

	// Most jobs of a batch write once: room for them at once, not grown
	// by doubling (a write is about 150 bytes).
	p.batch.Updates = make([]store.Write, 0, len(hasDelta))
	p.batch.Snapshots = make([]store.Write, 0, len(order)-len(hasDelta))
	p.jobs = make(map[string]gapfill.Job, len(hasDelta))
	p.folds = make(map[string]snapshot.Folded, len(order)-len(hasDelta))

	// Jobs that only received snapshots and hold nothing take the fast
	// path: one conditional upsert, no row read. The rest need their row.
	var need, absent []string
	for _, id := range order {
		j, cached := w.cache.get(id)
		if hasDelta[id] || (cached && len(j.Held) > 0) {
			switch {
			case !cached && w.written != nil && !w.written.mayHold(id):
				// A rebuild from an empty shadow never wrote it: no row,
				// no tombstone (see [writtenSet]).
				absent = append(absent, id)
			case !cached || (w.unowned() && len(j.Held) == 0):
				// Without an owner (an unfenced source), another engine
				// may have moved the row since it was cached: read it,
				// unless the job holds deltas. The conditional writes are
				// what is correct either way; owning the partition only
				// saves this read.
				need = append(need, id)
			}
		}
	}
	p.guessed = absent
	// Rows read for this plan stay here, not in the cache, which may drop
	// entries as it fills; the cache learns them once the batch commits.
	// They go into this map as they are read (a map of the rows first, then
	// this one, was a tenth of what planning allocated).
	known := make(map[string]gapfill.Job, len(need)+len(absent))
	err := w.store.EachJob(ctx, need, func(j store.Job) { known[j.ID] = rowOf(j).TrustedJob(j.ID, nil) })
	if err != nil {
		return nil, err
	}
	for _, id := range need {
		if _, found := known[id]; !found {
			known[id] = gapfill.Job{ID: id} // neither row nor tombstone: version 0
		}
	}
	var fresh map[string]bool
	if len(absent) > 0 {
		fresh = make(map[string]bool, len(absent))
	}
	for _, id := range absent {
		known[id] = gapfill.Job{ID: id}
		fresh[id] = true
	}
	if err := w.unspill(ctx, order, known); err != nil {
		return nil, err
	}

	for _, id := range order {
		j, cached := known[id]
		if !cached {
			j, cached = w.cache.get(id)
		}
		j.ID = id
		if !hasDelta[id] && (!cached || len(j.Held) == 0) {
			p.wholeStateOnly(w, id, inputs[id], j, cached)
			continue
		}
		if row := rows[id]; row != nil && row.Version > j.Version {
			moved, err := row.Job(id, j.Held)
			if err != nil {
				return nil, fmt.Errorf("projection: %w", err)
			}
			j = moved
		}

		p.advance(w, j, inputs[id], now, fresh[id])
	}
	p.attempts(res)
	if w.written != nil {
		// Before the batch can commit: a plan that follows, in any
		// partition, reads these jobs.
		for _, ws := range [][]store.Write{p.batch.Snapshots, p.batch.Updates, p.batch.Deletes} {
			for i := range ws {
				w.written.add(ws[i].JobID)
			}
		}
	}
	return p, nil
}

// attempts records, on the held rows, each gap attempt that leaves its job
// held, for explain to show after a restart too.
func (p *plan) attempts(res []gapfill.Resolution) {
	for _, r := range res {
		if j, ok := p.jobs[r.JobID]; !ok || len(j.Held) == 0 {
			continue
		}
		reason := errString(r.Err)
		if reason == "" {
			reason = "still held after " + string(r.Last)
		}
		p.batch.Attempts = append(p.batch.Attempts, store.Attempt{JobID: r.JobID, Step: string(r.Last), Err: reason})
	}
}

func (p *plan) quarantine(b store.Bad) {
	p.batch.Bad = append(p.batch.Bad, b)
	p.tally.quarantined++
}

// wholeStateOnly folds a job's snapshots and deletes against what the
// cache knows of its row and writes the winner with the version condition,
// unless the cache already knows the row is at or past it.
func (p *plan) wholeStateOnly(w *worker, id string, ins []gapfill.Input, j gapfill.Job, cached bool) {
	snaps := make([]event.Event, len(ins))
	for i, in := range ins {
		snaps[i] = in.Event
	}
	var head snapshot.Head
	if cached {
		head = snapshot.Head{Version: j.Version, State: j.Raw, EventID: j.EventID, Deleted: j.Deleted}
	}
	f := snapshot.Fold(head, snaps)
	for _, i := range f.Conflicts {
		p.conflict(w, id, gapfill.Conflict{Version: snaps[i].Version, KeptEventID: keptEventID(head, snaps, i),
			DroppedEventID: snaps[i].EventID, DroppedPartition: ins[i].Partition, DroppedOffset: ins[i].Offset})
	}
	if f.Winner < 0 {
		_, stale := f.Count(head.Version)
		p.tally.stale += int64(stale)
		return
	}
	p.folds[id] = f
	win := ins[f.Winner]
	write := store.Write{
		JobID: id, Version: win.Event.Version, State: win.Event.State, Offset: win.Offset, EventID: win.Event.EventID,
	}
	if win.Event.Kind == event.Delete {
		write.Deleted = true
		p.batch.Deletes = append(p.batch.Deletes, write)
		return
	}
	p.batch.Snapshots = append(p.batch.Snapshots, write)
}

// keptEventID names the event that won over conflicting snapshot i.
func keptEventID(head snapshot.Head, snaps []event.Event, i int) string {
	for k := 0; k < i; k++ {
		if snaps[k].Version == snaps[i].Version {
			return snaps[k].EventID
		}
	}
	return head.EventID
}

// advance runs a job's inputs through the gap detector's version rules.
// A job planned as new without a read ([writtenSet]) is written as new
// ([store.Write.New]): copied in, not inserted with a conflict check.
func (p *plan) advance(w *worker, j gapfill.Job, ins []gapfill.Input, now time.Time, guessed bool) {
	next, out := gapfill.Advance(j, ins)
	p.tally.applied += int64(out.Applied)
	p.tally.deleted += int64(out.Deleted)
	p.tally.covered += int64(out.Covered)
	p.tally.stale += int64(out.Stale)
	p.tally.duplicates += int64(out.Duplicates)
	p.tally.held += int64(out.Held)
	for _, c := range out.Conflicts {
		p.conflict(w, j.ID, c)
	}
	for _, r := range out.Rejected {
		p.quarantine(store.Bad{Partition: r.Partition, Offset: r.Offset, Key: []byte(j.ID),
			Value: deltaValue(r.Event), Err: fmt.Sprintf("version %d: %v", r.Event.Version, r.Err)})
	}
	if out.Changed {
		p.batch.Updates = append(p.batch.Updates, store.Write{
			JobID: j.ID, Version: next.Version, State: next.Raw, Deleted: next.Deleted,
			Expect: j.Version, ExpectDeleted: j.Deleted, ExpectEventID: j.EventID,
			Offset: out.LastOffset, EventID: out.LastEventID, LastOps: next.LastOps,
			New: guessed && j.Version == 0 && !j.Deleted,
		})
	}
	for _, h := range out.NewlyHeld {
		// The holder reloads it on claim; the record keeps its own
		// coordinates, which a later rejection quarantines it under.
		src := h.Partition
		if src < 0 {
			src = w.partition
		}
		p.batch.Hold = append(p.batch.Hold, store.Held{
			JobID: j.ID, Version: h.Event.Version, Partition: w.partition, SourcePartition: src, Offset: h.Offset,
			Ops: h.Event.RawOps, EventID: h.Event.EventID, Since: h.Since, LogTime: h.LogTime,
			Coordinate: p.messages[messageKey{h.Offset, j.ID, h.Event.Version}],
		})
	}
	for _, v := range out.Released {
		p.batch.Release = append(p.batch.Release, store.HeldKey{JobID: j.ID, Version: v})
	}
	switch {
	case out.Closed:
		p.closed[j.ID] = out.ClosedBy
		p.batch.Gaps = append(p.batch.Gaps, gapClosed(j, next, out, now))
	case len(next.Held) > 0:
		since := now
		for _, h := range next.Held {
			if h.Since.Before(since) {
				since = h.Since
			}
		}
		p.holding[j.ID] = since
		if out.Changed && len(j.Held) > 0 {
			p.progress[j.ID] = true
		}
	}
	if next.Raw != nil || next.Deleted {
		// The encoded state is what is written and cached: the decoded
		// one would stay alive until the batch commits, a map per job of
		// the batch.
		next.State = nil
	}
	p.jobs[j.ID] = next
}

// gapClosed is the gap log entry of a gap out closed: opened when the
// oldest of its held deltas was first held (now, if it was held and
// released within this batch).
func gapClosed(j, next gapfill.Job, out gapfill.Outcome, now time.Time) store.GapClosed {
	opened := now
	for _, h := range j.Held {
		if h.Since.Before(opened) {
			opened = h.Since
		}
	}
	for _, h := range out.NewlyHeld {
		if h.Since.Before(opened) {
			opened = h.Since
		}
	}
	held := slices.Clone(out.Released)
	slices.Sort(held)
	return store.GapClosed{JobID: j.ID, Opened: opened, Step: out.ClosedBy.String(), From: j.Version, To: next.Version, Held: held}
}

func (p *plan) conflict(w *worker, id string, c gapfill.Conflict) {
	p.tally.conflicts++
	w.log.Warn("conflict: same job and version with different content; the first applied wins",
		"job_id", id, "version", c.Version, "kept_event_id", c.KeptEventID,
		"dropped_event_id", c.DroppedEventID, "dropped_partition", c.DroppedPartition, "dropped_offset", c.DroppedOffset)
}

// deltaValue re-encodes a delta for the quarantine when its original bytes
// are not at hand (a held delta reloaded from the store).
func deltaValue(ev event.Event) []byte {
	b, _ := json.Marshal(map[string]any{
		"job_id": ev.JobID, "version": ev.Version, "kind": ev.Kind, "ops": ev.RawOps, "event_id": ev.EventID,
	})
	return b
}

// unspill puts back the ops of held deltas the cache left in PostgreSQL,
// for every job of the plan that has some, into known: a batch offers
// inputs to a job only with its held deltas whole. A held delta whose row
// is gone was released by another writer (an instance on the same queue
// applied it or covered it): the job is read again, row and held deltas
// ([worker.resync]), rather than the plan failing as if the database had.
func (w *worker) unspill(ctx context.Context, order []string, known map[string]gapfill.Job) error {
	var keys []store.HeldKey
	jobs := map[string]gapfill.Job{}
	for _, id := range order {
		j, ok := known[id]
		if !ok {
			if j, ok = w.cache.get(id); !ok {
				continue
			}
		}
		if !spilled(j) {
			continue
		}
		jobs[id] = j
		for v, h := range j.Held {
			if h.Event.RawOps == nil {
				keys = append(keys, store.HeldKey{JobID: id, Version: v})
			}
		}
	}
	if len(keys) == 0 {
		return nil
	}
	ops, err := w.store.LoadHeldOps(ctx, keys)
	if err != nil {
		return err
	}
	var gone []string
	for id, j := range jobs {
		held := make(map[int64]gapfill.Held, len(j.Held))
		whole := true
		for v, h := range j.Held {
			if h.Event.RawOps == nil {
				raw, ok := ops[store.HeldKey{JobID: id, Version: v}]
				if !ok {
					whole = false
					break
				}
				parsed, err := delta.ParseOps(raw)
				if err != nil {
					return fmt.Errorf("projection: held delta %q v%d: %w", id, v, err)
				}
				h.Event.Ops, h.Event.RawOps = parsed, raw
			}
			held[v] = h
		}
		if !whole {
			gone = append(gone, id)
			continue
		}
		j.Held = held
		known[id] = j
	}
	if len(gone) == 0 {
		return nil
	}
	slices.Sort(gone)
	w.log.Info("held deltas are stored no more: another writer released them; reading their jobs again",
		"jobs", len(gone), "first", gone[0])
	fresh, err := w.resync(ctx, gone)
	if err != nil {
		return err
	}
	maps.Copy(known, fresh)
	return nil
}

// wholeHeld returns h with its ops read back from PostgreSQL if the cache
// left them there, so a quarantined held delta keeps its content; if they
// cannot be read, h as it is.
func (w *worker) wholeHeld(ctx context.Context, id string, h gapfill.Held) gapfill.Held {
	if h.Event.RawOps != nil {
		return h
	}
	key := store.HeldKey{JobID: id, Version: h.Event.Version}
	ops, err := w.store.LoadHeldOps(ctx, []store.HeldKey{key})
	if err != nil || ops[key] == nil {
		w.log.Warn("the ops of a held delta could not be read back; quarantined without them", "job_id", id, "version", h.Event.Version, "err", err)
		return h
	}
	h.Event.RawOps = ops[key]
	return h
}

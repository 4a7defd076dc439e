package projection

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/projector/projector/event"
	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/store"
)

// isolate handles a batch PostgreSQL refused for its data although every
// record passed decoding: it commits the records one at a time, so the
// one whose effect carries the data is found and quarantined alone and the
// stream moves on. Gap resolutions are tried one job at a time after the
// records; one that is refused on its own is dropped, and its job stays
// held to be tried again.
func (w *worker) isolate(ctx context.Context, msgs []Record, res []gapfill.Resolution, cause error) error {
	if err := w.restore(ctx); err != nil {
		return w.unrestored(ctx, err)
	}
	if len(msgs) == 1 && len(res) == 0 {
		return w.isolateRecord(ctx, msgs[0], cause)
	}
	if len(msgs) == 0 && len(res) == 1 {
		return w.isolateResolution(ctx, res[0], cause)
	}
	w.log.Warn("batch refused by PostgreSQL for its data; committing its records one at a time", "records", len(msgs), "resolutions", len(res), "err", cause)
	for i := range msgs {
		if err := w.commit(ctx, msgs[i:i+1], nil); err != nil {
			return err
		}
	}
	for i := range res {
		if err := w.commit(ctx, nil, res[i:i+1]); err != nil {
			return err
		}
	}
	return nil
}

// isolateRecord handles one record whose batch PostgreSQL refused. When
// the record's job holds deltas that the record let through, the refusal
// may be theirs, not the record's: the record is applied alone, its job's
// held deltas set aside, and then each held delta in turn, so the one
// whose effect PostgreSQL refuses is quarantined under its own
// coordinates and the others apply.
func (w *worker) isolateRecord(ctx context.Context, m Record, cause error) error {
	id, held := w.heldOf(m)
	if len(held) == 0 {
		return w.quarantineRecord(ctx, m, cause)
	}
	w.log.Warn("batch refused by PostgreSQL; applying the record apart from the held deltas it let through",
		"offset", m.Coord.Offset, "job_id", id, "held_deltas", len(held), "err", cause)
	err := w.applyApart(ctx, []Record{m}, nil, id, nil)
	switch {
	case err == nil:
	case store.IsBadData(err):
		return w.quarantineRecord(ctx, m, err)
	default:
		return w.isolateFailed(ctx, err)
	}
	return w.applyHeldOneByOne(ctx, id, held)
}

// isolateResolution is [worker.isolateRecord] for a gap resolution: its
// row, then each event it found, is applied with the job's held deltas set
// aside, then each held delta in turn. An event refused on its own is
// quarantined under the coordinates it was read at; one from the authority
// has none, so it is dropped, loudly, and the job stays held.
func (w *worker) isolateResolution(ctx context.Context, r gapfill.Resolution, cause error) error {
	j, _ := w.cache.get(r.JobID)
	held := j.Held
	w.log.Warn("gap resolution refused by PostgreSQL; applying what it found one event at a time, apart from the job's held deltas",
		"job_id", r.JobID, "events", len(r.Inputs), "held_deltas", len(held), "err", cause)
	parts := []gapfill.Resolution{{JobID: r.JobID, Row: r.Row}}
	for _, in := range r.Inputs {
		parts = append(parts, gapfill.Resolution{JobID: r.JobID, Inputs: []gapfill.Input{in}})
	}
	for _, part := range parts {
		err := w.applyApart(ctx, nil, []gapfill.Resolution{part}, r.JobID, nil)
		switch {
		case err == nil:
		case store.IsBadData(err) && len(part.Inputs) == 1 && part.Inputs[0].Offset >= 0:
			if err := w.quarantineInput(ctx, r.JobID, part.Inputs[0], err); err != nil {
				return w.isolateFailed(ctx, err)
			}
		case store.IsBadData(err):
			w.log.Warn("an event from the authority was refused by PostgreSQL; dropped, the job stays held",
				"job_id", r.JobID, "err", store.Refusal(err))
		default:
			return w.isolateFailed(ctx, err)
		}
	}
	return w.applyHeldOneByOne(ctx, r.JobID, held)
}

// applyHeldOneByOne applies a job's held deltas one per transaction, in
// version order, after what let them through was committed. A delta
// PostgreSQL refuses is quarantined; one still behind a gap stays held.
func (w *worker) applyHeldOneByOne(ctx context.Context, id string, held map[int64]gapfill.Held) error {
	versions := slices.Sorted(maps.Keys(held))
	for _, v := range versions {
		// An earlier step may have released it (applied, covered, or
		// quarantined as an event a re-read found).
		if err := w.restore(ctx); err != nil {
			return w.isolateFailed(ctx, err)
		}
		j, _ := w.cache.get(id)
		h, still := j.Held[v]
		if !still {
			continue
		}
		err := w.applyApart(ctx, nil, []gapfill.Resolution{{JobID: id}}, id, map[int64]gapfill.Held{v: h})
		switch {
		case err == nil:
		case store.IsBadData(err):
			if err := w.quarantineHeld(ctx, id, h, err); err != nil {
				return w.isolateFailed(ctx, err)
			}
		default:
			return w.isolateFailed(ctx, err)
		}
	}
	return w.restoreAfterIsolate(ctx)
}

// heldOf returns the job of record m and the deltas it holds, if any.
func (w *worker) heldOf(m Record) (string, map[int64]gapfill.Held) {
	ev, err := event.Decode(m.Key, m.Value)
	if err != nil {
		return "", nil
	}
	j, ok := w.cache.get(ev.JobID)
	if !ok {
		return ev.JobID, nil
	}
	return ev.JobID, j.Held
}

// applyApart plans and commits msgs and res in one transaction with job
// id's held deltas narrowed to keep (the others stay stored, untouched).
// The cache is reloaded from the store first, so each step starts from
// what the previous one committed.
func (w *worker) applyApart(ctx context.Context, msgs []Record, res []gapfill.Resolution, id string, keep map[int64]gapfill.Held) error {
	if err := w.restore(ctx); err != nil {
		return err
	}
	j, ok := w.cache.get(id)
	if !ok {
		rows, err := w.store.LoadJobs(ctx, []string{id})
		if err != nil {
			return err
		}
		j = storedJob(id, rows, nil)
	}
	var aside []store.HeldKey
	for v := range j.Held {
		if _, kept := keep[v]; !kept {
			aside = append(aside, store.HeldKey{JobID: id, Version: v})
		}
	}
	j.Held = keep
	w.cache.put(j)
	actx, cancel := w.applyContext(ctx)
	defer cancel()
	now := time.Now()
	pl, err := w.plan(actx, msgs, res, now)
	if err != nil {
		return err
	}
	pl.batch.Aside = aside
	result, err := w.store.Apply(actx, pl.batch)
	if err != nil {
		return err
	}
	w.settle(pl, result, now)
	if len(msgs) > 0 {
		w.storedAt(pl.batch.NextOffset)
		if pl.batch.Last != nil {
			w.last = pl.batch.Last
		}
		w.ack(ctx, msgs)
	}
	return nil
}

// quarantineRecord stores record m in the quarantine with PostgreSQL's
// refusal and moves the position past it.
func (w *worker) quarantineRecord(ctx context.Context, m Record, cause error) error {
	w.log.Warn("record refused by PostgreSQL; quarantined", "offset", m.Coord.Offset, "err", store.Refusal(cause))
	bad := w.newBatch(m.Next(), m)
	bad.Bad = []store.Bad{{Partition: -1, Offset: m.Coord.Offset, Key: m.Key, Value: m.Value, Err: store.Refusal(cause), Coordinate: sqsCoordinate(m.Coord)}}
	actx, cancel := w.applyContext(ctx)
	defer cancel()
	if _, err := w.store.Apply(actx, bad); err != nil {
		if errors.Is(err, store.ErrFenced) {
			return errFenced
		}
		return fmt.Errorf("projection: quarantine offset %d: %w", m.Coord.Offset, err)
	}
	w.counters.add(tally{consumed: 1, quarantined: 1})
	w.storedAt(m.Next())
	w.ack(ctx, []Record{m})
	return w.restoreAfterIsolate(ctx)
}

// quarantineHeld moves a held delta whose effect PostgreSQL refused from
// the held rows to the quarantine, under the partition and offset it was
// read at, in one transaction.
func (w *worker) quarantineHeld(ctx context.Context, id string, h gapfill.Held, cause error) error {
	return w.quarantineInput(ctx, id, w.wholeHeld(ctx, id, h).Input, cause)
}

// quarantineInput stores an event PostgreSQL refused, found by a re-read or
// held, under the partition and offset it was read at, and releases its
// held row if it has one, in one transaction.
func (w *worker) quarantineInput(ctx context.Context, id string, in gapfill.Input, cause error) error {
	ev := in.Event
	w.log.Warn("event refused by PostgreSQL; quarantined", "job_id", id, "version", ev.Version, "kind", ev.Kind,
		"event_partition", in.Partition, "event_offset", in.Offset, "err", store.Refusal(cause))
	b := w.newBatch(w.position)
	b.Bad = []store.Bad{{Partition: in.Partition, Offset: in.Offset, Key: []byte(id), Value: eventValue(ev),
		Err: fmt.Sprintf("version %d: %s", ev.Version, store.Refusal(cause))}}
	if ev.Kind == event.Delta {
		b.Release = []store.HeldKey{{JobID: id, Version: ev.Version}}
	}
	actx, cancel := w.applyContext(ctx)
	defer cancel()
	if _, err := w.store.Apply(actx, b); err != nil {
		return fmt.Errorf("projection: quarantine %q v%d: %w", id, ev.Version, err)
	}
	w.counters.add(tally{quarantined: 1})
	return nil
}

// eventValue re-encodes an event for the quarantine when its original
// bytes are not at hand (held, or found by a re-read).
func eventValue(ev event.Event) []byte {
	if ev.Kind == event.Delta {
		return deltaValue(ev)
	}
	b, _ := json.Marshal(map[string]any{
		"job_id": ev.JobID, "version": ev.Version, "kind": ev.Kind, "state": ev.State, "event_id": ev.EventID,
	})
	return b
}

// restoreAfterIsolate rebuilds the cache and the detector from the store
// once isolation is done: its steps narrowed a job's held set in memory.
func (w *worker) restoreAfterIsolate(ctx context.Context) error {
	if err := w.restore(ctx); err != nil {
		return w.unrestored(ctx, err)
	}
	return nil
}

// isolateFailed ends isolation on an error other than a refusal: a fence
// stops the worker; anything else leaves the batch uncommitted, to be
// read again by whoever owns the partition next.
func (w *worker) isolateFailed(ctx context.Context, err error) error {
	if errors.Is(err, store.ErrFenced) {
		w.counters.fenced.Add(1)
		return errFenced
	}
	if ctx.Err() != nil {
		w.log.Warn("isolation abandoned at shutdown; the batch will be read again", "err", err)
		return nil
	}
	return fmt.Errorf("projection: %s/%d: isolating a refused batch: %w", w.topic, w.partition, err)
}

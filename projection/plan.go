package projection

import (
	"github.com/segmentio/kafka-go"

	"github.com/projector/projector/event"
	"github.com/projector/projector/snapshot"
	"github.com/projector/projector/store"
)

// errDeltasUnsupported is the quarantine reason for deltas until the gap
// detector routes them.
const errDeltasUnsupported = "deltas not supported yet"

// decoded is one record that passed the wire-format checks.
type decoded struct {
	event.Event
	offset int64
}

// plan turns one fetched batch into the writes of one transaction and the
// tally it will have produced once committed. It reads and never changes
// the worker's cache; [worker.settle] updates it after the commit.
func (w *worker) plan(msgs []kafka.Message) (*store.Batch, tally) {
	b := &store.Batch{
		Topic:      w.topic,
		Partition:  w.partition,
		Epoch:      w.epoch,
		NextOffset: msgs[len(msgs)-1].Offset + 1,
	}
	t := tally{consumed: int64(len(msgs))}

	byJob := make(map[string][]decoded)
	var order []string
	for _, m := range msgs {
		ev, err := event.Decode(m.Key, m.Value)
		if err == nil && ev.Kind == event.Delta {
			err = &event.FieldError{Field: "kind", Reason: errDeltasUnsupported}
		}
		if err != nil {
			b.Bad = append(b.Bad, store.Bad{Offset: m.Offset, Key: m.Key, Value: m.Value, Err: err.Error()})
			t.quarantined++
			continue
		}
		if _, seen := byJob[ev.JobID]; !seen {
			order = append(order, ev.JobID)
		}
		byJob[ev.JobID] = append(byJob[ev.JobID], decoded{Event: ev, offset: m.Offset})
	}

	for _, id := range order {
		evs := byJob[id]
		snaps := make([]event.Event, len(evs))
		for i, d := range evs {
			snaps[i] = d.Event
		}
		f := snapshot.Fold(snaps)
		t.stale += int64(len(f.Stale))
		t.conflicts += int64(len(f.Conflicts))
		for _, i := range f.Conflicts {
			w.log.Warn("conflicting snapshots: same version, different state; the first wins",
				"job_id", id, "version", snaps[i].Version,
				"kept_event_id", snaps[f.Winner].EventID, "dropped_event_id", snaps[i].EventID)
		}
		win := evs[f.Winner]
		if c, ok := w.cache.version(id); ok && c >= win.Version {
			t.stale++ // the row is known to be at or past it: no write needed
			continue
		}
		b.Snapshots = append(b.Snapshots, store.Write{
			JobID: id, Version: win.Version, State: win.State, Offset: win.offset, EventID: win.EventID,
		})
	}
	return b, t
}

// settle records a committed batch's outcome in the cache and the tally.
func (w *worker) settle(b *store.Batch, res store.Result, t *tally) {
	for _, s := range b.Snapshots {
		if _, ok := res.SnapshotsApplied[s.JobID]; ok {
			t.applied++
			w.cache.put(s.JobID, s.Version)
		} else {
			t.stale++
			w.cache.forget(s.JobID)
		}
	}
}

// versionCache remembers the exact version of rows this worker wrote. It is
// an optimisation only: a wrong entry can make the store skip nothing,
// because every write still carries its version condition.
type versionCache struct {
	max  int
	vers map[string]int64
}

func newVersionCache(max int) *versionCache {
	return &versionCache{max: max, vers: make(map[string]int64)}
}

func (c *versionCache) version(id string) (int64, bool) {
	v, ok := c.vers[id]
	return v, ok
}

func (c *versionCache) put(id string, v int64) {
	if c.max == 0 {
		return
	}
	if len(c.vers) >= c.max {
		clear(c.vers)
	}
	c.vers[id] = v
}

func (c *versionCache) forget(id string) { delete(c.vers, id) }

func (c *versionCache) reset() { clear(c.vers) }

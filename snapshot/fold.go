package snapshot

import (
	"encoding/json"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
)

// Head is what a job's row is known to hold before a run of snapshots:
// version 0 with a nil state when nothing is known.
type Head struct {
	Version int64
	State   json.RawMessage
	EventID string
	// Deleted: the job was deleted at Version (a tombstone, no state).
	Deleted bool
}

// Folded is the outcome of [Fold] over one job's whole-state events
// (snapshots and deletes), by index.
type Folded struct {
	// Winner is the event to write: the last one, in log order, above
	// everything before it; -1 when none is above the head.
	Winner int
	// Conflicts are events at the version in hand (the head's, or an
	// earlier event's of the run) with other content: the first wins and
	// these are reported, never applied. A delete at the version of a
	// known state is one; a snapshot at a delete's version is stale, the
	// delete having come first.
	Conflicts []int
	// versions are the other events' versions in log order, for Count,
	// and deletes tells which of them are deletes.
	versions []int64
	deletes  []bool
}

// Fold picks, in log order, the snapshot or delete of a job to write given
// the head its row is known to be at. Folding first is what lets one
// statement write a batch: a key may appear only once per upsert.
func Fold(head Head, evs []event.Event) Folded {
	f := Folded{Winner: -1}
	hi, hiState, hiDeleted := head.Version, head.State, head.Deleted
	for i, s := range evs {
		del := s.Kind == event.Delete
		switch {
		case s.Version > hi:
			hi, hiState, hiDeleted, f.Winner = s.Version, s.State, del, i
		case s.Version < hi || hiDeleted:
		case del && hiState != nil, !del && hiState != nil && !delta.SameState(hiState, s.State):
			f.Conflicts = append(f.Conflicts, i)
			continue
		}
		f.versions = append(f.versions, s.Version)
		f.deletes = append(f.deletes, del)
	}
	return f
}

// Count tells, once the row's version before the write is known, how many
// of the folded events would have applied one by one in log order
// (snapshots and deletes alike) and how many were stale.
func (f Folded) Count(before int64) (applied, stale int) {
	hi := before
	for _, v := range f.versions {
		if v > hi {
			applied++
			hi = v
		} else {
			stale++
		}
	}
	return applied, stale
}

// Deletes tells how many of the events [Folded.Count] counts as applied
// are deletes.
func (f Folded) Deletes(before int64) int {
	hi, n := before, 0
	for i, v := range f.versions {
		if v > hi {
			hi = v
			if f.deletes[i] {
				n++
			}
		}
	}
	return n
}

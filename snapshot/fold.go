package snapshot

import (
	"bytes"
	"encoding/json"
	"math/big"

	"github.com/projector/projector/event"
)

// Head is what a job's row is known to hold before a run of snapshots:
// version 0 with a nil state when nothing is known.
type Head struct {
	Version int64
	State   json.RawMessage
	EventID string
}

// Folded is the outcome of [Fold] over one job's snapshots, by index.
type Folded struct {
	// Winner is the snapshot to write: the last one, in log order, above
	// everything before it; -1 when none is above the head.
	Winner int
	// Conflicts are snapshots at the version in hand (the head's, or an
	// earlier snapshot's of the run) with other content: the first wins
	// and these are reported, never applied.
	Conflicts []int
	// versions are the other snapshots' versions in log order, for Count.
	versions []int64
}

// Fold picks, in log order, the snapshot of a job to write given the head
// its row is known to be at. Folding first is what lets one statement write
// a batch: a key may appear only once per upsert.
func Fold(head Head, snaps []event.Event) Folded {
	f := Folded{Winner: -1}
	hi, hiState := head.Version, head.State
	for i, s := range snaps {
		switch {
		case s.Version > hi:
			hi, hiState, f.Winner = s.Version, s.State, i
		case s.Version == hi && hiState != nil && !SameState(hiState, s.State):
			f.Conflicts = append(f.Conflicts, i)
			continue
		}
		f.versions = append(f.versions, s.Version)
	}
	return f
}

// Count tells, once the row's version before the write is known, how many
// of the folded snapshots would have applied one by one in log order and
// how many were stale.
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

// SameState reports whether two JSON states are the same JSON value:
// member order and spacing aside, numbers compared by value (1 and 1.0 are
// the same number), as PostgreSQL's jsonb compares them.
func SameState(a, b json.RawMessage) bool {
	if bytes.Equal(a, b) {
		return true
	}
	va, errA := decode(a)
	vb, errB := decode(b)
	if errA != nil || errB != nil {
		return false
	}
	return equal(va, vb)
}

func decode(raw json.RawMessage) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

func equal(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !equal(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equal(x[i], y[i]) {
				return false
			}
		}
		return true
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		if x == y {
			return true
		}
		rx, okx := new(big.Rat).SetString(string(x))
		ry, oky := new(big.Rat).SetString(string(y))
		return okx && oky && rx.Cmp(ry) == 0
	default:
		return a == b
	}
}

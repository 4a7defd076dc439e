package snapshot

import (
	"bytes"
	"encoding/json"
	"reflect"

	"github.com/projector/projector/event"
)

// Folded is the outcome of [Fold] over one job's snapshots, by index.
type Folded struct {
	// Winner is the snapshot to write: the highest version, first of equals.
	Winner int
	// Stale are the others that carry nothing new.
	Stale []int
	// Conflicts are snapshots at the winner's version with other content:
	// the first one wins and these are reported, never applied.
	Conflicts []int
}

// Fold picks the snapshot to write from one job's snapshots in arrival
// order. snaps must not be empty.
func Fold(snaps []event.Event) Folded {
	f := Folded{Winner: 0}
	for i := 1; i < len(snaps); i++ {
		if snaps[i].Version > snaps[f.Winner].Version {
			f.Stale = append(f.Stale, f.Winner)
			f.Winner = i
		} else {
			f.Stale = append(f.Stale, i)
		}
	}
	// Among the losers, those at the winning version with other content
	// are conflicts rather than plain staleness.
	kept := f.Stale[:0]
	for _, i := range f.Stale {
		if snaps[i].Version == snaps[f.Winner].Version && !SameState(snaps[i].State, snaps[f.Winner].State) {
			f.Conflicts = append(f.Conflicts, i)
			continue
		}
		kept = append(kept, i)
	}
	f.Stale = kept
	return f
}

// SameState reports whether two JSON states are equal as JSON values
// (member order and spacing aside; numbers compared by their literal).
func SameState(a, b json.RawMessage) bool {
	if bytes.Equal(a, b) {
		return true
	}
	va, errA := decode(a)
	vb, errB := decode(b)
	if errA != nil || errB != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

func decode(raw json.RawMessage) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

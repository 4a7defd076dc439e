package snapshot_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/event"
	"github.com/projector/projector/snapshot"
)

func snap(version int64, state string) event.Event {
	return event.Event{JobID: "job-1", Version: version, Kind: event.Snapshot, State: json.RawMessage(state)}
}

func TestFold(t *testing.T) {
	t.Parallel()

	const a, b = `{"status":"running","n":1}`, `{"status":"failed","n":1}`
	tests := []struct {
		name      string
		snaps     []event.Event
		winner    int
		stale     []int
		conflicts []int
	}{
		{
			name:   "single",
			snaps:  []event.Event{snap(4, a)},
			winner: 0,
		},
		{
			name:   "increasing",
			snaps:  []event.Event{snap(1, a), snap(2, b), snap(3, a)},
			winner: 2,
			stale:  []int{0, 1},
		},
		{
			name:   "scrambled",
			snaps:  []event.Event{snap(2, a), snap(5, b), snap(1, a), snap(3, b)},
			winner: 1,
			stale:  []int{0, 2, 3},
		},
		{
			name:   "highest last after a lower one",
			snaps:  []event.Event{snap(3, a), snap(1, b), snap(5, a)},
			winner: 2,
			stale:  []int{0, 1},
		},
		{
			name:   "equal highest versions, same content: stale",
			snaps:  []event.Event{snap(3, a), snap(3, a)},
			winner: 0,
			stale:  []int{1},
		},
		{
			name:   "equal highest versions, same content in another member order: stale",
			snaps:  []event.Event{snap(3, a), snap(3, `{ "n": 1, "status": "running" }`)},
			winner: 0,
			stale:  []int{1},
		},
		{
			name:      "equal highest versions, different content: conflict, first wins",
			snaps:     []event.Event{snap(3, a), snap(3, b)},
			winner:    0,
			conflicts: []int{1},
		},
		{
			name:      "conflict among stale ones",
			snaps:     []event.Event{snap(1, b), snap(3, a), snap(2, b), snap(3, b), snap(3, a)},
			winner:    1,
			stale:     []int{0, 2, 4},
			conflicts: []int{3},
		},
		{
			name:   "lower versions with other content are stale, not conflicts",
			snaps:  []event.Event{snap(1, b), snap(2, a)},
			winner: 1,
			stale:  []int{0},
		},
		{
			name:      "a number written differently is a conflict",
			snaps:     []event.Event{snap(3, `{"n":1}`), snap(3, `{"n":1.0}`)},
			winner:    0,
			conflicts: []int{1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := snapshot.Fold(tt.snaps)
			require.Equal(t, tt.winner, got.Winner)
			require.ElementsMatch(t, tt.stale, got.Stale, "stale")
			require.ElementsMatch(t, tt.conflicts, got.Conflicts, "conflicts")
		})
	}
}

func TestSameState(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		a, b string
		same bool
	}{
		{name: "identical", a: `{"a":1}`, b: `{"a":1}`, same: true},
		{name: "member order", a: `{"a":1,"b":"x"}`, b: `{"b":"x","a":1}`, same: true},
		{name: "nested member order", a: `{"o":{"a":1,"b":[1,2]}}`, b: `{"o":{"b":[1,2],"a":1}}`, same: true},
		{name: "spacing", a: `{"a":1}`, b: " {\n\t\"a\" : 1 } ", same: true},
		{name: "string escapes", a: `{"a":"x"}`, b: `{"a":"\u0078"}`, same: true},
		{name: "empty objects", a: `{}`, b: `{ }`, same: true},
		{name: "1 vs 1.0", a: `{"n":1}`, b: `{"n":1.0}`, same: false},
		{name: "1 vs 1e0", a: `{"n":1}`, b: `{"n":1e0}`, same: false},
		{name: "integers past 2^53 stay exact", a: `{"n":9007199254740993}`, b: `{"n":9007199254740992}`, same: false},
		{name: "different value", a: `{"a":1}`, b: `{"a":2}`, same: false},
		{name: "extra member", a: `{"a":1}`, b: `{"a":1,"b":null}`, same: false},
		{name: "array order", a: `{"a":[1,2]}`, b: `{"a":[2,1]}`, same: false},
		{name: "string vs number", a: `{"a":1}`, b: `{"a":"1"}`, same: false},
		{name: "malformed", a: `{"a":1}`, b: `{"a":`, same: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.same, snapshot.SameState(json.RawMessage(tt.a), json.RawMessage(tt.b)))
			require.Equal(t, tt.same, snapshot.SameState(json.RawMessage(tt.b), json.RawMessage(tt.a)), "symmetric")
		})
	}
}

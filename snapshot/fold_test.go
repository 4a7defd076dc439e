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

func del(version int64) event.Event {
	return event.Event{JobID: "job-1", Version: version, Kind: event.Delete}
}

func TestFold(t *testing.T) {
	t.Parallel()

	const a, b = `{"status":"running","n":1}`, `{"status":"failed","n":1}`
	none := snapshot.Head{}
	tests := []struct {
		name      string
		head      snapshot.Head
		snaps     []event.Event
		winner    int
		conflicts []int
		// applied and stale as counted against the row's version before.
		before                  int64
		applied, deleted, stale int
	}{
		{name: "single", head: none, snaps: []event.Event{snap(4, a)}, winner: 0, applied: 1},
		{name: "increasing", head: none, snaps: []event.Event{snap(1, a), snap(2, b), snap(3, a)}, winner: 2, applied: 3},
		{name: "scrambled", head: none, snaps: []event.Event{snap(2, a), snap(5, b), snap(1, a), snap(3, b)}, winner: 1, applied: 2, stale: 2},
		{name: "scrambled against a row at 2", head: none, snaps: []event.Event{snap(2, a), snap(5, b), snap(1, a), snap(3, b)}, winner: 1, before: 2, applied: 1, stale: 3},
		{name: "equal versions, same content: stale", head: none, snaps: []event.Event{snap(3, a), snap(3, a)}, winner: 0, applied: 1, stale: 1},
		{name: "equal versions, same content in another member order: stale", head: none,
			snaps: []event.Event{snap(3, a), snap(3, `{ "n": 1.0, "status": "running" }`)}, winner: 0, applied: 1, stale: 1},
		{name: "equal versions, different content: conflict, first wins", head: none,
			snaps: []event.Event{snap(3, a), snap(3, b)}, winner: 0, conflicts: []int{1}, applied: 1},
		{name: "a conflict with the run's version in hand", head: none,
			snaps: []event.Event{snap(1, b), snap(3, a), snap(2, b), snap(3, b), snap(3, a)}, winner: 1, conflicts: []int{3}, applied: 2, stale: 2},
		{name: "lower versions with other content are stale, not conflicts", head: none,
			snaps: []event.Event{snap(1, b), snap(2, a)}, winner: 1, applied: 2},
		{name: "the head wins over an equal version with other content", head: snapshot.Head{Version: 3, State: json.RawMessage(a)},
			snaps: []event.Event{snap(3, b), snap(3, a)}, winner: -1, conflicts: []int{0}, before: 3, stale: 1},
		{name: "a delete wins like a snapshot", head: none, snaps: []event.Event{snap(1, a), del(3), snap(2, b)}, winner: 1, applied: 2, deleted: 1, stale: 1},
		{name: "a snapshot above a delete creates the job again", head: none, snaps: []event.Event{del(3), snap(4, a)}, winner: 1, applied: 2, deleted: 1},
		{name: "a snapshot at a delete's version is stale", head: none, snaps: []event.Event{del(3), snap(3, a), del(3)}, winner: 0, applied: 1, deleted: 1, stale: 2},
		{name: "a snapshot at a deleted head's version is stale", head: snapshot.Head{Version: 3, Deleted: true},
			snaps: []event.Event{snap(3, a), snap(2, b)}, winner: -1, before: 3, stale: 2},
		{name: "a delete at a known state's version is a conflict", head: snapshot.Head{Version: 3, State: json.RawMessage(a)},
			snaps: []event.Event{del(3), del(2)}, winner: -1, conflicts: []int{0}, before: 3, stale: 1},
		{name: "a delete at the version of an earlier snapshot of the run is a conflict", head: none,
			snaps: []event.Event{snap(3, a), del(3)}, winner: 0, conflicts: []int{1}, applied: 1},
		{name: "deletes counted against a row above them are stale", head: none, snaps: []event.Event{del(3), snap(5, a)}, winner: 1, before: 4, applied: 1, stale: 1},
		{name: "nothing above the head", head: snapshot.Head{Version: 9, State: json.RawMessage(a)},
			snaps: []event.Event{snap(3, b), snap(9, a)}, winner: -1, before: 9, stale: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := snapshot.Fold(tt.head, tt.snaps)
			require.Equal(t, tt.winner, got.Winner)
			require.ElementsMatch(t, tt.conflicts, got.Conflicts, "conflicts")
			applied, stale := got.Count(tt.before)
			require.Equal(t, tt.applied, applied, "applied")
			require.Equal(t, tt.deleted, got.Deletes(tt.before), "deleted")
			require.Equal(t, tt.stale, stale, "stale")
		})
	}
}

package verify

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/event"
	"github.com/projector/projector/store"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	snap := func(v int64, state string) event.Event {
		return event.Event{JobID: "j", Version: v, Kind: event.Snapshot, State: json.RawMessage(state)}
	}
	del := func(v int64) event.Event { return event.Event{JobID: "j", Version: v, Kind: event.Delete} }
	row := func(v int64, state string) store.Job {
		return store.Job{ID: "j", Version: v, State: json.RawMessage(state)}
	}
	tomb := func(v int64) store.Job { return store.Job{ID: "j", Version: v, Deleted: true} }
	for _, tc := range []struct {
		name   string
		row    store.Job
		hasRow bool
		auth   event.Event
		want   Kind // "" for no drift
	}{
		{"same", row(2, `{"a":1}`), true, snap(2, `{"a":1}`), ""},
		{"same state, other key order", row(2, `{"a":1,"b":2}`), true, snap(2, `{"b":2,"a":1}`), ""},
		{"missing", store.Job{}, false, snap(1, `{}`), Missing},
		{"behind", row(1, `{}`), true, snap(2, `{}`), Behind},
		{"ahead", row(3, `{}`), true, snap(2, `{}`), Ahead},
		{"differs", row(2, `{"a":1}`), true, snap(2, `{"a":2}`), Differs},
		{"deleted by both", tomb(3), true, del(3), ""},
		{"deleted, never seen", store.Job{}, false, del(3), ""},
		{"row behind a delete", row(2, `{}`), true, del(3), Behind},
		{"row ahead of a delete", row(4, `{}`), true, del(3), Ahead},
		{"row at a delete's version", row(3, `{}`), true, del(3), Differs},
		{"tombstone behind a snapshot", tomb(2), true, snap(3, `{}`), Behind},
		{"tombstone ahead of a snapshot", tomb(4), true, snap(3, `{}`), Ahead},
		{"tombstone at a snapshot's version", tomb(3), true, snap(3, `{}`), Differs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := classify("j", tc.row, tc.hasRow, tc.auth)
			if tc.want == "" {
				require.Nil(t, d)
				return
			}
			require.NotNil(t, d)
			require.Equal(t, tc.want, d.Kind)
			require.Equal(t, tc.auth.Version, d.AuthorityVersion)
			require.Equal(t, tc.row.Deleted, d.RowDeleted)
			require.Equal(t, tc.auth.Kind == event.Delete, d.AuthorityDeleted)
		})
	}
}

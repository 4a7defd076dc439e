package event_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
)

// FuzzDecode feeds arbitrary keys and values to Decode. Nothing may panic, a
// refusal must be a *FieldError, and an accepted event must be one the
// version rules can order.
func FuzzDecode(f *testing.F) {
	f.Add([]byte("job-1"), []byte(`{"job_id":"job-1","version":7,"kind":"snapshot","state":{"status":"running"},"event_id":"evt-90","occurred_at":"2026-11-30T10:00:00Z"}`))
	f.Add([]byte(""), []byte(`{"job_id":"job-1","version":8,"kind":"delta","ops":[{"op":"increment","path":"/processed_articles","by":5}]}`))
	f.Add([]byte("job-2"), []byte(`{"job_id":"job-1","version":1,"kind":"snapshot","state":{}}`))
	f.Add([]byte(""), []byte(`{"job_id":"job-1","version":9223372036854775808,"kind":"snapshot","state":{}}`))
	f.Add([]byte(""), []byte(`{"job_id":"job-1","version":1.5,"kind":"delta","ops":[]}`))
	f.Add([]byte{0, 0, 0, 0}, []byte{0, 0, 0, 0, 0, 0})
	f.Add([]byte("job-1"), []byte(nil))
	f.Add([]byte("job-1"), []byte("null"))
	f.Add([]byte("job-1"), []byte(`{"job_id":"job-1","version":9,"kind":"delete","event_id":"evt-91"}`))
	f.Add([]byte(""), []byte(`{"job_id":"j","version":2,"kind":"delta","ops":[{"op":"set","path":"/a","value":{"x":[1,"y"]},"PATH":"/b"},{"o\u0070":"remove","path":"/c~1d"},{"op":"increment","path":"/n","by":-1.5e3,"by":2}]}`))
	f.Add([]byte(""), []byte(`{"job_id":"j","version":2,"kind":"delta","ops":[{"op":"set","path":"/a","value":1}],"ops":[1,{"op":"remove","path":"/b"}]}`))
	f.Add([]byte(""), []byte(`{"job_id":"j","version":2,"kind":"delta","ops":[{"op":"set","path":"/a"}, {"op":"remove"}]}`))
	f.Add([]byte(""), []byte(`{"job_id":"j","version":2,"kind":"delta","ops":[{"op":"set","path":"/a","value":1}],"ops":5}`))
	f.Add([]byte(""), []byte(`{"job_id":"j\u00e9","version":1,"kind":"snapshot","state":{"a":"\n"},"event_id":"e\"1","occurred_at":"2026-11-30T10:00:00.25\u005a"}`))
	f.Add([]byte(""), []byte(`{"job_id":"j","event_id":"e\u0031","version":1,"kind":"delete","occurred_at":"2026-11-30T10:00:00+02:00"}`))
	f.Add([]byte(""), []byte(`{"job_id":"j","version":1,"kind":"delete","occurred_at":"2026-11-30T10:00:00+05:30"}`))
	f.Add([]byte(""), []byte("{\"job_id\":\"j\",\"version\":1,\"kind\":\"delete\"}\v"))

	f.Fuzz(func(t *testing.T, key, value []byte) {
		ev, err := event.Decode(key, value)
		if err != nil {
			var fieldErr *event.FieldError
			require.ErrorAs(t, err, &fieldErr)
			require.NotEmpty(t, fieldErr.Field)
			require.NotEmpty(t, fieldErr.Reason)
			if fieldErr.Field == "ops" && strings.HasPrefix(fieldErr.Reason, "ops") && json.Valid(value) {
				// The ops the scanner noted are parsed as delta.ParseOps
				// parses the array on its own: the same refusal (the
				// scanner's own, such as bad UTF-8, say no "ops").
				var top map[string]json.RawMessage
				if json.Unmarshal(value, &top) == nil && top["ops"] != nil {
					_, perr := delta.ParseOps(top["ops"])
					if perr != nil {
						require.Equal(t, perr.Error(), fieldErr.Reason)
					}
				}
			}
			return
		}
		require.GreaterOrEqual(t, ev.Version, int64(1))
		require.NotEmpty(t, ev.JobID)
		require.LessOrEqual(t, len(ev.JobID), event.MaxJobIDBytes)
		require.LessOrEqual(t, len(value), event.MaxValueBytes)
		if len(key) > 0 {
			require.Equal(t, string(key), ev.JobID)
		}
		// The strings as encoding/json reads them, escaped or not.
		var top map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(value, &top))
		var jobID, eventID, at string
		require.NoError(t, json.Unmarshal(top["job_id"], &jobID))
		require.Equal(t, jobID, ev.JobID)
		if raw, ok := top["event_id"]; ok {
			require.NoError(t, json.Unmarshal(raw, &eventID))
		}
		require.Equal(t, eventID, ev.EventID)
		if raw, ok := top["occurred_at"]; ok {
			require.NoError(t, json.Unmarshal(raw, &at))
		}
		if at == "" {
			require.True(t, ev.OccurredAt.IsZero())
		} else {
			// The same instant in the same zone; == would also compare
			// the *time.Location, which time.Parse makes anew for an
			// offset of other than whole hours.
			want, err := time.Parse(time.RFC3339Nano, at)
			require.NoError(t, err)
			wantName, wantOff := want.Zone()
			gotName, gotOff := ev.OccurredAt.Zone()
			require.True(t, want.Equal(ev.OccurredAt) && wantName == gotName && wantOff == gotOff,
				"occurred_at %q: %v, time.Parse %v", at, ev.OccurredAt, want)
		}
		switch ev.Kind {
		case event.Snapshot:
			_, err := delta.DecodeState(ev.State)
			require.NoError(t, err, "a snapshot's state must be an object")
			require.Empty(t, ev.Ops)
		case event.Delta:
			require.NotEmpty(t, ev.Ops)
			require.LessOrEqual(t, len(ev.Ops), delta.MaxOps)
			require.True(t, bytes.HasPrefix(ev.RawOps, []byte("[")))
			require.Nil(t, ev.State)
			// The same ops as delta.ParseOps makes of the array alone.
			want, err := delta.ParseOps(ev.RawOps)
			require.NoError(t, err)
			require.Equal(t, want, ev.Ops)
		case event.Delete:
			require.Nil(t, ev.State, "a delete carries no state")
			require.Empty(t, ev.Ops, "a delete carries no ops")
			require.Nil(t, ev.RawOps)
		default:
			t.Fatalf("kind %q is not snapshot, delta or delete", ev.Kind)
		}
	})
}

package projection

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// big is a number at the edge of PostgreSQL's numeric range (131072 digits
// before the point): it fits, but adding it to itself does not.
const big = "9e131071"

// A valid delta that lets a held one through is not blamed for the held
// one's data: v1 is projected, v3 is held, v2 arrives and releases v3,
// whose increment pushes a number past PostgreSQL's numeric range. v2 is
// applied, v3 is quarantined under its own offset with PostgreSQL's
// refusal, and the job is left at v2 with nothing held.
func TestRefusedHeldDeltaIsQuarantinedAndTheDeltaThatReleasedItApplies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		batchSize int
	}{
		{"one batch", 500},
		{"a batch per record", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, 1)
			offs := r.produce(
				rec{0, "big", snap("big", 1, `{"n":`+big+`}`)},
				rec{0, "big", dlt("big", 3, `[{"op":"increment","path":"/n","by":`+big+`}]`)},
				rec{0, "big", dlt("big", 2, `[{"op":"set","path":"/s","value":"v2"}]`)},
				rec{0, "after", snap("after", 1, `{"ok":true}`)},
			)
			// Only the record that releases v3 may close its gap: no
			// re-read, no waiting out.
			run := r.start(r.config(func(c *Config) {
				c.BatchSize = tc.batchSize
				c.NoReread = true
				c.GapWait = time.Hour
			}))
			r.caughtUp(30*time.Second, run)

			rows := r.rows()
			require.Contains(t, rows, "after", "the stream moved on")
			row := rows["big"]
			require.Equal(t, int64(2), row.Version, "v2 is applied")
			var state map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(row.State, &state))
			require.JSONEq(t, `"v2"`, string(state["s"]))

			q, total, err := r.store.Quarantine(context.Background(), 10)
			require.NoError(t, err)
			require.Equal(t, 1, total, "only v3 is quarantined: %+v", q)
			require.Equal(t, offs[1], q[0].Offset, "v3, at its own offset")
			require.Equal(t, 0, q[0].Partition)
			require.Equal(t, "big", string(q[0].Key))
			require.Contains(t, q[0].Error, "version 3")
			require.Contains(t, q[0].Error, "refused by PostgreSQL")
			require.Contains(t, q[0].Error, "SQLSTATE 22003", q[0].Error)
			require.True(t, strings.Contains(string(q[0].Value), `"version":3`), "%s", q[0].Value)

			held, err := r.store.LoadHeld(context.Background(), r.topic, 0)
			require.NoError(t, err)
			require.Empty(t, held, "v3 left the held rows for the quarantine")
			c := run.p.Status().Counters
			require.Zero(t, c.HeldJobs, "%+v", c)
			require.Equal(t, int64(1), c.Quarantined, "%+v", c)
			require.Equal(t, int64(len(offs)), c.Consumed, fmt.Sprintf("%+v", c))
		})
	}
}

// The same refusal met by a gap resolution: v2 is in another partition, so
// v3's gap is closed by the re-read (or by the other partition's worker
// moving the row). The refusal is pinned on v3 there too.
func TestRefusedHeldDeltaReleasedByAResolutionIsQuarantined(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2)
	offs := r.produce(
		rec{0, "big", snap("big", 1, `{"n":`+big+`}`)},
		rec{0, "big", dlt("big", 3, `[{"op":"increment","path":"/n","by":`+big+`}]`)},
	)
	run := r.start(r.config())
	r.caughtUp(30*time.Second, run)
	r.produce(rec{1, "", dlt("big", 2, `[{"op":"set","path":"/s","value":"v2"}]`)})
	r.caughtUp(30*time.Second, run)
	r.eventually(30*time.Second, "v3 leaves the held rows", func() (bool, string) {
		held, err := r.store.LoadHeld(context.Background(), r.topic, 0)
		if err != nil {
			return false, err.Error()
		}
		return len(held) == 0, fmt.Sprintf("%d held", len(held))
	})
	require.Equal(t, int64(2), r.rows()["big"].Version, "v2 is applied")
	q, total, err := r.store.Quarantine(context.Background(), 10)
	require.NoError(t, err)
	require.Equal(t, 1, total, "only v3 is quarantined: %+v", q)
	require.Equal(t, offs[1], q[0].Offset)
	require.Equal(t, 0, q[0].Partition)
	require.Contains(t, q[0].Error, "SQLSTATE 22003")
	r.eventually(10*time.Second, "the counters show one quarantined record", func() (bool, string) {
		c := run.p.Status().Counters
		return c.Quarantined == 1 && c.HeldJobs == 0, fmt.Sprintf("%+v", c)
	})
}

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
				c.GapWait, c.GapWaitOff = time.Hour, false
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

// A failure that is not the data's, met in the middle of isolating a
// refused batch (here a serialization failure PostgreSQL raises once, on
// v2's write; a lost connection or a statement timeout read the same),
// loses nothing and duplicates nothing: the worker ends its generation
// with nothing of the step committed, the partition is claimed again from
// the stored position with v3 still held, and the isolation done again
// ends as if uninterrupted: v2 applied, v3 quarantined once, the records
// after projected.
func TestIsolationInterruptedByAFailureThatIsNotTheData(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	ctx := context.Background()
	_, err := r.store.Pool().Exec(ctx, `CREATE SEQUENCE `+r.store.Schema()+`.flaky;
		CREATE FUNCTION `+r.store.Schema()+`.flaky() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			-- nextval is not rolled back: only the first write of v2 fails.
			IF NEW.job_id = 'big' AND NEW.version = 2 AND nextval('`+r.store.Schema()+`.flaky') = 1 THEN
				RAISE EXCEPTION 'could not serialize access (raised once by the test)' USING ERRCODE = '40001';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER flaky BEFORE INSERT OR UPDATE ON `+r.store.JobsTable()+`
			FOR EACH ROW EXECUTE FUNCTION `+r.store.Schema()+`.flaky();`)
	require.NoError(t, err)
	offs := r.produce(
		rec{0, "big", snap("big", 1, `{"n":`+big+`}`)},
		rec{0, "big", dlt("big", 3, `[{"op":"increment","path":"/n","by":`+big+`}]`)},
		rec{0, "big", dlt("big", 2, `[{"op":"set","path":"/s","value":"v2"}]`)},
		rec{0, "after", snap("after", 1, `{"ok":true}`)},
	)
	run := r.start(r.config(func(c *Config) {
		c.NoReread = true
		c.GapWait, c.GapWaitOff = time.Hour, false
	}))
	r.caughtUp(30*time.Second, run)

	var failures int64
	require.NoError(t, r.store.Pool().QueryRow(ctx, `SELECT last_value FROM `+r.store.Schema()+`.flaky`).Scan(&failures))
	require.GreaterOrEqual(t, failures, int64(2), "v2's write failed once, then was retried")
	rows := r.rows()
	require.Contains(t, rows, "after", "the stream moved on")
	require.Equal(t, int64(2), rows["big"].Version, "v2 is applied")
	q, total, err := r.store.Quarantine(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 1, total, "only v3 is quarantined: %+v", q)
	require.Equal(t, offs[1], q[0].Offset)
	require.Contains(t, q[0].Error, "SQLSTATE 22003")
	held, err := r.store.LoadHeld(ctx, r.topic, 0)
	require.NoError(t, err)
	require.Empty(t, held)
}

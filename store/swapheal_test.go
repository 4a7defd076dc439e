package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// A heal (verify --repair) commits outside the partitions' fence. Made
// while a swap moves the rebuilt rows and tombstones in, it must wait for
// the swap and apply to the rebuilt model: never commit between the swap's
// writes, where it left a row beside the tombstone the swap moved in.
func TestHealDuringASwapWaitsForIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	live, err := store.New(pool, store.Config{Schema: schema, Table: "jobs"})
	require.NoError(t, err)
	require.NoError(t, live.Migrate(ctx))
	lb := newBatcher(t, live, 0)
	lb.must(store.Batch{Snapshots: []store.Write{snapshotW("j", 1, `{"a":1}`)}})
	lb.must(store.Batch{Deletes: []store.Write{deleteW("j", 3)}})
	// A held delta of another job: the test holds its row to stop the
	// swap after it wrote the rows and before it moves the tombstones.
	lb.must(store.Batch{Hold: []store.Held{{JobID: "k", Version: 5, Ops: json.RawMessage(`[]`), Since: time.Now()}}})

	shadow, err := live.Shadow()
	require.NoError(t, err)
	require.NoError(t, shadow.Reset(ctx))
	require.NoError(t, shadow.Migrate(ctx))
	sb := newBatcher(t, shadow, 0)
	sb.must(store.Batch{Snapshots: []store.Write{snapshotW("j", 1, `{"a":1}`)}})
	sb.must(store.Batch{Deletes: []store.Write{deleteW("j", 3)}})

	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer blocker.Rollback(ctx)
	_, err = blocker.Exec(ctx, `SELECT 1 FROM `+schema+`.projector_held WHERE job_id = 'k' FOR UPDATE`)
	require.NoError(t, err)

	swapped := make(chan error, 1)
	go func() {
		_, err := live.Swap(ctx, shadow, false)
		swapped <- err
	}()
	// Only this test's swap: other tests swap in their own schemas at the
	// same time, and one of them waiting must not pass for this one.
	waiting := func(app, event string) bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name LIKE $1 AND wait_event_type = 'Lock' AND wait_event = $2
				AND strpos(query, $3) > 0`,
			app, event, schema).Scan(&n))
		return n > 0
	}
	require.Eventually(t, func() bool { return waiting("projector rebuild swap", "transactionid") }, time.Minute, 10*time.Millisecond,
		"the swap reaches the held rows")

	healed := make(chan error, 1)
	go func() {
		_, _, err := live.Heal(ctx, "j", 5, json.RawMessage(`{"a":5}`), "", false)
		healed <- err
	}()
	// Either the heal commits at once, or it waits for the swap's locks.
	var done bool
	require.Eventually(t, func() bool {
		select {
		case err := <-healed:
			require.NoError(t, err)
			done = true
			return true
		default:
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
				WHERE NOT l.granted AND l.locktype = 'advisory' AND a.datname = current_database()
					AND a.query LIKE '%pg_advisory_xact_lock%' AND a.application_name NOT LIKE 'projector rebuild swap'`).Scan(&n))
			return n > 0
		}
	}, time.Minute, 10*time.Millisecond)
	require.NoError(t, blocker.Rollback(ctx))
	require.NoError(t, <-swapped)
	if !done {
		require.NoError(t, <-healed)
	}

	v, state, ok := rowOf(t, live, "j")
	_, tomb := tombstoneOf(t, live, "j")
	require.False(t, ok && tomb, "a job has a row or a tombstone, never both")
	require.True(t, ok, "the heal applies to the rebuilt model")
	require.Equal(t, int64(5), v)
	require.JSONEq(t, `{"a":5}`, state)
}

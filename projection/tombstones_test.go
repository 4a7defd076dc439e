package projection

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func del(job string, v int64) string {
	return fmt.Sprintf(`{"job_id":%q,"version":%d,"kind":"delete","event_id":"evt-%s-%d"}`, job, v, job, v)
}

// TestTombstonesArePrunedAfterRetention goes through Kafka and PostgreSQL:
// a deleted job's tombstone keeps an old snapshot out while it lasts, is
// pruned once the retention has passed, and then an old snapshot creates
// the job again: the documented trade-off of a bounded retention. With
// TombstonesForever nothing is pruned.
func TestTombstonesArePrunedAfterRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// Kept for ever: the tombstone outlives many prune intervals of a
	// short retention and keeps refusing the old snapshot.
	keep := newRig(t, 1)
	run := keep.start(keep.config(func(c *Config) { c.TombstonesForever = true }))
	keep.produce(rec{0, "a", snap("a", 1, `{"n":1}`)}, rec{0, "a", del("a", 3)})
	keep.caughtUp(20*time.Second, run)
	keep.produce(rec{0, "a", snap("a", 2, `{"n":2}`)})
	keep.caughtUp(20*time.Second, run)
	require.NotContains(t, keep.rows(), "a")
	n, err := keep.store.CountTombstones(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Zero(t, run.p.Status().Counters.TombstonesPruned)
	require.Equal(t, int64(1), run.p.Status().Counters.Stale)

	// A retention of 200ms: pruned soon after.
	r := newRig(t, 1)
	run = r.start(r.config(func(c *Config) { c.TombstoneRetention = 200 * time.Millisecond }))
	r.produce(rec{0, "a", snap("a", 1, `{"n":1}`)}, rec{0, "a", del("a", 3)})
	r.caughtUp(20*time.Second, run)
	require.NotContains(t, r.rows(), "a")
	r.eventually(20*time.Second, "the tombstone is pruned", func() (bool, string) {
		n, err := r.store.CountTombstones(ctx)
		if err != nil {
			return false, err.Error()
		}
		return n == 0, fmt.Sprintf("%d tombstones left", n)
	})
	r.eventually(5*time.Second, "the prune is counted", func() (bool, string) {
		got := run.p.Status().Counters.TombstonesPruned
		return got == 1, fmt.Sprintf("tombstones_pruned=%d", got)
	})

	// The trade-off: a snapshot older than the forgotten delete creates
	// the job again.
	r.produce(rec{0, "a", snap("a", 2, `{"n":2}`)})
	r.caughtUp(20*time.Second, run)
	rows := r.rows()
	require.Contains(t, rows, "a")
	require.Equal(t, int64(2), rows["a"].Version)
	require.JSONEq(t, `{"n":2}`, string(rows["a"].State))
}

package projection

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRestoreLeavesHeldOpsInPostgreSQLPastHalfTheBudget: held deltas
// stored by a previous owner are restored with their ops in memory while
// the cache keeps them, and left in PostgreSQL once pinned bytes pass half
// of --cache-bytes; either way, when the gap closes every job ends exact.
func TestRestoreLeavesHeldOpsInPostgreSQLPastHalfTheBudget(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	inc := func(v int64) string {
		return fmt.Sprintf(`[{"op":"increment","path":"/count","by":%d},{"op":"set","path":"/last","value":%d}]`, v, v)
	}
	ids := jobIDs("restored", 40)
	var held []rec
	for _, id := range ids {
		held = append(held, rec{0, id, snap(id, 1, counterStateOf(1))})
		for v := int64(3); v <= 6; v++ {
			held = append(held, rec{0, id, dlt(id, v, inc(v))})
		}
	}
	r.produce(held...)
	heldJobs := func(run *running, want int) {
		t.Helper()
		r.eventually(30*time.Second, fmt.Sprintf("%d jobs held", want), func() (bool, string) {
			n := run.p.Status().Counters.HeldJobs
			return n == int64(want), fmt.Sprintf("%d held", n)
		})
	}
	closeGaps := func(run *running, ids []string) {
		t.Helper()
		var missing []rec
		for _, id := range ids {
			missing = append(missing, rec{0, id, dlt(id, 2, inc(2))})
		}
		r.produce(missing...)
		r.caughtUp(30*time.Second, run)
		rows := r.rows()
		r.eventually(10*time.Second, "the gaps close", func() (bool, string) {
			rows = r.rows()
			for _, id := range ids {
				if rows[id].Version != 6 {
					return false, fmt.Sprintf("%s at %d", id, rows[id].Version)
				}
			}
			return true, ""
		})
		for _, id := range ids {
			require.JSONEq(t, counterStateOf(6), string(rows[id].State), id)
		}
	}

	first := r.start(r.config(func(c *Config) { c.GapWait, c.GapWaitOff = time.Hour, false }))
	r.caughtUp(30*time.Second, first)
	heldJobs(first, len(ids))
	first.halt(t)

	// A tiny budget: the restored deltas' ops stay in PostgreSQL, and are
	// read back when the first half's gaps close.
	tiny := r.start(r.config(func(c *Config) { c.GapWait, c.GapWaitOff = time.Hour, false; c.CacheBytes = 4000 }))
	heldJobs(tiny, len(ids))
	require.True(t, anySpilled(tiny.p), "every restored held delta kept its ops in memory past half the budget")
	closeGaps(tiny, ids[:20])
	heldJobs(tiny, 20)
	tiny.halt(t)

	// The default budget: the rest are restored with their ops.
	roomy := r.start(r.config(func(c *Config) { c.GapWait, c.GapWaitOff = time.Hour, false }))
	heldJobs(roomy, 20)
	require.False(t, anySpilled(roomy.p), "a restored held delta's ops were left in PostgreSQL with the budget nearly empty")
	closeGaps(roomy, ids[20:])
	heldJobs(roomy, 0)
}

package projection

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/event"
	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/store"
)

// TestTheCacheStaysWithinItsBytes: 100,000 jobs of 2.5 KB state each go
// through the caches of four partitions sharing one budget. The heap the
// caches keep, measured with runtime.ReadMemStats, stays within the
// budget; eviction is least recently used, one job at a time, so a job
// used again and again is never dropped; held jobs are pinned.
func TestTheCacheStaysWithinItsBytes(t *testing.T) {
	const budget = DefaultCacheBytes
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	b := newCacheBudget(budget)
	caches := make([]*jobCache, 4)
	for i := range caches {
		caches[i] = newJobCache(b)
	}
	pad := strings.Repeat("x", 2500)
	held := gapfill.Job{ID: "held", Version: 1, Raw: []byte(`{}`), Held: map[int64]gapfill.Held{
		3: {Input: gapfill.Input{Event: heldEvent("held", 3)}, Since: time.Now()},
	}}
	caches[0].put(held)
	for i := range 100_000 {
		id := fmt.Sprintf("job-%06d", i)
		// Each state is its own allocation, as a record's would be.
		raw := []byte(fmt.Sprintf(`{"n":%d,"pad":%q}`, i, pad))
		caches[i%4].put(gapfill.Job{ID: id, Version: int64(i%7 + 1), Raw: raw, EventID: "evt-" + id})
		if i > 1 && i%100 == 0 {
			_, ok := caches[1].get("job-000001") // kept in use
			require.True(t, ok, "a job used every 100 puts was evicted at put %d", i)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	b.mu.Lock()
	used, n := b.used, b.lruLen
	b.mu.Unlock()
	t.Logf("budget %d B: accounted %d B, %d jobs kept, %d evicted; heap grew by %d B", budget, used, n, b.evictions.Load(), grown)
	require.LessOrEqual(t, used, int64(budget))
	require.LessOrEqual(t, grown, int64(budget), "the caches keep more than their budget")
	require.Greater(t, n, budget/2/3000, "eviction emptied the cache instead of trimming it")
	_, ok := caches[0].get("held")
	require.True(t, ok, "a held job was evicted")
	_, ok = caches[3].get("job-099999")
	require.True(t, ok, "the newest job was evicted")
	_, ok = caches[0].get("job-000000")
	require.False(t, ok, "the oldest unused job is still cached over budget")
	runtime.KeepAlive(caches)
}

func heldEvent(job string, v int64) event.Event {
	return event.Event{JobID: job, Version: v, Kind: event.Delta, RawOps: []byte(`[{"op":"increment","path":"/count","by":1}]`), EventID: fmt.Sprintf("evt-%s-%d", job, v)}
}

// TestHeldDeltasLeftInPostgreSQLApplyWhenTheGapCloses: with a budget so
// small that held deltas' ops stay in PostgreSQL, counter jobs whose
// deltas arrive ahead of a missing version, in a later batch than it, end
// exact: the held ops are read back when the gap closes.
func TestHeldDeltasLeftInPostgreSQLApplyWhenTheGapCloses(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2)
	inc := func(v int64) string {
		return fmt.Sprintf(`[{"op":"increment","path":"/count","by":%d},{"op":"set","path":"/last","value":%d}]`, v, v)
	}
	ids := jobIDs("gappy", 30)
	var first, second []rec
	for _, id := range ids {
		p := partitionOf(id, 2)
		first = append(first, rec{p, id, snap(id, 1, counterStateOf(1))})
		for v := int64(3); v <= 6; v++ {
			first = append(first, rec{p, id, dlt(id, v, inc(v))})
		}
		second = append(second, rec{p, id, dlt(id, 2, inc(2))})
	}
	rng := rand.New(rand.NewPCG(3, 3))
	rng.Shuffle(len(second), func(i, j int) { second[i], second[j] = second[j], second[i] })
	r.produce(first...)
	run := r.start(r.config(func(c *Config) { c.CacheBytes = 4000; c.BatchSize = 13; c.GapWait, c.GapWaitOff = time.Hour, false }))
	r.caughtUp(30*time.Second, run)
	require.Equal(t, int64(len(ids)), run.p.Status().Counters.HeldJobs)
	require.True(t, anySpilled(run.p), "no held delta was left in PostgreSQL: the test does not test that")
	r.produce(second...)
	r.caughtUp(30*time.Second, run)
	r.eventually(10*time.Second, "every gap closed", func() (bool, string) {
		n := run.p.Status().Counters.HeldJobs
		return n == 0, fmt.Sprintf("%d held", n)
	})
	rows := r.rows()
	for _, id := range ids {
		require.Equal(t, int64(6), rows[id].Version, id)
		require.JSONEq(t, counterStateOf(6), string(rows[id].State), id)
	}
}

// anySpilled reports whether a cached held job has ops left in PostgreSQL.
func anySpilled(p *Projector) bool {
	b := p.budget
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.spilled > 0
}

// TestATinyCacheGivesTheSameRowsAsTheDefault: one stream of large
// snapshots (2.5 KB states), counter jobs and held gaps, projected once
// with the default --cache-bytes and once with a budget of a few jobs:
// the rows are identical, state for state.
func TestATinyCacheGivesTheSameRowsAsTheDefault(t *testing.T) {
	t.Parallel()
	pad := strings.Repeat("p", 2500)
	build := func() []rec {
		var recs []rec
		for _, id := range jobIDs("big", 300) {
			p := partitionOf(id, 2)
			for _, v := range []int64{2, 1, 3} {
				recs = append(recs, rec{p, id, snap(id, v, fmt.Sprintf(`{"v":%d,"pad":%q}`, v, pad))})
			}
			recs = append(recs, rec{p, id, dlt(id, 4, `[{"op":"set","path":"/after","value":4}]`)})
		}
		for _, id := range jobIDs("gap", 100) {
			p := partitionOf(id, 2)
			inc := func(v int64) string {
				return dlt(id, v, fmt.Sprintf(`[{"op":"increment","path":"/count","by":%d},{"op":"set","path":"/last","value":%d}]`, v, v))
			}
			// 4 and 5 arrive ahead of 2 and 3: held, then released.
			recs = append(recs, rec{p, id, snap(id, 1, counterStateOf(1))}, rec{p, id, inc(4)}, rec{p, id, inc(5)},
				rec{p, id, inc(2)}, rec{p, id, inc(3)})
		}
		return recs
	}
	project := func(cacheBytes int64) map[string]store.Job {
		r := newRig(t, 2)
		r.produce(build()...)
		run := r.start(r.config(func(c *Config) {
			c.CacheBytes = cacheBytes
			c.BatchSize = 50
			c.GapWait, c.GapWaitOff = time.Hour, false
		}))
		r.caughtUp(60*time.Second, run)
		r.eventually(10*time.Second, "no job held", func() (bool, string) {
			n := run.p.Status().Counters.HeldJobs
			return n == 0, fmt.Sprintf("%d held", n)
		})
		run.halt(t)
		return r.rows()
	}
	big := project(DefaultCacheBytes)
	tiny := project(3000)
	require.Len(t, big, 400)
	require.Equal(t, len(big), len(tiny))
	for id, row := range big {
		require.Equal(t, row.Version, tiny[id].Version, id)
		require.JSONEq(t, string(row.State), string(tiny[id].State), id)
	}
	require.JSONEq(t, counterStateOf(5), string(big["gap-0000"].State))
}

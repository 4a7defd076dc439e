package projection

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/gapfill"
)

// TestACachedJobIsReadBackAsItWasPut: a job's row, event id, last ops and
// held deltas come back from the cache as they were put, whether its held
// deltas keep their ops or are spilled; an append to the row's bytes that
// a caller makes does not reach the bytes cached after them; a job put
// back unchanged keeps sharing the cached bytes.
func TestACachedJobIsReadBackAsItWasPut(t *testing.T) {
	c := newJobCache(newCacheBudget(DefaultCacheBytes))
	since := time.Now()
	row := gapfill.Job{ID: "job-1", Version: 4, Raw: []byte(`{"a":1}`), EventID: "evt-4", LastOps: []byte(`[{"op":"set","path":"/a","value":1}]`)}
	c.put(row)
	got, ok := c.get("job-1")
	require.True(t, ok)
	require.Equal(t, row, got)

	appended := append(got.Raw, `,"x"`...)
	again, _ := c.peek("job-1")
	require.Equal(t, `{"a":1}`, string(again.Raw))
	require.Equal(t, "evt-4", again.EventID, "an append to the row's bytes wrote over the event id")
	require.Equal(t, `{"a":1},"x"`, string(appended))

	c.put(again)
	shared, _ := c.peek("job-1")
	require.Same(t, &again.Raw[0], &shared.Raw[0], "a job put back unchanged must share the cached bytes")

	held := gapfill.Job{ID: "job-2", Version: 1, Raw: []byte(`{}`), EventID: "evt-1", Held: map[int64]gapfill.Held{
		3: {Input: gapfill.Input{Event: heldEvent("job-2", 3), Partition: 1, Offset: 30}, Since: since},
		5: {Input: gapfill.Input{Event: heldEvent("job-2", 5), Partition: 1, Offset: 50}, Since: since},
	}}
	c.put(held)
	got, _ = c.get("job-2")
	require.Equal(t, held, got, "held deltas with their ops")

	spilledJob := held
	spilledJob.Held = spill(held.Held)
	c.put(spilledJob)
	got, _ = c.get("job-2")
	require.Equal(t, spilledJob, got, "held deltas whose ops are in PostgreSQL")
	require.True(t, spilled(got))
	require.Nil(t, got.Held[3].Event.RawOps)
	require.Equal(t, "evt-job-2-5", got.Held[5].Event.EventID)
	require.Equal(t, int64(50), got.Held[5].Offset)

	// A held delta filed under another version than its own is kept as
	// given, not filed again under its own.
	odd := gapfill.Job{ID: "job-3", Version: 1, Raw: []byte(`{}`), Held: spill(map[int64]gapfill.Held{
		5: {Input: gapfill.Input{Event: heldEvent("job-3", 7)}, Since: since},
	})}
	c.put(odd)
	got, _ = c.get("job-3")
	require.Equal(t, odd, got)

	c.forget("job-2")
	_, ok = c.peek("job-2")
	require.True(t, ok, "a held job is not forgotten")
}

// TestTheCacheEvictsTheLeastRecentlyUsedFirst: with room for about ten
// jobs, a job read before each put stays while the others go, oldest
// first, and held jobs are never evicted.
func TestTheCacheEvictsTheLeastRecentlyUsedFirst(t *testing.T) {
	job := func(i int) gapfill.Job {
		return gapfill.Job{ID: fmt.Sprintf("job-%d", i), Version: 1, Raw: []byte(`{"n":1}`)}
	}
	b := newCacheBudget(10 * jobBytes(job(0)))
	c := newJobCache(b)
	c.put(gapfill.Job{ID: "held", Version: 1, Raw: []byte(`{}`), Held: map[int64]gapfill.Held{
		3: {Input: gapfill.Input{Event: heldEvent("held", 3)}, Since: time.Now()},
	}})
	c.put(job(0))
	for i := 1; i < 100; i++ {
		_, ok := c.get("job-0")
		require.True(t, ok, "job-0 was read before every put and must stay (put %d)", i)
		c.put(job(i))
	}
	_, ok := c.peek("held")
	require.True(t, ok)
	for i := 1; i < 100; i++ {
		_, ok := c.peek(fmt.Sprintf("job-%d", i))
		require.Equal(t, i >= 100-b.lruLen+1, ok, "job-%d: only the most recent jobs stay (%d in the list)", i, b.lruLen)
	}
	require.Less(t, b.lruLen, 10)
	require.Greater(t, b.lruLen, 5)
}

// TestACachedJobCostsTheCollectorFewObjects: the collector's work follows
// the objects it marks, and at a million jobs it was most of the
// projector's CPU; a cached row is at most four heap objects (entry,
// bytes, map slot and the map's growth), a job whose held deltas are
// spilled at most six.
func TestACachedJobCostsTheCollectorFewObjects(t *testing.T) {
	const n = 20_000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("job-%07d", i)
	}
	objects := func(put func(c *jobCache, i int)) float64 {
		var before, after runtime.MemStats
		c := newJobCache(newCacheBudget(1 << 40))
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range n {
			put(c, i)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(c)
		return float64(after.HeapObjects-before.HeapObjects) / n
	}
	rows := objects(func(c *jobCache, i int) {
		c.put(gapfill.Job{ID: string([]byte(ids[i])), Version: 3, Raw: []byte(`{"count":3,"status":"running"}`),
			EventID: fmt.Sprintf("evt-%d", i), LastOps: []byte(`[{"op":"increment","path":"/count","by":1}]`)})
	})
	t.Logf("%.2f objects a cached row", rows)
	require.LessOrEqual(t, rows, 4.0)
	since := time.Now()
	held := objects(func(c *jobCache, i int) {
		id := string([]byte(ids[i]))
		c.put(gapfill.Job{ID: id, Version: 3, Raw: []byte(`{"count":3}`), EventID: fmt.Sprintf("evt-%d", i), Held: spill(map[int64]gapfill.Held{
			5: {Input: gapfill.Input{Event: heldEvent(id, 5), Offset: 5}, Since: since},
			6: {Input: gapfill.Input{Event: heldEvent(id, 6), Offset: 6}, Since: since},
		})})
	})
	t.Logf("%.2f objects a job with two spilled held deltas", held)
	require.LessOrEqual(t, held, 6.0)
}

package projection

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/internal/testkit/pgtest"
)

// TestStatusWithFiftyThousandHeldJobsIsBounded: with 50,000 jobs held (an
// authority down), /status answers under 1 MiB, at the default limit and
// at the largest, at a bounded memory cost: the partition keeps its
// MaxHeldLimit oldest held jobs for the status, not one entry for each,
// and a request allocates a few MiB at most. Before, the answer was 16 MB
// and one request allocated 137 MB. The counts stay whole, the list is
// the oldest first, and the next page follows the first.
func TestStatusWithFiftyThousandHeldJobsIsBounded(t *testing.T) {
	const n = 50_000
	p, err := New(Config{Brokers: []string{"127.0.0.1:9"}, Store: pgtest.Store(t)})
	require.NoError(t, err)
	w := &worker{workerDeps: p.workerDeps(), partition: 3, cache: newJobCache(newCacheBudget(DefaultCacheBytes)),
		detector: gapfill.NewDetector(gapfill.Policy{Wait: time.Hour})}
	t0 := time.Now().Add(-time.Hour)
	for i := range n {
		id := fmt.Sprintf("job-%06d", i)
		w.cache.put(gapfill.Job{ID: id, Version: 1, Raw: []byte(`{}`), Held: map[int64]gapfill.Held{
			3: {Input: gapfill.Input{Event: heldEvent(id, 3)}, Since: t0}}})
		// Held in an order that is not the jobs' order: job i began to
		// wait at t0 + (n-i) ms, so the last job is the oldest.
		w.detector.Hold(id, t0.Add(time.Duration(n-i)*time.Millisecond))
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	w.publish()
	runtime.GC()
	runtime.ReadMemStats(&after)
	kept := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("publish: %d B allocated, %d B kept", after.TotalAlloc-before.TotalAlloc, kept)
	require.Len(t, w.heldView, MaxHeldLimit, "the status view keeps one entry for each held job")
	require.Less(t, kept, int64(1<<20))

	h := p.Handler()
	get := func(query string) (*Status, int, uint64) {
		var a, b runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&a)
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/status"+query, nil))
		runtime.ReadMemStats(&b)
		require.Equal(t, http.StatusOK, rr.Code, rr.Body.String())
		var s Status
		require.NoError(t, json.Unmarshal(rr.Body.Bytes(), &s))
		return &s, rr.Body.Len(), b.TotalAlloc - a.TotalAlloc
	}
	first, size, allocated := get("")
	t.Logf("/status: %d B, %d B allocated", size, allocated)
	require.Less(t, size, 1<<20)
	require.Less(t, allocated, uint64(4<<20))
	require.Equal(t, int64(n), first.Counters.HeldJobs)
	require.Len(t, first.Partitions, 1)
	ps := first.Partitions[0]
	require.Equal(t, n, ps.HeldJobs)
	require.Len(t, ps.Held, DefaultHeldLimit)
	require.Equal(t, HeldPage{Limit: DefaultHeldLimit, Listed: DefaultHeldLimit, Omitted: n - DefaultHeldLimit,
		Next: first.HeldPage.Next, Beyond: n - MaxHeldLimit}, first.HeldPage)
	require.NotEmpty(t, first.HeldPage.Next)
	for i, j := range ps.Held {
		require.Equal(t, fmt.Sprintf("job-%06d", n-1-i), j.JobID, "oldest first")
		require.Equal(t, []int64{2}, j.Missing)
	}

	second, _, _ := get("?held_after=" + url.QueryEscape(first.HeldPage.Next))
	require.Equal(t, fmt.Sprintf("job-%06d", n-1-DefaultHeldLimit), second.Partitions[0].Held[0].JobID, "the next page follows")
	require.Len(t, second.Partitions[0].Held, DefaultHeldLimit)

	most, size, allocated := get(fmt.Sprintf("?held_limit=%d", MaxHeldLimit))
	t.Logf("/status?held_limit=%d: %d B, %d B allocated", MaxHeldLimit, size, allocated)
	require.Less(t, size, 1<<20)
	require.Less(t, allocated, uint64(8<<20))
	require.Len(t, most.Partitions[0].Held, MaxHeldLimit)
	// The partition keeps no more: no page can follow, and the answer
	// says how many it cannot list.
	require.Empty(t, most.HeldPage.Next)
	require.Equal(t, int64(n-MaxHeldLimit), most.HeldPage.Beyond)
}

// TestStatusRefusesABadHeldQuery: a limit out of range or a cursor no
// status gave is answered 400, saying what is wrong.
func TestStatusRefusesABadHeldQuery(t *testing.T) {
	t.Parallel()
	p, err := New(Config{Brokers: []string{"127.0.0.1:9"}, Store: pgtest.Store(t)})
	require.NoError(t, err)
	for q, want := range map[string]string{
		"held_limit=0":         "held_limit",
		"held_limit=1001":      "from 1 to 1000",
		"held_limit=ten":       "held_limit",
		"held_after=not-a-key": "held_after",
	} {
		rr := httptest.NewRecorder()
		p.Handler().ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/status?"+q, nil))
		require.Equal(t, http.StatusBadRequest, rr.Code, q)
		require.Contains(t, rr.Body.String(), want, q)
	}
}

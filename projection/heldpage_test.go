package projection

import (
	"encoding/json"
	"errors"
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

// TestHeldPagesAcrossPartitions: the list is one order across
// partitions, by when each job began to wait, then partition, then job;
// pages follow each other without a gap or a repeat; and a partition that
// holds more jobs than it keeps ends the list at the youngest it keeps,
// since younger ones of its own are not known.
func TestHeldPagesAcrossPartitions(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	view := func(partition int, secs ...int) []HeldJob {
		var out []HeldJob
		for i, s := range secs {
			out = append(out, HeldJob{JobID: fmt.Sprintf("p%d-%02d%c", partition, s, 'a'+i), Since: t0.Add(time.Duration(s) * time.Second)})
		}
		return sortHeld(partition, out)
	}
	parts := func() []PartitionStatus {
		return []PartitionStatus{
			{Partition: 0, HeldJobs: 4, view: view(0, 1, 4, 4, 9), viewOf: 4},
			{Partition: 1, HeldJobs: 3, view: view(1, 2, 4, 7), viewOf: 3},
			{Partition: 2, HeldJobs: 0, view: nil},
		}
	}
	var order []string
	q := HeldQuery{Limit: 3}
	for page := 0; ; page++ {
		ps := parts()
		pg, err := pageHeld(ps, q)
		require.NoError(t, err)
		require.Equal(t, int64(7-pg.Listed), pg.Omitted)
		var listed []HeldJob
		for _, p := range ps {
			require.NotNil(t, p.Held, "an empty list is [], not null")
			listed = append(listed, p.Held...)
		}
		require.Len(t, listed, pg.Listed)
		sortAll(listed)
		for _, j := range listed {
			order = append(order, j.JobID)
		}
		if pg.Next == "" {
			require.Equal(t, 2, page)
			break
		}
		q.After = pg.Next
	}
	require.Equal(t, []string{"p0-01a", "p1-02a", "p0-04b", "p0-04c", "p1-04b", "p1-07c", "p0-09d"}, order)

	// Partition 0 holds 10 jobs but keeps its 4 oldest: the list stops at
	// the youngest of them (9 s), and p1-12 cannot be listed yet.
	ps := []PartitionStatus{
		{Partition: 0, HeldJobs: 10, view: view(0, 1, 3, 5, 9), viewOf: 10},
		{Partition: 1, HeldJobs: 2, view: view(1, 2, 12), viewOf: 2},
	}
	pg, err := pageHeld(ps, HeldQuery{Limit: 100})
	require.NoError(t, err)
	require.Equal(t, 5, pg.Listed)
	require.Equal(t, int64(6), pg.Beyond)
	require.Equal(t, int64(7), pg.Omitted)
	require.Empty(t, pg.Next)
	require.Len(t, ps[1].Held, 1)

	for _, q := range []HeldQuery{{Limit: -1}, {Limit: MaxHeldLimit + 1}, {After: "%%"}, {After: "bm90LWEta2V5"}} {
		_, err := pageHeld(parts(), q)
		require.True(t, errors.Is(err, errHeldQuery), "%+v: %v", q, err)
	}
}

// sortAll sorts jobs of several partitions by heldKey; their ids name
// their partition.
func sortAll(jobs []HeldJob) {
	partition := func(j HeldJob) int {
		var p int
		_, _ = fmt.Sscanf(j.JobID, "p%d-", &p)
		return p
	}
	for i := 1; i < len(jobs); i++ {
		for k := i; k > 0 && keyOf(partition(jobs[k]), jobs[k]).before(keyOf(partition(jobs[k-1]), jobs[k-1])); k-- {
			jobs[k], jobs[k-1] = jobs[k-1], jobs[k]
		}
	}
}

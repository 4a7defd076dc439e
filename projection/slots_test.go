package projection

import (
	"context"
	"math"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// With one batch allowed in flight, four partitions that all have records
// never plan and write two batches at once, and the model is exact; the
// same stream with four allowed does overlap batches, so the count seen is
// the bound at work and not the stream's pace.
func TestBatchesInFlightBoundsTheBatchesHeldAtOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		inFlight int
		overlap  bool
	}{{1, false}, {4, true}} {
		r := newRig(t, 4)
		s := newStream(4)
		for _, id := range jobIDs("counter", 80) {
			s.increments(id, 5)
		}
		s.flush(r)
		var now, most atomic.Int32
		hook := applyHook(func(int) {
			n := now.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			// Long enough for every partition's worker to reach its
			// own batch meanwhile, if nothing stops it.
			time.Sleep(50 * time.Millisecond)
			now.Add(-1)
		})
		run := r.start(r.config(func(c *Config) { c.BatchesInFlight = tc.inFlight; c.BatchSize = 20 }, hook))
		r.caughtUp(60*time.Second, run)
		r.requireModel(s)
		if tc.overlap {
			require.Greater(t, most.Load(), int32(1), "with %d allowed, batches of different partitions overlap", tc.inFlight)
		} else {
			require.Equal(t, int32(1), most.Load(), "one batch at a time")
		}
		require.LessOrEqual(t, most.Load(), int32(tc.inFlight))
	}
}

// With one batch slot, partition 1's batch waits for partition 0's, which
// waits on a row lock within its time limit: the waiting partition keeps
// its beat and is not found stalled, and both commit once the lock goes.
func TestWaitingForABatchSlotBehindASlowBatchIsNotAStall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRig(t, 2)
	p, logs, done := runLogged(t, r, time.Second, func(c *Config) { c.BatchesInFlight = 1 })

	r.produce(rec{0, "slow", snap("slow", 1, `{"n":1}`)}, rec{1, "other", snap("other", 1, `{"n":1}`)})
	r.caughtUp(20*time.Second, &running{p: p})
	tx := lockRow(t, r, "slow")
	r.produce(rec{0, "slow", snap("slow", 2, `{"n":2}`)})
	r.eventually(20*time.Second, "partition 0's batch waits on the lock", func() (bool, string) {
		return strings.Contains(logs.String(), "batch transaction still running"), "not yet"
	})
	r.produce(rec{1, "other", snap("other", 2, `{"n":2}`)})
	r.eventually(30*time.Second, "partition 1 has waited for its slot for three stall timeouts", func() (bool, string) {
		return strings.Contains(logs.String(), "running_for=4s"), "not that long yet"
	})
	select {
	case err := <-done:
		t.Fatalf("Run ended while a partition waited for a slot behind a batch within its limit: %v\n%s", err, logs.String())
	default:
	}
	require.NotContains(t, logs.String(), "partition stalled")
	for _, c := range p.Liveness().Checks {
		if c.Name == "partition 1 worker" || c.Name == "progress" {
			require.True(t, c.OK, "/healthz while partition 1 waits for a slot: %+v", c)
		}
	}
	require.Equal(t, int64(1), r.rows()["other"].Version, "partition 1's batch waited for the slot")
	require.NoError(t, tx.Rollback(ctx))
	r.caughtUp(20*time.Second, &running{p: p})
	require.Equal(t, int64(2), r.rows()["slow"].Version)
	require.Equal(t, int64(2), r.rows()["other"].Version)
}

// A wait for a slot is bounded only while it is a wait, and only while
// every holder took its slot within the limit; no slots bound nothing.
func TestASlotWaitIsBoundedOnlyWhileItsHoldersAre(t *testing.T) {
	t.Parallel()
	var none *batchSlots
	h, ok := none.acquire(t.Context(), 0, func() {}, time.Second, time.Second)
	require.True(t, ok)
	none.release(0, h)
	require.False(t, none.bounded(0, time.Now(), time.Second))

	s := newBatchSlots(1)
	now := time.Now()
	require.False(t, s.bounded(1, now, time.Minute), "not waiting")
	held, ok := s.acquire(t.Context(), 0, func() {}, time.Second, time.Minute)
	require.True(t, ok)
	s.waiting.Store(1, &slotToken{at: now})
	require.True(t, s.bounded(1, now, time.Minute), "waiting behind a holder within its limit")
	require.False(t, s.bounded(1, now.Add(2*time.Minute), time.Minute), "the holder is past its limit: a wedge, not a wait")
	s.waiting.Delete(1)

	// A waiter beats while bounded and takes the slot once it is free.
	var beats atomic.Int32
	got := make(chan *slotToken)
	go func() {
		h, _ := s.acquire(t.Context(), 1, func() { beats.Add(1) }, 10*time.Millisecond, time.Minute)
		got <- h
	}()
	require.Eventually(t, func() bool { return beats.Load() >= 2 }, 10*time.Second, 5*time.Millisecond, "the waiter keeps its beat")
	s.release(0, held)
	h = <-got
	require.NotNil(t, h)
	s.release(1, h)
	_, holding := s.holding.Load(1)
	require.False(t, holding)
}

// TestBatchesInFlightDefaultsToTwoACPUAtLeastEight: left at zero, the
// bound is two batches for each CPU the process may use, at least 8 and at
// most 32; -1 is no bound; below that is refused.
func TestBatchesInFlightDefaultsToTwoACPUAtLeastEight(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	// No memory limit, whatever GOMEMLIMIT says: under one the default
	// is sized to it (TestBatchesInFlightFitTheMemoryLimit).
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	for procs, want := range map[int]int{1: 8, 4: 8, 6: 12, 16: 32, 64: 32} {
		runtime.GOMAXPROCS(procs)
		require.Equal(t, want, DefaultBatchesInFlight(), "GOMAXPROCS %d", procs)
	}
	want := DefaultBatchesInFlight()
	require.Equal(t, want, Config{}.WithDefaults().BatchesInFlight)
	require.Equal(t, want, DefaultBatchesInFlight())
	require.Equal(t, 3, Config{BatchesInFlight: 3}.WithDefaults().BatchesInFlight)
	require.Equal(t, -1, Config{BatchesInFlight: -1}.WithDefaults().BatchesInFlight)
	require.Nil(t, newBatchSlots(-1), "-1 bounds nothing")
	require.Equal(t, want, cap(newBatchSlots(Config{}.WithDefaults().BatchesInFlight).ch))
	require.ErrorContains(t, Config{BatchesInFlight: -2}.Validate(), "batches-in-flight: -2")
}

// TestBatchesInFlightFitTheMemoryLimit: under a soft memory limit the
// default bound is the batches that fit in what the limit leaves beyond
// the cache, 9 KiB a record, from 2 up to the default without a limit;
// WithDefaults reads the process's limit.
func TestBatchesInFlightFitTheMemoryLimit(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4)) // default without a limit: 8
	const MiB = 1 << 20
	for _, tc := range []struct {
		limit, cache int64
		batch, want  int
	}{
		{208 * MiB, 64 * MiB, 5000, 3},     // the default outside a container
		{435 * MiB, 64 * MiB, 5000, 8},     // 85% of a 512 MiB pod: the default's 8
		{300 * MiB, 64 * MiB, 5000, 5},     // 236 MiB / 43.9 MiB
		{208 * MiB, 64 * MiB, 10000, 2},    // rebuild's batches: at least 2
		{64 * MiB, 256 * MiB, 5000, 2},     // a cache above the limit: still 2
		{math.MaxInt64, 64 * MiB, 5000, 8}, // no limit
		{0, 64 * MiB, 5000, 8},             // none given
		{64 << 30, 64 * MiB, 5000, 8},      // a large limit: no more than without
		{DefaultMemoryLimit(64 * MiB), 64 * MiB, 5000, 3},
	} {
		require.Equal(t, tc.want, BatchesInFlightWithin(tc.limit, tc.cache, tc.batch), "limit %d MiB, cache %d MiB, batch %d", tc.limit/MiB, tc.cache/MiB, tc.batch)
	}
	require.Equal(t, int64(208*MiB), DefaultMemoryLimit(DefaultCacheBytes))

	defer debug.SetMemoryLimit(debug.SetMemoryLimit(208 * MiB))
	require.Equal(t, 3, Config{}.WithDefaults().BatchesInFlight, "the process's limit sizes the default")
	require.Equal(t, 2, Config{BatchSize: 10000}.WithDefaults().BatchesInFlight)
	require.Equal(t, 4, Config{CacheBytes: 16 * MiB}.WithDefaults().BatchesInFlight, "a smaller cache leaves more to batches: 192 MiB / 43.9 MiB")
	require.Equal(t, 6, Config{BatchesInFlight: 6}.WithDefaults().BatchesInFlight, "a bound given is kept")
	require.Equal(t, -1, Config{BatchesInFlight: -1}.WithDefaults().BatchesInFlight)
}

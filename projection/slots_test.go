package projection

import (
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

package projection

import (
	"context"
	"runtime"
)

// DefaultBatchesInFlight is the default of [Config.BatchesInFlight]: two
// batches a core and two more, so that on a small machine every partition of
// a usual topic has its own, and only an instance of many partitions is
// bounded. Fewer hold less memory but lengthen the tail of the latency under
// load: a partition whose records wait for a slot waits for another
// partition's transaction (docs/performance.md measures both).
func DefaultBatchesInFlight() int {
	return 2*runtime.GOMAXPROCS(0) + 2
}

// batchSlots bounds the batches an instance holds at once between planning
// and settling. A batch of 5,000 records holds about 15 MB while it is
// planned and written (its records decoded, the rows it read, the states it
// encodes, pgx's encoded statement): unbounded, an instance of 64
// partitions that all fall behind at once would hold 64 of them. Waiting for
// a slot is waiting for another batch's transaction, so no partition waits
// long, and none waits while it holds one.
type batchSlots chan struct{}

func newBatchSlots(n int) batchSlots { return make(batchSlots, max(n, 1)) }

// acquire takes a slot, false if ctx ended first.
func (s batchSlots) acquire(ctx context.Context) bool {
	select {
	case s <- struct{}{}:
		return true
	default:
	}
	select {
	case s <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (s batchSlots) release() { <-s }

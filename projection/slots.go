package projection

import (
	"context"
	"runtime"
)

// DefaultBatchesInFlight is the default of [Config.BatchesInFlight]: one
// batch a core planning or waiting on its statement, and one more so that a
// core is not idle while a batch's transaction commits.
func DefaultBatchesInFlight() int {
	return max(2, runtime.GOMAXPROCS(0)+1)
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

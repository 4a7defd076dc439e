package projection

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/store"
)

// TestHoldStoredLeavesCachedHeldSetsUnchanged: a job taken from the cache
// for a gap attempt shares its held set with the cache while the attempt
// runs on another goroutine. Held rows adopted later for the same job (an
// SQS instance adopting what others left, without a reset) must give the
// cache a new held set, never write into the one the attempt reads: that
// would be a concurrent map write, which the runtime aborts the process
// for.
func TestHoldStoredLeavesCachedHeldSetsUnchanged(t *testing.T) {
	w := &worker{cache: newJobCache(newCacheBudget(DefaultCacheBytes)), detector: gapfill.NewDetector(gapfill.Policy{Wait: time.Hour})}
	since := time.Now()
	rows := map[string]store.Job{}
	ops := []byte(`[{"op":"set","path":"/a","value":1}]`)
	require.NoError(t, w.holdStored([]store.Held{{JobID: "j", Version: 3, Ops: ops, Since: since}}, rows))

	attempt, ok := w.cache.get("j")
	require.True(t, ok)
	require.Len(t, attempt.Held, 1)

	// The attempt reads its held set while more held rows are adopted.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				for range attempt.Held {
				}
			}
		}
	})
	var adopted []store.Held
	for v := int64(4); v < 200; v++ {
		adopted = append(adopted, store.Held{JobID: "j", Version: v, Ops: ops, Since: since})
	}
	err := w.holdStored(adopted, rows)
	close(stop)
	wg.Wait()
	require.NoError(t, err)

	require.Equal(t, 1, len(attempt.Held), "adopting held rows wrote into the held set an attempt was given")
	now, ok := w.cache.get("j")
	require.True(t, ok)
	require.Equal(t, 197, len(now.Held), "the cache lost adopted held rows")
}

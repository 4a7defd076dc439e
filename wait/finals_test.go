package wait

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
)

// TestFinalReadsHandOver: waits ending in a steady stream are read
// together, and the first reader hands the queue over after a few
// queries rather than reading for ever: every wait is answered, with
// what was read for it, including those that took the lead over.
func TestFinalReadsHandOver(t *testing.T) {
	t.Parallel()
	w, err := New(Config{Store: pgtest.Store(t)})
	require.NoError(t, err)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	var answered, read atomic.Int64
	var wg sync.WaitGroup
	for range 200 {
		wg.Go(func() {
			for range 20 {
				wt := &waiter{byJob: true, job: "x", version: 1, done: make(chan struct{})}
				if _, err := w.reread(ended, wt); err != nil {
					t.Error(err)
				}
				answered.Add(1)
				w.mu.Lock()
				if wt.state.JobID == "x" {
					read.Add(1)
				}
				w.mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Equal(t, int64(4000), answered.Load())
	require.Equal(t, int64(4000), read.Load(), "every wait was read")
	w.finals.mu.Lock()
	defer w.finals.mu.Unlock()
	require.Positive(t, w.finals.handovers, "a steady stream of ends outlasts one reader's rounds")
	t.Logf("4000 waits ended in a stream: the lead was handed over %d times", w.finals.handovers)
}

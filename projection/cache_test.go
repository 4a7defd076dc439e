package projection

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestATinyCacheChangesNothingButSpeed: the per-partition job cache is an
// optimisation only. With room for three jobs it is emptied over and over
// while batches load rows, and every job must still end exact: no delta
// applied twice or skipped, no snapshot lost.
func TestATinyCacheChangesNothingButSpeed(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2)
	s := newStream(2)
	for _, id := range jobIDs("counter", 40) {
		s.increments(id, 6)
	}
	for _, id := range jobIDs("snap", 40) {
		s.snapshots(id, 1, 3, 2, 5, 4)
	}
	s.scramble(rand.New(rand.NewPCG(7, 7)))
	half := s.flush(r)
	run := r.start(r.config(func(c *Config) { c.CacheBytes = 2000; c.BatchSize = 37 }))
	r.caughtUp(30*time.Second, run)
	for _, id := range jobIDs("counter", 40) {
		s.increments(id, 4)
	}
	rest := s.flush(r)
	r.caughtUp(30*time.Second, run)
	r.requireModel(s)
	c := run.p.Status().Counters
	require.Equal(t, int64(half+rest), c.Consumed)
	require.Zero(t, c.Duplicates+c.Conflicts+c.Quarantined, "%+v", c)
}

package projection

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// partitionsOf lists the partitions a projector reports working.
func partitionsOf(run *running) []int {
	var out []int
	for _, ps := range run.p.Status().Partitions {
		out = append(out, ps.Partition)
	}
	return out
}

// Two engines in one group split a six-partition topic; when one stops,
// the other takes every partition over and the model ends exact, with
// every record committed once across the two.
func TestTwoEnginesSplitThePartitionsAndOneTakesOverWhenTheOtherStops(t *testing.T) {
	t.Parallel()
	const parts = 6
	r := newRig(t, parts)
	rng := rand.New(rand.NewPCG(6, 2))
	s := newStream(parts)
	jobs := jobIDs("grp", 300)
	counters := jobIDs("grp-counter", 60)

	a := r.start(r.config(func(c *Config) { c.Owner = "a"; c.BatchSize = 40 }))
	b := r.start(r.config(func(c *Config) { c.Owner = "b"; c.BatchSize = 40 }))
	r.eventually(20*time.Second, "the two engines split the partitions", func() (bool, string) {
		pa, pb := partitionsOf(a), partitionsOf(b)
		why := fmt.Sprintf("a %v, b %v", pa, pb)
		if len(pa) == 0 || len(pb) == 0 {
			return false, why
		}
		all := append(slices.Clone(pa), pb...)
		slices.Sort(all)
		return slices.Equal(all, []int{0, 1, 2, 3, 4, 5}), why
	})

	// Wave 1 with both engines working.
	for _, job := range jobs {
		s.snapshots(job, 1, 2, 3)
	}
	for _, job := range counters {
		s.increments(job, 4)
	}
	s.scramble(rng)
	s.flush(r)
	r.caughtUp(30*time.Second, a, b)
	r.requireModel(s)
	owners := map[string]bool{}
	for _, pos := range r.positions() {
		owners[pos.Owner] = true
	}
	require.Equal(t, map[string]bool{"a": true, "b": true}, owners, "each engine holds the claim of some partitions")
	require.Positive(t, a.p.Status().Counters.Consumed, "a worked its share")
	require.Positive(t, b.p.Status().Counters.Consumed, "b worked its share")

	// Wave 2, and a stops while it may be in the middle of it.
	for _, job := range jobs {
		s.snapshots(job, 6, 4, 5)
	}
	for _, job := range counters {
		s.increments(job, 4)
	}
	s.scramble(rng)
	s.flush(r)
	a.halt(t)
	r.eventually(20*time.Second, "b works all six partitions", func() (bool, string) {
		pb := partitionsOf(b)
		return slices.Equal(pb, []int{0, 1, 2, 3, 4, 5}), fmt.Sprintf("b %v", pb)
	})

	// Wave 3 for b alone.
	for i, job := range jobs {
		if i%3 == 0 {
			s.snapshots(job, 7, 2)
		}
	}
	for _, job := range jobIDs("grp-late", 60) {
		s.snapshots(job, 3, 1, 2)
	}
	for _, job := range counters {
		s.increments(job, 4)
	}
	s.scramble(rng)
	s.flush(r)
	r.caughtUp(30*time.Second, b)

	r.requireModel(s)
	r.requirePositionsAtEnd()
	for p, pos := range r.positions() {
		require.Equal(t, "b", pos.Owner, "partition %d", p)
	}
	ca, cb := a.p.Status().Counters, b.p.Status().Counters
	produced := int64(s.produced)
	require.Equal(t, produced, ca.Consumed+cb.Consumed, "every record committed once across the engines: a %+v, b %+v", ca, cb)
	require.Equal(t, produced, ca.Applied+ca.Stale+cb.Applied+cb.Stale)
	require.Zero(t, ca.Conflicts+cb.Conflicts+ca.Quarantined+cb.Quarantined)
}

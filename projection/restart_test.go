package projection

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A projector that stopped is followed by a new one in the same group on
// the same store: the new one starts at the stored positions, so across the
// two runs every record is read and committed exactly once (and the counter
// jobs' increments each land once).
func TestRestartBetweenWavesResumesAtTheStoredPositions(t *testing.T) {
	t.Parallel()
	const parts = 3
	r := newRig(t, parts)
	rng := rand.New(rand.NewPCG(7, 7))
	s := newStream(parts)
	jobs := jobIDs("wave", 300)
	counters := jobIDs("wave-counter", 30)
	for _, job := range jobs {
		s.snapshots(job, 1, 2, 3)
	}
	for _, job := range counters {
		s.increments(job, 5)
	}
	s.scramble(rng)
	wave1 := int64(s.flush(r))

	a := r.start(r.config(func(c *Config) { c.BatchSize = 50; c.Owner = "a" }))
	r.caughtUp(30*time.Second, a)
	a.halt(t)
	ca := a.p.Status().Counters
	require.Equal(t, wave1, ca.Consumed, "%+v", ca)
	r.requirePositionsAtEnd()
	epochsA := map[int]int64{}
	for p, pos := range r.positions() {
		epochsA[p] = pos.Epoch
	}

	// Wave 2: newer versions for half the jobs, old versions again for
	// the other half (stale), and new jobs.
	for i, job := range jobs {
		if i%2 == 0 {
			s.snapshots(job, 4, 5)
		} else {
			s.snapshots(job, 2)
		}
	}
	for _, job := range jobIDs("late", 50) {
		s.snapshots(job, 2, 1)
	}
	for _, job := range counters {
		s.increments(job, 4)
	}
	s.scramble(rng)
	wave2 := int64(s.flush(r))

	b := r.start(r.config(func(c *Config) { c.BatchSize = 50; c.Owner = "b" }))
	r.caughtUp(30*time.Second, b)
	r.requireModel(s)
	r.requirePositionsAtEnd()
	cb := b.p.Status().Counters
	require.Equal(t, wave2, cb.Consumed, "the new projector read wave 2 only: %+v", cb)
	require.Equal(t, wave1+wave2, ca.Consumed+cb.Consumed)
	require.Equal(t, wave1+wave2, ca.Applied+ca.Stale+cb.Applied+cb.Stale)
	for p, pos := range r.positions() {
		require.Equal(t, "b", pos.Owner)
		require.Greater(t, pos.Epoch, epochsA[p], "partition %d: b's claim fences a", p)
	}
}

// A projector stopped in the middle of the log, with batches in flight, is
// followed by a new one: the batches the first committed are not read
// again, the ones it abandoned are, and the final model is exact.
func TestRestartMidStreamReadsEveryRecordExactlyOnce(t *testing.T) {
	t.Parallel()
	const parts, batch, pauseAt = 2, 20, 6
	r := newRig(t, parts)
	rng := rand.New(rand.NewPCG(11, 3))
	s := newStream(parts)
	for _, job := range jobIDs("mid", 400) {
		s.snapshots(job, versions(1, 2+rng.Int64N(3))...)
	}
	for _, job := range jobIDs("mid-counter", 40) {
		s.increments(job, 8)
	}
	s.scramble(rng)
	produced := int64(s.flush(r))

	// From the pauseAt-th batch on, every commit waits until the test
	// has cancelled the projector; the batches already fetched then
	// commit (a batch whose work is done is finished at shutdown) and
	// the workers return.
	var calls atomic.Int32
	paused := make(chan struct{})
	var pauseOnce sync.Once
	mayCommit := newGate(t)
	hook := applyHook(func(int) {
		if calls.Add(1) >= pauseAt {
			pauseOnce.Do(func() { close(paused) })
			<-mayCommit.ch
		}
	})
	a := r.start(r.config(func(c *Config) { c.BatchSize = batch; c.Owner = "a" }, hook))
	t.Cleanup(mayCommit.open)
	waitClosed(t, paused, 20*time.Second, "the projector reaches its pause")
	a.stop()
	mayCommit.open()
	a.halt(t)

	ca := a.p.Status().Counters
	hwm := r.highWatermarks()
	var stored int64
	for p, pos := range r.positions() {
		require.Less(t, pos.NextOffset, hwm[p], "partition %d: a stopped before the end", p)
		stored += max(pos.NextOffset, 0)
	}
	require.Positive(t, ca.Consumed, "%+v", ca)
	require.Equal(t, stored, ca.Consumed, "a's committed batches are exactly its stored positions: %+v", ca)

	b := r.start(r.config(func(c *Config) { c.BatchSize = batch; c.Owner = "b" }))
	r.caughtUp(30*time.Second, b)
	r.requireModel(s)
	r.requirePositionsAtEnd()
	cb := b.p.Status().Counters
	require.Equal(t, produced, ca.Consumed+cb.Consumed, "every record read once across the runs: a %+v, b %+v", ca, cb)
	require.Equal(t, produced, ca.Applied+ca.Stale+cb.Applied+cb.Stale)
}

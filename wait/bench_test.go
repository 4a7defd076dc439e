package wait_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
	"github.com/projector/projector/wait"
)

// BenchmarkApplyWhileWaiting is the cost of waiters to the projection:
// batches of 500 snapshots committed with no waiter held, and with 10,000
// held on jobs the batches never reach (each commit wakes them all and
// reads them again, on the same PostgreSQL). The two run in alternating
// rounds of 20 batches (after 5 unmeasured, while the new waiters are
// read for the first time), so the machine's load falls on both alike; it
// reports each one's median time per batch.
//
//	go test -run XXX -bench ApplyWhileWaiting -benchtime 10x ./wait/
func BenchmarkApplyWhileWaiting(b *testing.B) {
	const waiters, perRound, warmUp = 10_000, 20, 5
	r := newRig(b, wait.Config{MaxWaiters: waiters})
	state := json.RawMessage(`{"status":"running","processed":1}`)
	version := int64(0)
	apply := func() time.Duration {
		version++
		batch := &store.Batch{Topic: "t", Partition: 0, Epoch: r.epoch}
		for j := range 500 {
			batch.Snapshots = append(batch.Snapshots, store.Write{JobID: fmt.Sprintf("job-%d", j), Version: version, State: state, Offset: r.next})
			r.next++
		}
		batch.NextOffset = r.next
		start := time.Now()
		if _, err := r.writer.Apply(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	hold := func() (release func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{}, waiters)
		for i := range waiters {
			go func() {
				_, _ = r.waiter.WaitJob(ctx, fmt.Sprintf("never-%d", i), 1)
				done <- struct{}{}
			}()
		}
		require.Eventually(b, func() bool { return r.waiter.Waiting() == waiters }, time.Minute, 10*time.Millisecond)
		return func() {
			cancel()
			for range waiters {
				<-done
			}
		}
	}
	var without, with []time.Duration
	for range b.N {
		for range perRound {
			without = append(without, apply())
		}
		release := hold()
		for range warmUp {
			apply() // while the new waiters' first reads finish
		}
		for range perRound {
			with = append(with, apply())
		}
		release()
	}
	slices.Sort(without)
	slices.Sort(with)
	b.ReportMetric(float64(without[len(without)/2].Microseconds())/1000, "ms/batch-no-waiters")
	b.ReportMetric(float64(with[len(with)/2].Microseconds())/1000, "ms/batch-10k-waiters")
	b.ReportMetric(float64(with[len(with)/2])/float64(without[len(without)/2]), "ratio")
}

// BenchmarkCommitsWithAndWithoutNotify is what announcing batches costs
// the projection: 4 writers commit batches of 10 snapshots to partitions
// of their own as fast as they can, in alternating rounds of 2s with no
// lease held (nothing announced: the default when no process serves
// waits) and with a lease held (every batch announced, as while any
// instance serves /wait or a Go Waiter runs). PostgreSQL serializes the
// commits of notifying transactions on one lock, which is what this
// measures; it reports each mode's commits per second over all rounds.
//
//	go test -run XXX -bench CommitsWithAndWithoutNotify -benchtime 3x ./wait/
func BenchmarkCommitsWithAndWithoutNotify(b *testing.B) {
	const writers, perBatch, round = 4, 10, 2 * time.Second
	ctx := context.Background()
	s := pgtest.Store(b)
	epochs := make([]int64, writers)
	for i := range writers {
		c, err := s.Claim(ctx, "t", i, "bench")
		require.NoError(b, err)
		epochs[i] = c.Epoch
	}
	state := json.RawMessage(`{"status":"running","processed":1}`)
	next := make([]int64, writers)
	version := make([]int64, writers)
	run := func() (commits int) {
		var wg sync.WaitGroup
		counts := make([]int, writers)
		deadline := time.Now().Add(round)
		for i := range writers {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					version[i]++
					batch := &store.Batch{Topic: "t", Partition: i, Epoch: epochs[i]}
					for j := range perBatch {
						batch.Snapshots = append(batch.Snapshots, store.Write{JobID: fmt.Sprintf("p%d-job-%d", i, j),
							Version: version[i], State: state, Offset: next[i]})
						next[i]++
					}
					batch.NextOffset = next[i]
					if _, err := s.Apply(ctx, batch); err != nil {
						b.Error(err)
						return
					}
					counts[i]++
				}
			})
		}
		wg.Wait()
		for _, n := range counts {
			commits += n
		}
		return commits
	}
	var off, on int
	for range b.N {
		off += run()
		require.NoError(b, s.HoldWaitLease(ctx, "bench", time.Hour))
		on += run()
		require.NoError(b, s.ReleaseWaitLease(ctx, "bench"))
	}
	secs := (time.Duration(b.N) * round).Seconds()
	b.ReportMetric(float64(off)/secs, "commits/s-not-announced")
	b.ReportMetric(float64(on)/secs, "commits/s-announced")
	b.ReportMetric(float64(on)/float64(off), "ratio")
}

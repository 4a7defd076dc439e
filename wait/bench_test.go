package wait_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
}

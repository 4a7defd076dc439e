package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/pgtest"
	"github.com/projector/projector/store"
)

// A committed batch is announced once on the projection's channel with
// its position and a filter that passes every job it wrote or held and
// few others; a rolled-back batch (fenced) is not announced.
func TestCommittedBatchIsAnnounced(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := s.Listen(ctx)
	require.NoError(t, err)
	defer l.Close(context.Background())
	c, err := s.Claim(ctx, "t", 2, "me")
	require.NoError(t, err)

	for _, n := range []int{1, 500, 5000} {
		b := &store.Batch{Topic: "t", Partition: 2, Epoch: c.Epoch, NextOffset: int64(n)}
		for i := range n {
			b.Snapshots = append(b.Snapshots, store.Write{JobID: fmt.Sprintf("w%d-%d", n, i), Version: 1, State: json.RawMessage(`{}`)})
		}
		b.Hold = []store.Held{{JobID: fmt.Sprintf("h%d", n), Version: 3, Partition: 2, Ops: json.RawMessage(`[]`), Since: time.Now()}}
		_, err = s.Apply(ctx, b)
		require.NoError(t, err)

		payload, err := l.Next(ctx)
		require.NoError(t, err)
		require.Less(t, len(payload), 8000)
		var notice store.Notice
		require.NoError(t, json.Unmarshal([]byte(payload), &notice))
		require.Equal(t, "t", notice.Topic)
		require.Equal(t, 2, notice.Partition)
		require.Equal(t, int64(n), notice.NextOffset)
		for _, w := range b.Snapshots {
			require.True(t, notice.MayHaveChanged(store.HashJob(w.JobID)), w.JobID)
		}
		require.True(t, notice.MayHaveChanged(store.HashJob(b.Hold[0].JobID)))
		passed := 0
		for i := range 10_000 {
			if notice.MayHaveChanged(store.HashJob(fmt.Sprintf("other-%d", i))) {
				passed++
			}
		}
		t.Logf("batch of %d jobs: payload %d bytes, %d of 10000 other jobs pass the filter", n+1, len(payload), passed)
		require.Less(t, passed, 1000)
	}

	_, err = s.Claim(ctx, "t", 2, "other") // fences c
	require.NoError(t, err)
	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Partition: 2, Epoch: c.Epoch, NextOffset: 9000})
	require.ErrorIs(t, err, store.ErrFenced)
	quiet, stop := context.WithTimeout(ctx, 100*time.Millisecond)
	defer stop()
	_, err = l.Next(quiet)
	require.ErrorIs(t, err, context.DeadlineExceeded, "a batch rolled back is not announced")
}

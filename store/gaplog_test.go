package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// TestGapLogWrittenWithTheBatchAndPruned: a batch that closes a gap writes
// its gap log row with the attempts its held rows counted; pruning keeps to
// the age and row bounds, batch by batch, and spares other projections.
func TestGapLogWrittenWithTheBatchAndPruned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.Store(t)
	claim, err := s.Claim(ctx, "t", 0, "me")
	require.NoError(t, err)
	since := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: claim.Epoch, NextOffset: 2,
		Snapshots: []store.Write{{JobID: "j", Version: 1, State: []byte(`{}`)}},
		Hold:      []store.Held{{JobID: "j", Version: 3, Partition: 0, Offset: 1, Ops: []byte(`[]`), Since: since}}})
	require.NoError(t, err)
	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: claim.Epoch, NextOffset: 2,
		Attempts: []store.Attempt{{JobID: "j", Step: "snapshot", Err: "404"}}})
	require.NoError(t, err)
	ex, err := s.Explain(ctx, "j", 10)
	require.NoError(t, err)
	require.Len(t, ex.Held, 1)
	require.Equal(t, 1, ex.Held[0].Attempts)
	require.Equal(t, "snapshot", ex.Held[0].LastStep)
	require.Equal(t, "404", ex.Held[0].LastError)
	require.Equal(t, []int64{2}, ex.Waiting)

	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: claim.Epoch, NextOffset: 3,
		Updates: []store.Write{{JobID: "j", Version: 3, State: []byte(`{"a":1}`), Expect: 1}},
		Release: []store.HeldKey{{JobID: "j", Version: 3}},
		Gaps:    []store.GapClosed{{JobID: "j", Opened: since, Step: "reread", From: 1, To: 3, Held: []int64{3}}}})
	require.NoError(t, err)
	ex, err = s.Explain(ctx, "j", 10)
	require.NoError(t, err)
	require.Empty(t, ex.Held)
	require.Len(t, ex.Gaps, 1)
	g := ex.Gaps[0]
	require.Equal(t, "reread", g.Step)
	require.Equal(t, []int64{3}, g.Held)
	require.Equal(t, 1, g.Attempts, "the attempts the held rows counted")
	require.True(t, g.Opened.Equal(since), "%s", g.Opened)
	require.Equal(t, int64(1), g.From)
	require.Equal(t, int64(3), g.To)

	// 9 more rows, 4 of them old; and one row of another projection.
	table := pgx.Identifier{s.Schema(), "projector_gap_log"}.Sanitize()
	for i := range 9 {
		age := "0"
		if i < 4 {
			age = "2 hours"
		}
		_, err := s.Pool().Exec(ctx, `INSERT INTO `+table+` (projection, job_id, opened_at, closed_at, step, from_version, to_version)
			VALUES ('jobs', $1, now(), now() - $2::interval, 'wait', 1, 2)`, fmt.Sprint("k", i), age)
		require.NoError(t, err)
	}
	_, err = s.Pool().Exec(ctx, `INSERT INTO `+table+` (projection, job_id, opened_at, closed_at, step, from_version, to_version)
		VALUES ('other', 'x', now(), now() - interval '3 hours', 'wait', 1, 2)`)
	require.NoError(t, err)
	count := func() (n int) {
		require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE projection = 'jobs'`).Scan(&n))
		return n
	}
	n, err := s.PruneGapLog(ctx, time.Hour, 0, 3)
	require.NoError(t, err)
	require.Equal(t, int64(4), n, "the old rows, in batches of 3")
	require.Equal(t, 6, count())
	n, err = s.PruneGapLog(ctx, time.Hour, 2, 3)
	require.NoError(t, err)
	require.Equal(t, int64(4), n)
	require.Equal(t, 2, count())
	var other int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE projection = 'other'`).Scan(&other))
	require.Equal(t, 1, other, "another projection's rows are its own to prune")
}

package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// The SQL waits answer true once the batch that reaches them commits,
// false at their timeout, and survive the migration running again.
func TestSQLWaitFunctions(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx := context.Background()
	require.NoError(t, s.Migrate(ctx), "idempotent")
	c, err := s.Claim(ctx, "t", 0, "me")
	require.NoError(t, err)
	pool := pgtest.Pool(t)
	waitJob := func(job string, version int64, timeoutMS int) (bool, error) {
		var ok bool
		err := pool.QueryRow(ctx, `SELECT `+pgx.Identifier{s.Schema()}.Sanitize()+`.projector_wait_job($1, $2, $3, $4)`, s.Projection(), job, version, timeoutMS).Scan(&ok)
		return ok, err
	}
	waitPos := func(offset int64, timeoutMS int) (bool, error) {
		var ok bool
		err := pool.QueryRow(ctx, `SELECT `+pgx.Identifier{s.Schema()}.Sanitize()+`.projector_wait_position($1, 't', 0, $2, $3)`, s.Projection(), offset, timeoutMS).Scan(&ok)
		return ok, err
	}

	ok, err := waitJob("x", 1, 20)
	require.NoError(t, err)
	require.False(t, ok, "no row: the timeout ends it")
	ok, err = waitPos(0, 20)
	require.NoError(t, err)
	require.False(t, ok)

	type answer struct {
		ok  bool
		err error
		at  time.Time
	}
	job, pos := make(chan answer, 1), make(chan answer, 1)
	go func() { ok, err := waitJob("x", 2, 10_000); job <- answer{ok, err, time.Now()} }()
	go func() { ok, err := waitPos(1, 10_000); pos <- answer{ok, err, time.Now()} }()
	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: c.Epoch, NextOffset: 2,
		Snapshots: []store.Write{{JobID: "x", Version: 2, State: json.RawMessage(`{}`)}}})
	require.NoError(t, err)
	committed := time.Now()
	a := <-job
	require.NoError(t, a.err)
	require.True(t, a.ok)
	b := <-pos
	require.NoError(t, b.err)
	require.True(t, b.ok)
	t.Logf("answered %s and %s after the commit returned", a.at.Sub(committed), b.at.Sub(committed))

	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: c.Epoch, NextOffset: 3,
		Deletes: []store.Write{{JobID: "x", Version: 5, Deleted: true}}})
	require.NoError(t, err)
	ok, err = waitJob("x", 5, 0)
	require.NoError(t, err)
	require.True(t, ok, "a delete at the version reaches it")
}

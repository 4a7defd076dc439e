package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
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
	require.NoError(t, s.HoldWaitLease(ctx, "waiter", time.Minute))
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

// quiet asserts that nothing is announced on l for a moment.
func quiet(t *testing.T, ctx context.Context, l *store.Listener, why string) {
	t.Helper()
	q, stop := context.WithTimeout(ctx, 100*time.Millisecond)
	defer stop()
	payload, err := l.Next(q)
	require.ErrorIs(t, err, context.DeadlineExceeded, "%s: heard %s", why, payload)
}

// Writes are announced only while a waiter's lease is live or the store
// announces always (Config.Notify): a projection no one waits on takes
// no notification lock at commit. The lease of another process (another
// store, as another instance has) counts; a released or expired one does
// not.
func TestWritesAreAnnouncedOnlyWhileLeasedOrAlways(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := s.Listen(ctx)
	require.NoError(t, err)
	defer l.Close(context.Background())
	c, err := s.Claim(ctx, "t", 0, "me")
	require.NoError(t, err)
	next := int64(0)
	apply := func(st *store.Store) {
		next++
		_, err := st.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: c.Epoch, NextOffset: next,
			Snapshots: []store.Write{{JobID: "x", Version: next, State: json.RawMessage(`{}`)}}})
		require.NoError(t, err)
	}
	heard := func(why string) {
		t.Helper()
		payload, err := l.Next(ctx)
		require.NoError(t, err, why)
		var n store.Notice
		require.NoError(t, json.Unmarshal([]byte(payload), &n))
		require.Equal(t, next, n.NextOffset, why)
	}

	apply(s)
	quiet(t, ctx, l, "no lease, no --notify")

	other, err := store.New(pgtest.Pool(t), store.Config{Schema: s.Schema(), Table: s.Projection()})
	require.NoError(t, err)
	require.NoError(t, other.HoldWaitLease(ctx, "elsewhere", time.Minute))
	apply(s)
	heard("another process's lease")
	require.NoError(t, other.ReleaseWaitLease(ctx, "elsewhere"))
	apply(s)
	quiet(t, ctx, l, "the lease released")

	require.NoError(t, other.HoldWaitLease(ctx, "brief", time.Millisecond))
	require.Eventually(t, func() bool {
		var live bool
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.Schema()+
			`.projector_wait_leases WHERE expires_at > now())`).Scan(&live))
		return !live
	}, 5*time.Second, time.Millisecond)
	apply(s)
	quiet(t, ctx, l, "the lease expired")

	always, err := store.New(pgtest.Pool(t), store.Config{Schema: s.Schema(), Table: s.Projection(), Notify: true})
	require.NoError(t, err)
	apply(always)
	heard("Notify")
}

// A position moved outside the batches (a new log, an operator's reset,
// a first claim storing its start) is announced with the partition and
// its new position, and no job in its filter.
func TestPositionsMovedOutsideBatchesAreAnnounced(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, s.HoldWaitLease(ctx, "waiter", time.Minute))
	l, err := s.Listen(ctx)
	require.NoError(t, err)
	defer l.Close(context.Background())
	heard := func(why string, p int, next int64) {
		t.Helper()
		payload, err := l.Next(ctx)
		require.NoError(t, err, why)
		var n store.Notice
		require.NoError(t, json.Unmarshal([]byte(payload), &n))
		require.Equal(t, store.Notice{Topic: "t", Partition: p, NextOffset: next, Jobs: n.Jobs}, n, why)
		require.False(t, n.MayHaveChanged(store.HashJob("x")), why)
	}

	c, err := s.ClaimFrom(ctx, "t", 1, "me", 40)
	require.NoError(t, err)
	require.Equal(t, int64(40), c.NextOffset)
	heard("a claim storing its start (--start latest)", 1, 40)
	_, err = s.ClaimFrom(ctx, "t", 1, "me", 70)
	require.NoError(t, err)
	quiet(t, ctx, l, "a claim of a partition with a position stores nothing")

	c, err = s.Claim(ctx, "t", 1, "me")
	require.NoError(t, err)
	_, err = s.MoveToLog(ctx, "t", 1, c.Epoch, 55, false)
	require.NoError(t, err)
	heard("MoveToLog", 1, 55)

	_, err = s.ResetPosition(ctx, "t", 2, 9, "operator", false)
	require.NoError(t, err)
	heard("ResetPosition", 2, 9)
}

// A lease the server refuses for good (a role that may not write the
// table) is a *LeaseRefusedError, and the listening connection goes on;
// a connection the server terminated (an operator, a restart) is not a
// refusal, though the server said it: the waiter must listen again and
// hold its lease there, not give the lease up for the process's life.
func TestALeaseRefusalIsOnlyTheServersLastingNo(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	role, dmlURL := pgtest.DMLRole(t, s.Schema())
	_, err := pgtest.Pool(t).Exec(ctx, `REVOKE INSERT, UPDATE, DELETE ON `+s.Schema()+`.projector_wait_leases FROM `+role)
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, dmlURL)
	require.NoError(t, err)
	defer pool.Close()
	reader, err := store.New(pool, store.Config{Schema: s.Schema(), Table: s.Projection()})
	require.NoError(t, err)
	l, err := reader.Listen(ctx)
	require.NoError(t, err)
	defer l.Close(context.Background())
	var refused *store.LeaseRefusedError
	require.ErrorAs(t, l.HoldWaitLease(ctx, "reader", time.Minute), &refused)
	require.NoError(t, l.Ping(ctx), "a refusal leaves the connection usable")

	l2, err := s.Listen(ctx)
	require.NoError(t, err)
	defer l2.Close(context.Background())
	var pid int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN "' || $1 || '"'
		AND usename = current_user`, s.Channel()).Scan(&pid))
	_, err = pgtest.Pool(t).Exec(ctx, `SELECT pg_terminate_backend($1, 10000)`, pid)
	require.NoError(t, err)
	err = l2.HoldWaitLease(ctx, "waiter", time.Minute)
	require.Error(t, err)
	require.False(t, errors.As(err, &refused), "a terminated connection is no refusal: %v", err)
}

package store_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// freezer stops a connection's client right after a statement whose text
// contains match has run on the server (or the pipeline holding it), until
// thaw: from PostgreSQL's side the client is frozen inside its open
// transaction.
type freezer struct {
	match    string
	once     sync.Once
	thawOnce sync.Once
	frozen   chan struct{}
	thawed   chan struct{}
}

func newFreezer(match string) *freezer {
	return &freezer{match: match, frozen: make(chan struct{}), thawed: make(chan struct{})}
}

func (f *freezer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, f.match) {
		return context.WithValue(ctx, f, true)
	}
	return ctx
}

func (f *freezer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(f) == nil {
		return
	}
	first := false
	f.once.Do(func() { first = true; close(f.frozen) })
	if first {
		<-f.thawed
	}
}

// A statement sent in a pipeline (pgx.Batch) is traced as a batch query;
// the client freezes once the whole pipeline has run.
func (f *freezer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return context.WithValue(ctx, batchMatch{f}, new(bool))
}

func (f *freezer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	if matched, ok := ctx.Value(batchMatch{f}).(*bool); ok && strings.Contains(data.SQL, f.match) {
		*matched = true
	}
}

func (f *freezer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchEndData) {
	if matched, ok := ctx.Value(batchMatch{f}).(*bool); ok && *matched {
		f.TraceQueryEnd(context.WithValue(ctx, f, true), conn, pgx.TraceQueryEndData{})
	}
}

// batchMatch keys, in a batch's context, whether one of its statements
// matched.
type batchMatch struct{ f *freezer }

func (f *freezer) thaw() { f.thawOnce.Do(func() { close(f.thawed) }) }

// poolWith is a pool of its own whose connections carry tracer.
func poolWith(t *testing.T, tracer pgx.QueryTracer) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// An owner frozen inside its batch transaction, after the fence took the
// partition row's lock, cannot hold the partition for ever: a claim waits
// at most ClaimLockTimeout per attempt and says whose transaction it waits
// for; PostgreSQL ends the frozen transaction once idle past
// IdleInTransactionTimeout (set for the batch's transaction alone), the
// claim then succeeds, and the frozen owner's batch lands nothing.
func TestFrozenOwnerInsideABatchReleasesThePartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	f := newFreezer("SET next_offset")
	frozen, err := store.New(poolWith(t, f), store.Config{Schema: schema, IdleInTransactionTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(f.thaw) // before the pool closes, which waits for the frozen connection
	require.NoError(t, frozen.Migrate(ctx))
	other, err := store.New(pgtest.Pool(t), store.Config{Schema: schema, ClaimLockTimeout: 100 * time.Millisecond})
	require.NoError(t, err)

	first, err := frozen.Claim(ctx, "t", 0, "frozen-owner")
	require.NoError(t, err)
	applied := make(chan error, 1)
	go func() {
		_, err := frozen.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: first.Epoch, NextOffset: 5,
			Snapshots: []store.Write{{JobID: "late", Version: 1, State: []byte(`{}`)}}})
		applied <- err
	}()
	select {
	case <-f.frozen:
	case <-time.After(10 * time.Second):
		t.Fatal("the batch did not reach its fence")
	}

	var waits []*store.ClaimWaitError
	var second store.Claim
	deadline := time.Now().Add(20 * time.Second)
	for {
		second, err = other.Claim(ctx, "t", 0, "next-owner")
		var w *store.ClaimWaitError
		if !errors.As(err, &w) {
			break
		}
		waits = append(waits, w)
		require.True(t, time.Now().Before(deadline), "the partition was not released within 20s")
	}
	t.Logf("claimed after %d waits", len(waits))
	require.NoError(t, err)
	require.NotEmpty(t, waits, "the claim waited for the frozen owner's transaction at least once")
	require.Equal(t, "frozen-owner", waits[0].Owner)
	require.Contains(t, waits[0].Error(), `previous owner "frozen-owner"`)
	require.Equal(t, first.Epoch+1, second.Epoch)
	require.Equal(t, int64(-1), second.NextOffset, "the frozen batch's position never committed")

	f.thaw()
	select {
	case err = <-applied:
	case <-time.After(10 * time.Second):
		t.Fatal("the thawed batch did not return")
	}
	t.Logf("thawed apply: %v", err)
	require.Error(t, err, "the server ended the frozen transaction")
	_, err = frozen.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: first.Epoch, NextOffset: 5,
		Snapshots: []store.Write{{JobID: "late", Version: 1, State: []byte(`{}`)}}})
	require.ErrorIs(t, err, store.ErrFenced, "the thawed owner's retry is fenced")
	jobs, err := other.LoadJobs(ctx, []string{"late"})
	require.NoError(t, err)
	require.Empty(t, jobs, "nothing of the frozen batch landed")
}

// A claimer frozen inside its own claim, after its write took the
// partition row and before its commit, is bounded like a batch: PostgreSQL
// ends its transaction once idle past IdleInTransactionTimeout, and the
// next claim succeeds.
func TestFrozenClaimerReleasesThePartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	f := newFreezer("DO UPDATE SET epoch")
	frozen, err := store.New(poolWith(t, f), store.Config{Schema: schema, IdleInTransactionTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(f.thaw)
	require.NoError(t, frozen.Migrate(ctx))
	other, err := store.New(pgtest.Pool(t), store.Config{Schema: schema, ClaimLockTimeout: 100 * time.Millisecond})
	require.NoError(t, err)

	claimed := make(chan error, 1)
	go func() {
		_, err := frozen.Claim(ctx, "t", 0, "frozen-claimer")
		claimed <- err
	}()
	select {
	case <-f.frozen:
	case <-time.After(10 * time.Second):
		t.Fatal("the claim did not reach its write")
	}

	var waits int
	var second store.Claim
	deadline := time.Now().Add(20 * time.Second)
	for {
		second, err = other.Claim(ctx, "t", 0, "next-owner")
		var w *store.ClaimWaitError
		if !errors.As(err, &w) {
			break
		}
		waits++
		require.True(t, time.Now().Before(deadline), "the frozen claim still holds the partition after 20s")
	}
	require.NoError(t, err)
	require.Positive(t, waits, "the claim waited for the frozen claimer at least once")
	require.Equal(t, int64(1), second.Epoch, "the frozen claim never committed")

	f.thaw()
	select {
	case err = <-claimed:
	case <-time.After(10 * time.Second):
		t.Fatal("the thawed claim did not return")
	}
	require.Error(t, err, "the server ended the frozen claim's transaction")
}

package projection

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// applyHook gives one instance a hook that runs before each of its batch
// commits (with the partition), for r.config.
func applyHook(hook func(partition int)) func(*Config) {
	return func(c *Config) { c.testBeforeApply = hook }
}

// gate is a channel closed once, by the test or by its cleanup, so a hook
// blocked on it never outlives a failed test.
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate(t *testing.T) *gate {
	g := &gate{ch: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

// A second owner claims the partition between a worker's fetch and its
// commit. The worker's batch is rejected by the fence in PostgreSQL and
// nothing of it lands; the worker stops, its generation ends, the group
// rejoins and the engine claims the partition again under a newer epoch,
// reads the batch again from the stored position and applies it.
func TestFencedBatchWritesNothingAndThePartitionIsReclaimed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRig(t, 1)
	s := newStream(1)
	for _, job := range jobIDs("fenced", 40) {
		s.snapshots(job, 1, 2)
	}
	for _, job := range jobIDs("fenced-counter", 10) {
		s.increments(job, 3)
	}
	produced := int64(s.flush(r))

	var calls atomic.Int32
	type claimed struct {
		claim store.Claim
		err   error
	}
	intruder := make(chan claimed, 1)
	fencedWorkerMayApply := newGate(t) // the first worker, after the intruder's claim
	reclaimed := make(chan struct{})   // the engine's next worker is about to apply
	newWorkerMayApply := newGate(t)
	hook := applyHook(func(partition int) {
		switch calls.Add(1) {
		case 1:
			c, err := r.store.Claim(ctx, r.topic, partition, "intruder")
			intruder <- claimed{c, err}
			<-fencedWorkerMayApply.ch
		case 2:
			close(reclaimed)
			<-newWorkerMayApply.ch
		}
	})
	cfg := r.config(func(c *Config) { c.Owner = "engine" }, hook)
	run := r.start(cfg)
	// Registered after start, so it runs before the halt: a hook still
	// blocked when the test fails is released first.
	t.Cleanup(fencedWorkerMayApply.open)
	t.Cleanup(newWorkerMayApply.open)

	var in claimed
	select {
	case in = <-intruder:
	case <-time.After(20 * time.Second):
		t.Fatal("no batch reached the commit within 20s")
	}
	require.NoError(t, in.err)
	st := run.p.Status()
	require.Len(t, st.Partitions, 1)
	fencedEpoch := st.Partitions[0].Epoch
	require.Equal(t, fencedEpoch+1, in.claim.Epoch, "the intruder's claim bumps the worker's epoch")
	require.Equal(t, int64(-1), in.claim.NextOffset, "nothing committed yet")
	firstGeneration := st.Generation
	fencedWorkerMayApply.open()

	waitClosed(t, reclaimed, 20*time.Second, "the engine claims the partition again and reaches a commit")
	c := run.p.Status().Counters
	require.Equal(t, int64(1), c.Fenced, "%+v", c)
	require.Zero(t, c.Consumed+c.Applied+c.Stale+c.Batches, "the fenced batch is not counted: %+v", c)
	require.Empty(t, r.rows(), "none of the fenced batch's writes landed")
	q, total, err := r.store.Quarantine(ctx, 10)
	require.NoError(t, err)
	require.Zero(t, total, "%v", q)
	pos := r.positions()[0]
	require.Equal(t, int64(-1), pos.NextOffset, "the fenced batch did not move the stored position")
	require.Equal(t, in.claim.Epoch+1, pos.Epoch, "the engine claimed again, after the intruder")
	require.Equal(t, "engine", pos.Owner)
	st = run.p.Status()
	require.Greater(t, st.Generation, firstGeneration, "the fenced worker's return ended its generation and the group rejoined")
	require.Len(t, st.Partitions, 1)
	require.Equal(t, pos.Epoch, st.Partitions[0].Epoch, "the partition is worked under the new epoch")
	newWorkerMayApply.open()

	r.caughtUp(20*time.Second, run)
	r.requireModel(s)
	r.requirePositionsAtEnd()
	pos = r.positions()[0]
	require.GreaterOrEqual(t, pos.Epoch, int64(3), "engine, intruder, engine again")
	require.Equal(t, "engine", pos.Owner)
	c = run.p.Status().Counters
	require.Equal(t, int64(1), c.Fenced, "%+v", c)
	require.Equal(t, produced, c.Consumed, "the fenced batch was read again and committed once: %+v", c)
	require.Equal(t, produced, c.Applied+c.Stale, "%+v", c)
}

// The store-level race behind the fence: a claim that arrives while an
// owner's batch transaction is open waits for that transaction's row lock.
// If the batch committed first, the claim returns its position; a batch
// that starts after the claim is fenced.
func TestClaimDuringAnOpenBatchSeesItsPositionAndFencesTheNext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A claim gives up waiting after ClaimLockTimeout (2s by default);
	// this test wants it to wait for the commit, however slow the machine.
	s, err := store.New(pgtest.Pool(t), store.Config{Schema: pgtest.Schema(t), ClaimLockTimeout: time.Minute})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	first, err := s.Claim(ctx, "t", 0, "first")
	require.NoError(t, err)

	// Hold the partition row lock the way a batch transaction does, then
	// claim from another connection while it is held.
	tx, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(ctx))
	tag, err := tx.Exec(ctx, `UPDATE `+schemaOf(s)+`.projector_partitions SET next_offset = 7
		WHERE projection = $1 AND topic = 't' AND partition = 0 AND epoch = $2`, s.Projection(), first.Epoch)
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())

	done := make(chan store.Claim, 1)
	errs := make(chan error, 1)
	go func() {
		c, err := s.Claim(ctx, "t", 0, "second")
		if err != nil {
			errs <- err
			return
		}
		done <- c
	}()
	// The claim must be waiting on the row lock: PostgreSQL shows a
	// backend of this test's schema blocked on a lock.
	(&rig{t: t}).eventually(10*time.Second, "the claim waits on the batch's row lock", func() (bool, string) {
		select {
		case c := <-done:
			t.Fatalf("claim returned %+v while the batch transaction held the row", c)
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		var waiting int
		err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, schemaOf(s)+`."projector_partitions"`).Scan(&waiting)
		if err != nil {
			return false, err.Error()
		}
		return waiting > 0, fmt.Sprintf("%d backends waiting", waiting)
	})
	require.NoError(t, tx.Commit(ctx))

	var second store.Claim
	select {
	case second = <-done:
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("claim did not return after the batch committed")
	}
	require.Equal(t, first.Epoch+1, second.Epoch)
	require.Equal(t, int64(7), second.NextOffset, "the claim sees the position the open batch committed")

	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: first.Epoch, NextOffset: 9,
		Snapshots: []store.Write{{JobID: "late", Version: 1, State: []byte(`{}`)}}})
	require.True(t, errors.Is(err, store.ErrFenced), "got %v", err)
	jobs, err := s.LoadJobs(ctx, []string{"late"})
	require.NoError(t, err)
	require.Empty(t, jobs)
}

// schemaOf is the quoted schema of the store's tables; the partitions table
// lives beside the jobs table.
func schemaOf(s *store.Store) string {
	jobs := s.JobsTable()
	i := strings.LastIndex(jobs, ".")
	if i < 0 {
		panic(fmt.Sprintf("jobs table %s is not schema-qualified", jobs))
	}
	return jobs[:i]
}

// A real zombie: engine a holds a fetched batch when b joins the group. a's
// generation ends, but its worker is still busy with the batch, so a cannot
// rejoin; the broker completes the rebalance without a after the rebalance
// timeout, b claims the partition and projects everything. When a's worker
// finally commits, the fence rejects the batch: no record is committed
// twice, and the model is b's.
func TestZombieWorkerOutlivingItsGenerationIsFenced(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	rng := rand.New(rand.NewPCG(3, 9))
	s := newStream(1)
	for _, job := range jobIDs("zombie", 100) {
		s.snapshots(job, 1, 2, 3)
	}
	for _, job := range jobIDs("zombie-counter", 10) {
		s.increments(job, 5)
	}
	s.scramble(rng)
	s.flush(r)

	var calls atomic.Int32
	zombieHolds := make(chan struct{})
	zombieMayApply := newGate(t)
	hook := applyHook(func(int) {
		if calls.Add(1) == 1 {
			close(zombieHolds)
			<-zombieMayApply.ch
		}
	})
	a := r.start(r.config(func(c *Config) { c.Owner = "a"; c.BatchSize = 50 }, hook))
	t.Cleanup(zombieMayApply.open)
	waitClosed(t, zombieHolds, 20*time.Second, "a fetches its first batch")
	zombieEpoch := a.p.Status().Partitions[0].Epoch

	b := r.start(r.config(func(c *Config) { c.Owner = "b"; c.BatchSize = 50 }))
	r.caughtUp(30*time.Second, b)
	r.requireModel(s)
	pos := r.positions()[0]
	require.Equal(t, "b", pos.Owner)
	require.Greater(t, pos.Epoch, zombieEpoch)
	require.Zero(t, a.p.Status().Counters.Consumed, "a committed nothing while it held its batch")

	zombieMayApply.open()
	r.eventually(20*time.Second, "a's batch is fenced", func() (bool, string) {
		c := a.p.Status().Counters
		return c.Fenced == 1, fmt.Sprintf("%+v", c)
	})
	ca := a.p.Status().Counters
	require.Zero(t, ca.Consumed+ca.Applied+ca.Stale+ca.Batches, "the zombie's batch is not counted: %+v", ca)
	r.requireModel(s)
	r.requirePositionsAtEnd()

	// The group settles again (a rejoins); whoever owns the partition now
	// projects the next records from the stored position.
	for _, job := range jobIDs("zombie", 100) {
		s.snapshots(job, 5, 4)
	}
	for _, job := range jobIDs("zombie-counter", 10) {
		s.increments(job, 3)
	}
	s.scramble(rng)
	s.flush(r)
	r.eventually(30*time.Second, "the stream is projected after the zombie's return", func() (bool, string) {
		hwm := r.highWatermarks()[0]
		pub := int64(-1)
		for _, e := range []*running{a, b} {
			for _, ps := range e.p.Status().Partitions {
				pub = max(pub, ps.Position)
			}
		}
		return r.positions()[0].NextOffset == hwm && pub == hwm, fmt.Sprintf("stored %d, published %d, end %d", r.positions()[0].NextOffset, pub, hwm)
	})
	r.requireModel(s)
	ca, cb := a.p.Status().Counters, b.p.Status().Counters
	require.Equal(t, int64(s.produced), ca.Consumed+cb.Consumed, "every record committed once: a %+v, b %+v", ca, cb)
	require.Equal(t, int64(1), ca.Fenced+cb.Fenced)
}

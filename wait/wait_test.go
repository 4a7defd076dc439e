package wait_test

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
	"github.com/projector/projector/wait"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("github.com/jackc/puddle/v2.(*Pool[...]).acquire.func1"))
}

// rig is a projection's store that writes, and a Waiter on a store of its
// own (another pool), as a service reading the model would have.
type rig struct {
	writer *store.Store
	waiter *wait.Waiter
	epoch  int64
	next   int64
}

func newRig(t testing.TB, cfg wait.Config) *rig {
	t.Helper()
	return newRigVia(t, cfg, pgtest.URL())
}

// newRigVia is newRig with the Waiter's pool connecting to url (a proxy
// a test cuts or freezes).
func newRigVia(t testing.TB, cfg wait.Config, url string) *rig {
	t.Helper()
	ctx := context.Background()
	writer := pgtest.Store(t)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	reader, err := store.New(pool, store.Config{Schema: writer.Schema(), Table: writer.Projection()})
	require.NoError(t, err)
	cfg.Store = reader
	w, err := wait.New(cfg)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(runCtx)
	}()
	t.Cleanup(func() { stop(); <-done })
	c, err := writer.Claim(ctx, "t", 0, "writer")
	require.NoError(t, err)
	return &rig{writer: writer, waiter: w, epoch: c.Epoch, next: 0}
}

// apply commits one batch of snapshots (job, version pairs) and held
// deltas, moving the position by one record per write.
func (r *rig) apply(t testing.TB, snaps map[string]int64, hold ...store.Held) {
	t.Helper()
	b := &store.Batch{Topic: "t", Partition: 0, Epoch: r.epoch, Hold: hold}
	for id, v := range snaps {
		b.Snapshots = append(b.Snapshots, store.Write{JobID: id, Version: v, State: json.RawMessage(`{}`), Offset: r.next})
		r.next++
	}
	r.next += int64(len(hold))
	b.NextOffset = r.next
	_, err := r.writer.Apply(context.Background(), b)
	require.NoError(t, err)
}

func TestWaitJobIsAnsweredWhenTheBatchCommits(t *testing.T) {
	t.Parallel()
	r := newRig(t, wait.Config{})
	r.apply(t, map[string]int64{"x": 1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	st, err := r.waiter.WaitJob(ctx, "x", 1)
	require.NoError(t, err, "a version already there is answered at once")
	require.True(t, st.Reached)

	type answer struct {
		st  wait.JobState
		err error
		at  time.Time
	}
	got := make(chan answer, 1)
	go func() {
		st, err := r.waiter.WaitJob(ctx, "x", 3)
		got <- answer{st, err, time.Now()}
	}()
	require.Eventually(t, func() bool { return r.waiter.Waiting() == 1 }, 5*time.Second, time.Millisecond)
	r.apply(t, map[string]int64{"y": 1}) // another job's batch wakes it, and it waits on
	r.apply(t, map[string]int64{"x": 2})
	select {
	case a := <-got:
		t.Fatalf("answered before version 3: %+v", a)
	case <-time.After(50 * time.Millisecond):
	}
	r.apply(t, map[string]int64{"x": 3})
	committed := time.Now()
	a := <-got
	require.NoError(t, a.err)
	require.True(t, a.st.Reached)
	require.Equal(t, int64(3), a.st.Version)
	require.Equal(t, []int64{}, a.st.Missing)
	t.Logf("answered %s after the commit returned", a.at.Sub(committed))
}

func TestWaitJobBehindAGapTimesOutWithTheMissingVersions(t *testing.T) {
	t.Parallel()
	r := newRig(t, wait.Config{})
	r.apply(t, map[string]int64{"x": 1}, store.Held{JobID: "x", Version: 4, Offset: 1, Ops: json.RawMessage(`[]`), Since: time.Now()})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	st, err := r.waiter.WaitJob(ctx, "x", 4)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, st.Reached)
	require.Equal(t, int64(1), st.Version)
	require.Equal(t, []int64{2, 3}, st.Missing)
}

func TestWaitJobIsAnsweredByADeleteAtOrAboveTheVersion(t *testing.T) {
	t.Parallel()
	r := newRig(t, wait.Config{})
	r.apply(t, map[string]int64{"x": 1})
	got := make(chan wait.JobState, 1)
	go func() {
		st, _ := r.waiter.WaitJob(context.Background(), "x", 2)
		got <- st
	}()
	require.Eventually(t, func() bool { return r.waiter.Waiting() == 1 }, 5*time.Second, time.Millisecond)
	_, err := r.writer.Apply(context.Background(), &store.Batch{Topic: "t", Partition: 0, Epoch: r.epoch, NextOffset: 10,
		Deletes: []store.Write{{JobID: "x", Version: 3, Deleted: true, Offset: 9}}})
	require.NoError(t, err)
	st := <-got
	require.True(t, st.Reached)
	require.True(t, st.Deleted)
	require.Equal(t, int64(3), st.Version)
}

func TestWaitPositionIsAnsweredOncePassed(t *testing.T) {
	t.Parallel()
	r := newRig(t, wait.Config{})
	got := make(chan wait.PositionState, 1)
	go func() {
		st, _ := r.waiter.WaitPosition(context.Background(), "t", 0, 1)
		got <- st
	}()
	require.Eventually(t, func() bool { return r.waiter.Waiting() == 1 }, 5*time.Second, time.Millisecond)
	r.apply(t, map[string]int64{"a": 1}) // position 1: offset 1 not passed
	select {
	case st := <-got:
		t.Fatalf("answered before the offset passed: %+v", st)
	case <-time.After(50 * time.Millisecond):
	}
	r.apply(t, map[string]int64{"b": 1})
	st := <-got
	require.True(t, st.Reached)
	require.Equal(t, int64(2), st.Position)
}

func TestTooManyWaitersAndStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	writer := pgtest.Store(t)
	w, err := wait.New(wait.Config{Store: writer, MaxWaiters: 2})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := w.WaitJob(ctx, "nobody", 1)
			errs <- err
		}()
	}
	require.Eventually(t, func() bool { return w.Waiting() == 2 }, 5*time.Second, time.Millisecond)
	_, err = w.WaitJob(ctx, "nobody", 1)
	require.ErrorIs(t, err, wait.ErrTooManyWaiters)
	stop()
	require.NoError(t, <-ran)
	for range 2 {
		require.ErrorIs(t, <-errs, wait.ErrStopped, "shutdown answers the waiters")
	}
	_, err = w.WaitJob(ctx, "nobody", 1)
	require.ErrorIs(t, err, wait.ErrStopped)
}

// TestManyWaiters holds 10,000 waiters at once, answers them with one
// batch, and reports what they cost.
func TestManyWaiters(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 waiters")
	}
	const n = 10_000
	r := newRig(t, wait.Config{MaxWaiters: n})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	goroutines := runtime.NumGoroutine()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			var err error
			if i%2 == 0 {
				_, err = r.waiter.WaitJob(ctx, "job-"+string(rune('a'+i%26)), 1)
			} else {
				_, err = r.waiter.WaitPosition(ctx, "t", 0, int64(i%5))
			}
			errs <- err
		})
	}
	require.Eventually(t, func() bool { return r.waiter.Waiting() == n }, 30*time.Second, 10*time.Millisecond)
	runtime.GC()
	runtime.ReadMemStats(&after)
	t.Logf("%d waiters: %d goroutines (their callers'; %d before), heap +%d KiB (%.0f bytes a waiter, its caller's goroutine stack apart), stacks +%d KiB",
		n, runtime.NumGoroutine(), goroutines, (int64(after.HeapAlloc)-int64(before.HeapAlloc))/1024,
		float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/n, (int64(after.StackInuse)-int64(before.StackInuse))/1024)
	snaps := map[string]int64{}
	for c := 'a'; c <= 'z'; c++ {
		snaps["job-"+string(c)] = 1
	}
	start := time.Now()
	r.apply(t, snaps)
	wg.Wait()
	t.Logf("all %d answered %s after the commit", n, time.Since(start))
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	// n waits that time out together are each answered with the state at
	// their end, read in a few queries, not one each.
	states := make(chan wait.JobState, n)
	timeout, stop := context.WithTimeout(context.Background(), 2*time.Second)
	defer stop()
	for i := range n {
		wg.Go(func() {
			st, err := r.waiter.WaitJob(timeout, "job-"+string(rune('a'+i%26)), 2)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("wait %d: %v, want the deadline", i, err)
			}
			states <- st
		})
	}
	wg.Wait()
	t.Logf("all %d timed out and answered %s after their deadline", n, time.Since(deadlineOf(timeout)))
	close(states)
	for st := range states {
		require.False(t, st.Reached)
		require.Equal(t, int64(1), st.Version)
	}
}

func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// TestWaitJobIsAnsweredByAHeal: a write outside a partition's batches
// (verify --repair) announces itself too.
func TestWaitJobIsAnsweredByAHeal(t *testing.T) {
	t.Parallel()
	r := newRig(t, wait.Config{})
	got := make(chan wait.JobState, 1)
	go func() {
		st, _ := r.waiter.WaitJob(context.Background(), "x", 2)
		got <- st
	}()
	require.Eventually(t, func() bool { return r.waiter.Waiting() == 1 }, 5*time.Second, time.Millisecond)
	applied, _, err := r.writer.Heal(context.Background(), "x", 2, json.RawMessage(`{}`), "", false)
	require.NoError(t, err)
	require.True(t, applied)
	st := <-got
	require.True(t, st.Reached)
	require.Equal(t, int64(2), st.Version)
}

// TestAWaitNoCheckReadIsReadOnceAtItsEnd: a wait that ends before any
// check read it (Run not started here) still answers where the job and
// the partition are.
func TestAWaitNoCheckReadIsReadOnceAtItsEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.Store(t)
	c, err := s.Claim(ctx, "t", 0, "me")
	require.NoError(t, err)
	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: c.Epoch, NextOffset: 5,
		Snapshots: []store.Write{{JobID: "x", Version: 2, State: json.RawMessage(`{}`)}},
		Hold:      []store.Held{{JobID: "x", Version: 4, Ops: json.RawMessage(`[]`), Since: time.Now()}}})
	require.NoError(t, err)
	w, err := wait.New(wait.Config{Store: s})
	require.NoError(t, err)
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		t.Cleanup(cancel)
		return c
	}

	st, err := w.WaitJob(short(), "x", 4)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, wait.JobState{JobState: store.JobState{JobID: "x", Version: 2, Missing: []int64{3}, Held: 1}}, st)
	st, err = w.WaitJob(short(), "x", 2)
	require.NoError(t, err, "reached, though no check ran")
	require.True(t, st.Reached)
	pos, err := w.WaitPosition(short(), "t", 0, 5)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, int64(5), pos.Position)
}

// TestALostListenerIsReplaced: the LISTEN connection cut by the server is
// opened again, and a commit made meanwhile still answers its waiter.
func TestALostListenerIsReplaced(t *testing.T) {
	t.Parallel()
	r := newRig(t, wait.Config{Retry: 50 * time.Millisecond, Poll: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := waitUnbounded(t, r, "x", 1)
	// Run may not be listening yet: cut the connection once it is (its
	// last statement is LISTEN, or the renewal of its lease).
	require.Eventually(t, func() bool {
		var cut int
		err := pgtest.Pool(t).QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE query = 'LISTEN "' || $1 || '"' OR position($2 in query) > 0`, r.writer.Channel(), leases(r)).Scan(&cut)
		require.NoError(t, err)
		require.LessOrEqual(t, cut, 1, "one listening connection for the process")
		return cut == 1
	}, 5*time.Second, 5*time.Millisecond)
	r.apply(t, map[string]int64{"x": 1})
	answered(t, got, "the lost listener is replaced")
}

// TestARebuildsSwapAnswersWaiters: the swap moves every row and position
// at once, and says so: waiters by job and by position are read again.
func TestARebuildsSwapAnswersWaiters(t *testing.T) {
	t.Parallel()
	r := newRig(t, wait.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	byJob, byPos := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := r.waiter.WaitJob(ctx, "x", 2)
		byJob <- err
	}()
	go func() {
		_, err := r.waiter.WaitPosition(ctx, "t", 0, 5)
		byPos <- err
	}()
	require.Eventually(t, func() bool { return r.waiter.Waiting() == 2 }, 5*time.Second, time.Millisecond)

	shadow, err := r.writer.Shadow()
	require.NoError(t, err)
	require.NoError(t, shadow.Reset(ctx))
	require.NoError(t, shadow.Migrate(ctx))
	sc, err := shadow.Claim(ctx, "t", 0, "rebuild")
	require.NoError(t, err)
	_, err = shadow.Apply(ctx, &store.Batch{Topic: "t", Epoch: sc.Epoch, NextOffset: 9,
		Snapshots: []store.Write{{JobID: "x", Version: 2, State: json.RawMessage(`{}`)}}})
	require.NoError(t, err)
	_, err = r.writer.Swap(ctx, shadow, false)
	require.NoError(t, err)
	require.NoError(t, <-byJob)
	require.NoError(t, <-byPos)
}

// leases is the qualified name of the leases table of r's projection.
func leases(r *rig) string {
	return `"` + r.writer.Schema() + `"."projector_wait_leases"`
}

// leased waits until r's Waiter holds its lease: it is listening.
func leased(t *testing.T, r *rig) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(), `SELECT count(*) FROM `+leases(r)).Scan(&n))
		return n == 1
	}, 10*time.Second, time.Millisecond)
}

// TestUnreadCountsTheWaitersNoCheckRead: new waiters are unread until
// the check after their arrival reads them, and stay read while they wait.
func TestUnreadCountsTheWaitersNoCheckRead(t *testing.T) {
	t.Parallel()
	// The poll an hour away: the check that reads them is the one their
	// arrival asks for.
	r := newRig(t, wait.Config{Poll: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 3)
	for _, id := range []string{"a", "b", "c"} {
		go func() {
			_, err := r.waiter.WaitJob(ctx, id, 1)
			errs <- err
		}()
	}
	require.Eventually(t, func() bool { return r.waiter.Waiting() == 3 && r.waiter.Unread() == 0 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	for range 3 {
		require.ErrorIs(t, <-errs, context.Canceled)
	}
	require.Zero(t, r.waiter.Waiting())
}

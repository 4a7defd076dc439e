package projection

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/event"
	"github.com/projector/projector/gapfill"
)

// gatedRows is a store for re-reads that answers only when let through,
// with no row moved: every re-read leaves its jobs open.
type gatedRows struct {
	asked chan []string
	gate  chan struct{}
}

func (g gatedRows) Rows(ctx context.Context, ids []string) (map[string]gapfill.Row, error) {
	g.asked <- ids
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return map[string]gapfill.Row{}, nil
}

// collectRound waits for the re-read round in flight to report and
// returns what collect gave back meanwhile.
func collectRound(t *testing.T, w *worker, a *attempts) []gapfill.Resolution {
	t.Helper()
	var res []gapfill.Resolution
	require.Eventually(t, func() bool {
		res = append(res, a.collect(w)...)
		return !a.rereading
	}, 10*time.Second, time.Millisecond, "the re-read round never reported")
	return res
}

// TestAttemptsDropWorkStartedBeforeAReset: a re-read round still running
// when the worker resets its detector (a restore after a failed batch)
// reports into a detector that no longer knows its attempt. Its result is
// dropped, the round no longer counts as running, and the job, due afresh
// in the new detector, gets an attempt of its own whose result is kept.
func TestAttemptsDropWorkStartedBeforeAReset(t *testing.T) {
	t.Parallel()
	store := gatedRows{asked: make(chan []string, 4), gate: make(chan struct{})}
	policy := gapfill.Policy{Reread: true, RetryMin: time.Hour, RetryMax: time.Hour}
	w := &worker{
		workerDeps: workerDeps{resolver: &gapfill.Resolver{Store: store}},
		detector:   gapfill.NewDetector(policy),
		cache:      newJobCache(newCacheBudget(1 << 20)),
		log:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	since := time.Now().Add(-time.Minute)
	hold := func() {
		w.cache.put(gapfill.Job{ID: "job-1", Version: 1, Raw: []byte(`{}`),
			Held: map[int64]gapfill.Held{3: {Since: since}}})
		w.detector.Hold("job-1", since)
	}
	hold()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	a := w.startAttempts(ctx, &wg)

	a.schedule(w)
	require.Equal(t, []string{"job-1"}, <-store.asked)
	require.True(t, a.busy())

	// The restore: a fresh detector that holds the job again.
	w.detector.Reset()
	a.reset()
	hold()
	store.gate <- struct{}{}
	require.Empty(t, collectRound(t, w, a), "the round taken before the reset reported into the new detector")
	g, held := w.detector.Gap("job-1")
	require.True(t, held)
	require.False(t, g.InFlight)
	require.Zero(t, g.Attempts, "the stale round ended an attempt that was not its own")

	// The job's own attempt runs and reports.
	a.schedule(w)
	require.Equal(t, []string{"job-1"}, <-store.asked)
	store.gate <- struct{}{}
	res := collectRound(t, w, a)
	require.Len(t, res, 1)
	require.Equal(t, "job-1", res[0].JobID)
	require.False(t, res[0].Closed)
	require.False(t, a.busy())
}

// TestAttemptsRouteJobsFoundSlow: a job never found slow waits for a main
// fetcher; one found slow twice in a row for a slow fetcher, whose request
// starts in the slow lane; one found slow once for either a slow fetcher
// or a main one, but a main one only when no first attempt waits for it,
// and then behind any first attempt.
func TestAttemptsRouteJobsFoundSlow(t *testing.T) {
	t.Parallel()
	w := &worker{
		detector: gapfill.NewDetector(gapfill.Policy{Snapshot: true, RetryMin: time.Hour, RetryMax: time.Hour}),
		log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	since := time.Now().Add(-time.Minute)
	for id, slow := range map[string]int{"never": 0, "once": 1, "twice": 2} {
		w.detector.Hold(id, since)
		for range slow {
			w.detector.Slow(id, true)
		}
	}
	require.Len(t, w.detector.Take(time.Now(), 10, -1), 3)
	// A pool with no fetchers running: one place in each queue.
	pool := &fetchPool{in: make(chan fetchJob, 1), retryIn: make(chan fetchJob, 1), slowIn: make(chan fetchJob, 1), main: 0, slowed: 1}
	a := &attempts{resolver: &gapfill.Resolver{}, snapshot: true, pool: pool, fetchers: 10,
		ctx: context.Background(), out: make(chan finished, 10)}
	for _, id := range []string{"never", "once", "twice"} {
		a.queue(w, gapfill.Attempt{Job: gapfill.Job{ID: id}, Res: gapfill.Resolution{JobID: id}})
	}

	a.schedule(w)
	main := <-pool.in
	require.Equal(t, "never", main.att.Job.ID)
	require.False(t, main.slow)
	require.False(t, main.retry)
	slow := <-pool.slowIn
	require.Equal(t, "twice", slow.att.Job.ID)
	require.True(t, slow.slow, "a job found slow twice did not start in the slow lane")
	require.Len(t, a.pendingLow, 1, "a job found slow once took a main fetcher another attempt was waiting for")

	// With no attempt waiting for a main fetcher, the job found slow once
	// takes one.
	a.schedule(w)
	require.Empty(t, pool.in)
	require.Len(t, pool.retryIn, 1)
	job := <-pool.retryIn
	require.Equal(t, "once", job.att.Job.ID)
	require.False(t, job.slow)
	require.True(t, job.retry)
	require.Empty(t, a.pendingLow)
	require.Equal(t, 3, a.fetching)
}

// TestAttemptsKeepJobsCutByTheirTimeoutInTheSlowLane: a job whose request
// was cut by its timeout is asked next with twice the time, by a slow
// fetcher only (its request starts in the slow lane), even when a main
// fetcher is idle, and still after a later request of it failed otherwise;
// a job never cut gets the configured time in the main lane.
func TestAttemptsKeepJobsCutByTheirTimeoutInTheSlowLane(t *testing.T) {
	t.Parallel()
	w := &worker{
		detector: gapfill.NewDetector(gapfill.Policy{Snapshot: true, RetryMin: time.Hour, RetryMax: time.Hour,
			SnapshotTimeout: 5 * time.Second, SnapshotTimeoutMax: 2 * time.Minute}),
		log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	since := time.Now().Add(-time.Minute)
	for _, id := range []string{"never", "cut", "cut-then-503"} {
		w.detector.Hold(id, since)
	}
	for _, id := range []string{"cut", "cut-then-503"} {
		w.detector.Slow(id, true)
		w.detector.TimedOut(id)
	}
	w.detector.Slow("cut-then-503", false)
	require.Len(t, w.detector.Take(time.Now(), 10, -1), 3)
	pool := &fetchPool{in: make(chan fetchJob, 3), retryIn: make(chan fetchJob, 3), slowIn: make(chan fetchJob, 3), main: 0, slowed: 1}
	a := &attempts{resolver: &gapfill.Resolver{}, snapshot: true, pool: pool, fetchers: 10,
		ctx: context.Background(), out: make(chan finished, 10)}
	for _, id := range []string{"never", "cut", "cut-then-503"} {
		a.queue(w, gapfill.Attempt{Job: gapfill.Job{ID: id}, Res: gapfill.Resolution{JobID: id}})
	}
	a.schedule(w)
	a.schedule(w)

	require.Len(t, pool.in, 1)
	require.Empty(t, pool.retryIn, "a job cut by its timeout took a main fetcher")
	main := <-pool.in
	require.Equal(t, "never", main.att.Job.ID)
	require.False(t, main.slow)
	require.Equal(t, 5*time.Second, main.timeout)
	require.Len(t, pool.slowIn, 2)
	for _, id := range []string{"cut", "cut-then-503"} {
		job := <-pool.slowIn
		require.Equal(t, id, job.att.Job.ID)
		require.True(t, job.slow, "%s did not start in the slow lane", id)
		require.Equal(t, 10*time.Second, job.timeout, "%s: the time after one cut", id)
	}
	require.Empty(t, a.pendingLow)
	require.Empty(t, a.pendingSlow)
}

// orderedSource records the jobs it is asked for, in order; "gate" waits
// to be let through.
type orderedSource struct {
	mu    sync.Mutex
	asked []string
	gate  chan struct{}
}

func (s *orderedSource) Fetch(ctx context.Context, jobID string) (event.Event, error) {
	s.mu.Lock()
	s.asked = append(s.asked, jobID)
	s.mu.Unlock()
	if jobID == "gate" {
		<-s.gate
	}
	return event.Event{}, errors.New("no snapshot (test)")
}

// TestFetchPoolTakesFirstAttemptsBeforeRetries: a main fetcher that frees
// up takes a job never asked before one asked already, whichever was
// queued first.
func TestFetchPoolTakesFirstAttemptsBeforeRetries(t *testing.T) {
	t.Parallel()
	src := &orderedSource{gate: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	pool := startFetchPool(ctx, &wg, &gapfill.Resolver{Snapshots: src}, 1, 0, nil)
	out := make(chan finished, 4)
	job := func(id string, retry bool) fetchJob {
		return fetchJob{ctx: ctx, att: gapfill.Attempt{Job: gapfill.Job{ID: id}, Res: gapfill.Resolution{JobID: id}}, out: out, retry: retry}
	}
	require.True(t, pool.offer(job("gate", false)))
	require.Eventually(t, func() bool { src.mu.Lock(); defer src.mu.Unlock(); return len(src.asked) == 1 }, 10*time.Second, time.Millisecond)
	require.True(t, pool.offer(job("retry", true)))
	require.True(t, pool.offer(job("first", false)))
	close(src.gate)
	for range 3 {
		<-out
	}
	require.Equal(t, []string{"gate", "first", "retry"}, src.asked)
}

// TestAttemptsFirstAttemptsPassRetriesWaitingForRoom: a job never asked
// goes to the authority ahead of the retries of jobs already asked, in the
// worker's queue as in the pool's: with the pool's queue of retries full,
// a first attempt behind retries in the worker's queue still takes the
// free place in the queue of first attempts, and the retries keep their
// order.
func TestAttemptsFirstAttemptsPassRetriesWaitingForRoom(t *testing.T) {
	t.Parallel()
	w := &worker{
		detector: gapfill.NewDetector(gapfill.Policy{Snapshot: true, RetryMin: time.Millisecond, RetryMax: time.Millisecond}),
		log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	// The retries were held, asked once and failed long before the first
	// attempt was held: they are due first.
	long := time.Now().Add(-time.Hour)
	for _, id := range []string{"retry-1", "retry-2"} {
		w.detector.Hold(id, long)
	}
	require.Len(t, w.detector.Take(long, 2, -1), 2)
	for _, id := range []string{"retry-1", "retry-2"} {
		w.detector.Failed(id, long, gapfill.StepSnapshot, "503 (test)")
	}
	w.detector.Hold("first", time.Now().Add(-time.Minute))
	ids := w.detector.Take(time.Now(), 10, -1)
	require.Equal(t, []string{"retry-1", "retry-2", "first"}, ids, "the retries are due first")

	// A pool with no fetchers running: one place in each queue.
	pool := &fetchPool{in: make(chan fetchJob, 1), retryIn: make(chan fetchJob, 1), slowIn: make(chan fetchJob, 1), main: 0, slowed: 1}
	a := &attempts{resolver: &gapfill.Resolver{}, snapshot: true, pool: pool, fetchers: 10,
		ctx: context.Background(), out: make(chan finished, 10)}
	for _, id := range ids {
		a.queue(w, gapfill.Attempt{Job: gapfill.Job{ID: id}, Res: gapfill.Resolution{JobID: id}})
	}
	a.schedule(w)
	require.Len(t, pool.retryIn, 1)
	require.Equal(t, "retry-1", (<-pool.retryIn).att.Job.ID)
	require.Len(t, pool.in, 1, "the first attempt waited behind a retry with no room")
	require.Equal(t, "first", (<-pool.in).att.Job.ID)
	require.Len(t, a.pending, 1)
	require.Equal(t, "retry-2", a.pending[0].Job.ID)
	require.Equal(t, 2, a.fetching)

	// Room for a retry again: the one left goes next.
	a.schedule(w)
	require.Equal(t, "retry-2", (<-pool.retryIn).att.Job.ID)
	require.Empty(t, a.pending)
}

package wait_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/wait"
)

// writeUnannounced moves job's row to version behind every listener's
// back, as a batch of an instance that committed unannounced would (one
// that began before the lease was recorded).
func (r *rig) writeUnannounced(t *testing.T, job string, version int64) {
	t.Helper()
	_, err := pgtest.Pool(t).Exec(context.Background(), `INSERT INTO `+r.writer.JobsTable()+` (job_id, version, state)
		VALUES ($1, $2, '{}') ON CONFLICT (job_id) DO UPDATE SET version = excluded.version`, job, version)
	require.NoError(t, err)
}

// TestAWaitEndsWithTheStateAtItsEnd: the answer of a wait that timed out
// says where the job is when it ends, not where the last check found it.
func TestAWaitEndsWithTheStateAtItsEnd(t *testing.T) {
	t.Parallel()
	r := newRig(t, wait.Config{Poll: time.Hour})
	r.apply(t, map[string]int64{"x": 1})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	type answer struct {
		st  wait.JobState
		err error
	}
	got := make(chan answer, 1)
	go func() {
		st, err := r.waiter.WaitJob(ctx, "x", 5)
		got <- answer{st, err}
	}()
	// Read once at version 1 before the write: the poll (an hour) never
	// reads it again, so only the read at the end can say 2.
	require.Eventually(t, func() bool { return wait.AllRead(r.waiter) }, 5*time.Second, time.Millisecond)
	r.writeUnannounced(t, "x", 2)
	a := <-got
	require.ErrorIs(t, a.err, context.DeadlineExceeded)
	require.False(t, a.st.Reached)
	require.Equal(t, int64(2), a.st.Version, "read at the timeout")
}

// TestAnUnannouncedWriteIsAnsweredByThePoll: a write no one announced
// still answers its waiter, within about Config.Poll.
func TestAnUnannouncedWriteIsAnsweredByThePoll(t *testing.T) {
	t.Parallel()
	r := newRig(t, wait.Config{Poll: 50 * time.Millisecond})
	got := waitUnbounded(t, r, "x", 1)
	require.Eventually(t, func() bool { return wait.AllRead(r.waiter) }, 5*time.Second, time.Millisecond)
	start := time.Now()
	r.writeUnannounced(t, "x", 1)
	answered(t, got, "the poll reads every waiter")
	t.Logf("answered %s after the unannounced write (poll 50ms)", time.Since(start))
}

// TestASilentListenerIsReplaced: a listening connection that goes silent
// without closing (a host gone, a firewall dropping it) is found by the
// heartbeat and replaced, and every waiter is read again then: a batch
// announced while it was silent answers its waiter though the poll would
// not come for an hour.
func TestASilentListenerIsReplaced(t *testing.T) {
	t.Parallel()
	proxy := pgtest.NewProxy(t)
	r := newRigVia(t, wait.Config{Heartbeat: 100 * time.Millisecond, Retry: 10 * time.Millisecond, Poll: time.Hour}, proxy.URL(t))
	got := waitUnbounded(t, r, "x", 1)
	require.Eventually(t, func() bool { return wait.AllRead(r.waiter) }, 5*time.Second, time.Millisecond)
	// Once Run listens (its lease is recorded then), the connections go
	// silent.
	leased(t, r)
	proxy.Freeze()
	r.apply(t, map[string]int64{"x": 1})
	start := time.Now()
	answered(t, got, "the silent listener is replaced")
	t.Logf("answered %s after the commit, the heartbeat 100ms", time.Since(start))
}

// TestHTTPWaitWithTheDatabaseDown: a wait whose time ends while the
// database does not answer is a 503 saying so, not a timeout whose body
// would claim where the job is.
func TestHTTPWaitWithTheDatabaseDown(t *testing.T) {
	t.Parallel()
	proxy := pgtest.NewProxy(t)
	r := newRigVia(t, wait.Config{Retry: 10 * time.Millisecond}, proxy.URL(t))
	srv := httptest.NewServer(wait.Handler(r.waiter, "t"))
	t.Cleanup(srv.Close)
	proxy.Cut()
	code, body := get(t, srv.URL+"/wait?job=x&version=1&timeout=200ms")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body["error"], "the database is unavailable")
	require.Equal(t, false, body["reached"])
	proxy.Restore()
	r.apply(t, map[string]int64{"x": 1})
	code, _ = get(t, srv.URL+"/wait?job=x&version=1&timeout=10s")
	require.Equal(t, http.StatusOK, code, "answered again once the database is back")
}

// TestListeningAgainOnASilentConnectionIsBounded: the connection the pool
// hands out to listen again may itself be cut without a word (it was
// idle when the network went silent); listening on it is given up after
// a heartbeat and tried again, rather than holding Run, its checks and
// its poll, for ever.
func TestListeningAgainOnASilentConnectionIsBounded(t *testing.T) {
	t.Parallel()
	proxy := pgtest.NewProxy(t)
	logs := &syncBuffer{}
	r := newRigVia(t, wait.Config{Heartbeat: 100 * time.Millisecond, Retry: 10 * time.Millisecond, Poll: time.Hour,
		Logger: slog.New(slog.NewTextHandler(logs, nil))}, proxy.URL(t))
	r.apply(t, map[string]int64{"x": 1})
	leased(t, r)
	// A check reads x through the pool, and leaves its connection idle
	// there: the one the pool hands out next.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := r.waiter.WaitJob(ctx, "x", 1)
	require.NoError(t, err)
	proxy.Freeze()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "listening failed") }, 10*time.Second, time.Millisecond,
		"the heartbeat finds the silent listener")
	got := waitUnbounded(t, r, "y", 1)
	r.apply(t, map[string]int64{"y": 1})
	answered(t, got, "Run listens again on a connection that answers")
}

// waitUnbounded waits for job at version with no deadline: only Run can
// answer it (a wait that timed out would be read again at its end, and
// pass whatever Run did). The wait is cancelled when the test ends.
func waitUnbounded(t *testing.T, r *rig, job string, version int64) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	got := make(chan error, 1)
	go func() {
		_, err := r.waiter.WaitJob(ctx, job, version)
		got <- err
	}()
	require.Eventually(t, func() bool { return r.waiter.Waiting() >= 1 }, 5*time.Second, time.Millisecond)
	return got
}

// answered fails the test unless got says reached within a bound far
// above any answer's (a watchdog, not a measure).
func answered(t *testing.T, got <-chan error, what string) {
	t.Helper()
	select {
	case err := <-got:
		require.NoError(t, err, what)
	case <-time.After(20 * time.Second):
		t.Fatalf("not answered in 20s: %s", what)
	}
}

// syncBuffer is a log's output that tests read while it is written.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

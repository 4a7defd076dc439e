package wait_test

import (
	"context"
	"net/http"
	"net/http/httptest"
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
	require.Eventually(t, func() bool { return r.waiter.Waiting() == 1 }, 5*time.Second, time.Millisecond)
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := r.waiter.WaitJob(ctx, "x", 1)
		got <- err
	}()
	require.Eventually(t, func() bool { return r.waiter.Waiting() == 1 }, 5*time.Second, time.Millisecond)
	start := time.Now()
	r.writeUnannounced(t, "x", 1)
	require.NoError(t, <-got)
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := r.waiter.WaitJob(ctx, "x", 1)
		got <- err
	}()
	require.Eventually(t, func() bool { return r.waiter.Waiting() == 1 }, 5*time.Second, time.Millisecond)
	// Once Run listens (its lease is recorded then), the connections go
	// silent.
	leased(t, r)
	proxy.Freeze()
	r.apply(t, map[string]int64{"x": 1})
	start := time.Now()
	require.NoError(t, <-got)
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

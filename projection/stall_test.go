package projection

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// lockedBuffer collects log output written from many goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A batch transaction that PostgreSQL keeps waiting is logged while it
// waits, long before the batch's own time limit: here a row lock held by
// the test stalls it.
func TestStalledBatchIsLoggedWhileItWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRig(t, 1)
	logs := &lockedBuffer{}
	cfg := r.config(func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	p, err := New(cfg)
	require.NoError(t, err)
	p.testStallWarning = 100 * time.Millisecond
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})

	r.produce(rec{0, "stall", snap("stall", 1, `{"n":1}`)})
	r.caughtUp(20*time.Second, &running{p: p})
	tx := lockRow(t, r, "stall")
	r.produce(rec{0, "stall", snap("stall", 2, `{"n":2}`)})
	r.eventually(20*time.Second, "the stalled batch is logged", func() (bool, string) {
		return strings.Contains(logs.String(), "batch transaction still running"), "no stall line yet"
	})
	require.NoError(t, tx.Rollback(ctx))
	r.caughtUp(20*time.Second, &running{p: p})
	require.Equal(t, int64(2), r.rows()["stall"].Version)
}

// A batch that PostgreSQL keeps waiting, within the batch's own time
// limit, is not a stall: the default --stall-timeout equals the default
// batch limit, and the watchdog must not stop the instance (nor /healthz
// fail) in the middle of a batch that is allowed to run. Here a row lock
// held by the test keeps the batch waiting for several stall timeouts.
func TestSlowBatchWithinItsLimitIsNotAStall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRig(t, 1)
	p, logs, done := runLogged(t, r, time.Second)

	r.produce(rec{0, "slow", snap("slow", 1, `{"n":1}`)})
	r.caughtUp(20*time.Second, &running{p: p})
	tx := lockRow(t, r, "slow")
	r.produce(rec{0, "slow", snap("slow", 2, `{"n":2}`)})
	// The batch waits on the lock: once it has run for three stall
	// timeouts (its own log says so), the instance must still be running,
	// live, and not have found a stall.
	r.eventually(30*time.Second, "the batch has waited for three stall timeouts", func() (bool, string) {
		return strings.Contains(logs.String(), "batch transaction still running") &&
			strings.Contains(logs.String(), "running_for=3s"), "the batch has not waited that long yet"
	})
	select {
	case err := <-done:
		t.Fatalf("Run ended while a batch within its limit waited: %v\n%s", err, logs.String())
	default:
	}
	require.NotContains(t, logs.String(), "partition stalled")
	for _, c := range p.Liveness().Checks {
		if c.Name == "partition 0 worker" || c.Name == "progress" {
			require.True(t, c.OK, "/healthz during a batch within its limit: %+v", c)
		}
	}
	require.NoError(t, tx.Rollback(ctx))
	r.caughtUp(20*time.Second, &running{p: p})
	require.Equal(t, int64(2), r.rows()["slow"].Version)
}

// runLogged runs an engine of r with a stall timeout of stall, its log in
// logs, and the slow-batch warning after 200 ms; done has what Run
// returned, once it returns (at the latest when t ends).
func runLogged(t *testing.T, r *rig, stall time.Duration, mod ...func(*Config)) (*Projector, *lockedBuffer, chan error) {
	t.Helper()
	logs := &lockedBuffer{}
	cfg := r.config(append([]func(*Config){func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
		c.StallTimeout = stall
	}}, mod...)...)
	p, err := New(cfg)
	require.NoError(t, err)
	p.testStallWarning = 200 * time.Millisecond
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		<-done
	})
	return p, logs, done
}

// lockRow holds job's row locked in a transaction of its own, rolled back
// when t ends if the test has not ended it: a batch that writes the row
// waits for it.
func lockRow(t *testing.T, r *rig, job string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := r.store.Pool().Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+r.store.JobsTable()+` WHERE job_id = $1 FOR UPDATE`, job)
	require.NoError(t, err)
	return tx
}

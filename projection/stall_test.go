package projection

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

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
	tx, err := r.store.Pool().Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+r.store.JobsTable()+` WHERE job_id = 'stall' FOR UPDATE`)
	require.NoError(t, err)
	r.produce(rec{0, "stall", snap("stall", 2, `{"n":2}`)})
	r.eventually(20*time.Second, "the stalled batch is logged", func() (bool, string) {
		return strings.Contains(logs.String(), "batch transaction still running"), "no stall line yet"
	})
	require.NoError(t, tx.Rollback(ctx))
	r.caughtUp(20*time.Second, &running{p: p})
	require.Equal(t, int64(2), r.rows()["stall"].Version)
}

package observe

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// standing is an engine whose one partition has lag and never moves.
type standing struct{ paused atomic.Bool }

func (s *standing) Partitions() []PartitionStatus {
	return []PartitionStatus{{Partition: 3, Position: 10, Lag: 5, Epoch: 1}}
}
func (s *standing) Paused(time.Time) bool            { return s.paused.Load() }
func (s *standing) ApplyBounded(int, time.Time) bool { return false }

// TestWatchdogStopsAStandingPartition: a partition with lag that does not
// move for the timeout ends Run with ErrStalled and fails the check,
// unless the engine is paused.
func TestWatchdogStopsAStandingPartition(t *testing.T) {
	t.Parallel()
	var stalls atomic.Int64
	e := &standing{}
	e.paused.Store(true)
	d := &Watchdog{Timeout: 200 * time.Millisecond, Topic: "t", Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Engine: e, Stalls: &stalls}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := d.Run(ctx, func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	require.ErrorIs(t, err, context.DeadlineExceeded, "a paused engine is not stalled")
	require.True(t, d.Check().OK)

	e.paused.Store(false)
	start := time.Now()
	err = d.Run(context.Background(), func(ctx context.Context) error { <-ctx.Done(); return errors.New("stopped") })
	require.ErrorIs(t, err, ErrStalled)
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	require.Contains(t, err.Error(), "partition 3 has lag 5 and its position 10 has not moved")
	require.Equal(t, int64(1), stalls.Load())
	c := d.Check()
	require.False(t, c.OK)
	require.Equal(t, err.Error(), c.Detail)
}

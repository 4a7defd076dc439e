package projection

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ackRecorder is a [Reader] that records how it was acknowledged.
type ackRecorder struct {
	acked       []Record
	ctxErr      error
	hasDeadline bool
}

func (s *ackRecorder) Fetch(context.Context, time.Duration) ([]Record, error) { return nil, nil }
func (s *ackRecorder) Ack(ctx context.Context, recs []Record) error {
	s.acked = append(s.acked, recs...)
	s.ctxErr = ctx.Err()
	_, s.hasDeadline = ctx.Deadline()
	return nil
}
func (s *ackRecorder) Ends() (int64, int64)               { return -1, -1 }
func (s *ackRecorder) Lag(context.Context) (int64, error) { return 0, nil }
func (s *ackRecorder) Err() error                         { return nil }
func (s *ackRecorder) Close() error                       { return nil }

// TestAckOfBatchCommittedAtShutdownReachesTheSource: a batch in flight when
// the worker is stopped is still committed, so its acknowledgement must
// reach the source with a live context (an SQS delete made with the
// stopped context would fail, and every message of the batch would come
// back), yet a bounded one.
func TestAckOfBatchCommittedAtShutdownReachesTheSource(t *testing.T) {
	t.Parallel()
	src := &ackRecorder{}
	w := &worker{src: src, log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	recs := []Record{{Coord: Coord{Partition: -1, Offset: 7, MessageID: "m-7"}}}
	w.ack(ctx, recs)
	require.Equal(t, recs, src.acked)
	require.NoError(t, src.ctxErr, "the source was acknowledged with the worker's ended context")
	require.True(t, src.hasDeadline, "the acknowledgement after shutdown must be bounded")
}

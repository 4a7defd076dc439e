package projection

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/kafkatest"
)

// testKafkaSource opens a source on partition 0 of topic at position.
func testKafkaSource(t *testing.T, brokers []string, topic string, position int64, batchSize int, maxWait time.Duration) (*kafkaSource, *atomic.Int64) {
	t.Helper()
	lost := &atomic.Int64{}
	start := position
	if start < 0 {
		start = kafka.FirstOffset
	}
	s, err := openKafkaSource(kafkaSourceConfig{
		Brokers: brokers, Topic: topic, Partition: 0, Dialer: &kafka.Dialer{Timeout: 10 * time.Second},
		MaxWait: maxWait, BatchSize: batchSize, Linger: 20 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Bounds: func(ctx context.Context) (int64, int64, error) {
			conn, err := dialLeader(ctx, &kafka.Dialer{Timeout: 10 * time.Second}, brokers, topic, 0)
			if err != nil {
				return 0, 0, err
			}
			defer conn.Close()
			return conn.ReadOffsets()
		},
		Committed: func(int, int64) {}, Lost: lost, Moved: func(int64) {},
	}, position, start)
	require.NoError(t, err)
	return s, lost
}

func produceN(t *testing.T, c *kafkatest.Cluster, topic string, from, n int) {
	t.Helper()
	recs := make([]kafkatest.Record, n)
	for i := range recs {
		recs[i] = kafkatest.Record{Partition: 0, Key: []byte(fmt.Sprint("k", from+i)), Value: []byte(fmt.Sprint("v", from+i))}
	}
	_, err := c.Produce(context.Background(), topic, recs...)
	require.NoError(t, err)
}

// TestKafkaSourceDeliversEveryRecordInOrderInBatches: records produced
// before and while the source reads, in fetch responses of many times the
// batch size and of a few records, come back each once, in offset order,
// in batches of at most the batch size, with their own keys and values.
func TestKafkaSourceDeliversEveryRecordInOrderInBatches(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	topic := kafkatest.Topic(t, c, 1)
	for i := range 5 {
		produceN(t, c, topic, i*40, 40)
	}
	s, _ := testKafkaSource(t, c.Addrs(), topic, -1, 7, 200*time.Millisecond)
	defer s.Close()

	ctx := t.Context()
	next := int64(0)
	var got [][]Record
	deadline := time.Now().Add(30 * time.Second)
	produced := 200
	for next < 260 && time.Now().Before(deadline) {
		recs, err := s.Fetch(ctx, time.Second)
		require.NoError(t, err)
		require.LessOrEqual(t, len(recs), 7)
		for _, r := range recs {
			require.Equal(t, next, r.Coord.Offset, "records in offset order, each once")
			require.Equal(t, fmt.Sprint("k", next), string(r.Key))
			require.Equal(t, fmt.Sprint("v", next), string(r.Value))
			next++
		}
		got = append(got, recs)
		require.NoError(t, s.Ack(ctx, recs))
		// Then a few at a time, at the partition's end.
		if next == int64(produced) && produced < 260 {
			produceN(t, c, topic, produced, 3)
			produced += 3
		}
	}
	require.Equal(t, int64(260), next)
	full := 0
	for _, b := range got {
		if len(b) == 7 {
			full++
		}
	}
	require.GreaterOrEqual(t, full, 200/7-1, "while behind, batches are full")
	require.Equal(t, int64(260), s.end())
	lag, err := s.Lag(ctx)
	require.NoError(t, err)
	require.Zero(t, lag)

	// Nothing more: Fetch waits and returns nothing.
	recs, err := s.Fetch(ctx, 100*time.Millisecond)
	require.NoError(t, err)
	require.Empty(t, recs)
}

// TestKafkaSourceCloseDuringAFetch: Close returns at once while the fetcher
// waits on a long fetch at the partition's end, and leaves no goroutine
// (TestMain checks).
func TestKafkaSourceCloseDuringAFetch(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	topic := kafkatest.Topic(t, c, 1)
	produceN(t, c, topic, 0, 3)
	s, _ := testKafkaSource(t, c.Addrs(), topic, 0, 100, 30*time.Second)
	recs, err := s.Fetch(t.Context(), 10*time.Second)
	require.NoError(t, err)
	require.Len(t, recs, 3)
	// The fetcher now waits in a fetch the broker holds for 30 s.
	recs, err = s.Fetch(t.Context(), 200*time.Millisecond)
	require.NoError(t, err)
	require.Empty(t, recs)
	began := time.Now()
	require.NoError(t, s.Close())
	require.Less(t, time.Since(began), 2*time.Second, "Close waited for the fetch in flight")
}

// TestKafkaSourceUnreachable: with no broker, Fetch returns an error (the
// worker reports the outage), not only empty batches.
func TestKafkaSourceUnreachable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	s, _ := testKafkaSource(t, []string{addr}, "nowhere", 0, 10, 200*time.Millisecond)
	defer s.Close()
	err = nil
	for end := time.Now().Add(20 * time.Second); err == nil && time.Now().Before(end); {
		_, err = s.Fetch(t.Context(), time.Second)
	}
	require.Error(t, err)
	require.Contains(t, err.Error(), "nowhere/0")
}

package kafka

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/projector/projector/internal/testkit/kafkatest"
	"github.com/projector/projector/source"
)

// testKafkaSource opens a source on partition 0 of topic at position.
func testKafkaSource(t *testing.T, brokers []string, topic string, position int64, batchSize int, maxWait time.Duration) (*Partition, *atomic.Int64) {
	t.Helper()
	return testKafkaSourceWith(t, brokers, topic, position, batchSize, maxWait, 20*time.Millisecond, &kafkago.Dialer{Timeout: 10 * time.Second})
}

// testKafkaSourceWith is testKafkaSource with the source's linger and the
// dialer its fetcher connects through.
func testKafkaSourceWith(t *testing.T, brokers []string, topic string, position int64, batchSize int, maxWait, linger time.Duration, dialer *kafkago.Dialer) (*Partition, *atomic.Int64) {
	t.Helper()
	lost := &atomic.Int64{}
	start := position
	if start < 0 {
		start = kafkago.FirstOffset
	}
	s, err := OpenPartition(PartitionConfig{
		Brokers: brokers, Topic: topic, Partition: 0, Dialer: dialer,
		MaxWait: maxWait, BatchSize: batchSize, Linger: linger,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Bounds: func(ctx context.Context) (int64, int64, error) {
			conn, err := DialLog(ctx, &kafkago.Dialer{Timeout: 10 * time.Second}, brokers, topic, 0)
			if err != nil {
				return 0, 0, err
			}
			defer conn.Close()
			return conn.Bounds(false)
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
	var got [][]source.Record
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
	hwm, stable := s.Ends()
	require.Equal(t, int64(260), hwm)
	require.Equal(t, int64(260), stable, "no transaction: the last stable offset is the high watermark")
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

// fetchInOrder fetches from s until want records were returned, requiring
// each to be the next offset from next on (with its own key and value) and
// each batch to hold at most batchSize; it returns the batches' lengths.
func fetchInOrder(t *testing.T, s *Partition, next int64, want int, batchSize int, within time.Duration) []int {
	t.Helper()
	var lens []int
	end := next + int64(want)
	for deadline := time.Now().Add(within); next < end && time.Now().Before(deadline); {
		recs, err := s.Fetch(t.Context(), 200*time.Millisecond)
		require.NoError(t, err)
		require.LessOrEqual(t, len(recs), batchSize, "a batch of at most the batch size")
		for _, r := range recs {
			require.Equal(t, next, r.Coord.Offset, "records in offset order, each once")
			require.Equal(t, fmt.Sprint("k", next), string(r.Key))
			require.Equal(t, fmt.Sprint("v", next), strings.TrimRight(string(r.Value), "\x00"))
			next++
		}
		if len(recs) > 0 {
			lens = append(lens, len(recs))
			require.NoError(t, s.Ack(t.Context(), recs))
		}
	}
	require.Equal(t, end, next, "every record delivered within %s", within)
	return lens
}

// TestKafkaSourceHeldChunkIsReturnedNext: a chunk that arrives while a
// Fetch lingers and does not fit in its batch (3 records so far, 9 more,
// batch size 10) is held, and the next Fetch returns it first, then what
// came after it: every record once, in offset order, no batch over the
// batch size.
func TestKafkaSourceHeldChunkIsReturnedNext(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	topic := kafkatest.Topic(t, c, 1)
	produceN(t, c, topic, 0, 3)
	s, _ := testKafkaSourceWith(t, c.Addrs(), topic, -1, 10, 200*time.Millisecond, time.Second, &kafkago.Dialer{Timeout: 10 * time.Second})
	defer s.Close()
	// The fetcher read the 3 records (it records the partition's end
	// before it hands them over) and waits for the source to take them;
	// the 9 produced now come in the fetch after that one, while the
	// first Fetch lingers.
	readUpTo := func(end int64) {
		require.Eventually(t, func() bool { return s.fetcher.hwm.Load() == end }, 10*time.Second, 5*time.Millisecond)
	}
	readUpTo(3)
	produceN(t, c, topic, 3, 9)

	lens := fetchInOrder(t, s, 0, 3, 10, 5*time.Second)
	require.Equal(t, []int{3}, lens, "the chunk of 9 does not fit after the 3")
	require.NotNil(t, s.held, "the chunk of 9 arrived within the linger and is held")

	// One more record, waiting in the fetcher while the held chunk is
	// returned: the next batch is the held 9 and then it, 10 in all.
	produceN(t, c, topic, 12, 1)
	readUpTo(13)
	lens = fetchInOrder(t, s, 3, 10, 10, 5*time.Second)
	require.Equal(t, []int{10}, lens, "the held chunk whole, then the next record, in one batch")
	require.Nil(t, s.held)

	// Nothing more, nothing again.
	recs, err := s.Fetch(t.Context(), 100*time.Millisecond)
	require.NoError(t, err)
	require.Empty(t, recs)
}

// cutConn is a connection that fails once limit bytes were read from it,
// closing itself, as a connection reset mid-response does.
type cutConn struct {
	net.Conn
	limit int
	read  int
	cut   func() // called once, at the cut
	done  bool
}

func (c *cutConn) Read(p []byte) (int, error) {
	if c.read >= c.limit {
		if !c.done {
			c.done = true
			c.cut()
		}
		c.Conn.Close()
		return 0, fmt.Errorf("test: connection cut after %d bytes", c.read)
	}
	n, err := c.Conn.Read(p[:min(len(p), c.limit-c.read)])
	c.read += n
	return n, err
}

// TestKafkaSourceReconnectMidResponse: the fetcher's connection breaks in
// the middle of a fetch response, twice, while records flow; it connects
// again from the record after the last one it read, and every record comes
// back once, in offset order, in batches of at most the batch size, the
// records read before each break included.
func TestKafkaSourceReconnectMidResponse(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	topic := kafkatest.Topic(t, c, 1)
	// Records of about 2 KiB in record batches of 10: a fetch from the
	// start is about 200 KiB, cut at 50 KiB in the middle of a record
	// batch and of a chunk.
	pad := string(make([]byte, 2000))
	produce := func(from, n int) error {
		for b := from; b < from+n; b += 10 {
			recs := make([]kafkatest.Record, 10)
			for i := range recs {
				recs[i] = kafkatest.Record{Partition: 0, Key: []byte(fmt.Sprint("k", b+i)), Value: []byte(fmt.Sprint("v", b+i, pad))}
			}
			if _, err := c.Produce(context.Background(), topic, recs...); err != nil {
				return err
			}
		}
		return nil
	}
	require.NoError(t, produce(0, 100))

	// Connections dialled before two were cut are cut once 50 KiB were
	// read from them: the leader's, in its first fetch response (a leader
	// lookup's reads far less).
	var cuts atomic.Int32
	var dialer net.Dialer
	d := &kafkago.Dialer{Timeout: 10 * time.Second, DialFunc: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if cuts.Load() >= 2 {
			return conn, nil
		}
		return &cutConn{Conn: conn, limit: 50 << 10, cut: func() { cuts.Add(1) }}, nil
	}}
	s, _ := testKafkaSourceWith(t, c.Addrs(), topic, -1, 10, 200*time.Millisecond, 20*time.Millisecond, d)
	defer s.Close()

	// Records keep coming while the source reads and reconnects.
	flowing := make(chan error, 1)
	go func() { flowing <- produce(100, 50) }()
	fetchInOrder(t, s, 0, 150, 10, 20*time.Second)
	require.NoError(t, <-flowing)
	require.Equal(t, int32(2), cuts.Load(), "two connections were cut mid-response")

	// Nothing more, nothing again.
	recs, err := s.Fetch(t.Context(), 100*time.Millisecond)
	require.NoError(t, err)
	require.Empty(t, recs)
}

// TestKafkaSourceReportsAConnectionThatNeverAnswers: every connection to
// the leader breaks inside the first record of its first fetch response,
// so nothing is ever read; after a few in a row Fetch says so instead of
// the fetcher dialling again in silence for ever.
func TestKafkaSourceReportsAConnectionThatNeverAnswers(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	topic := kafkatest.Topic(t, c, 1)
	_, err := c.Produce(context.Background(), topic, kafkatest.Record{Partition: 0, Key: []byte("k"), Value: make([]byte, 200<<10)})
	require.NoError(t, err)
	var dialer net.Dialer
	d := &kafkago.Dialer{Timeout: 10 * time.Second, DialFunc: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &cutConn{Conn: conn, limit: 16 << 10, cut: func() {}}, nil
	}}
	s, _ := testKafkaSourceWith(t, c.Addrs(), topic, -1, 10, 200*time.Millisecond, 20*time.Millisecond, d)
	defer s.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		recs, err := s.Fetch(t.Context(), 500*time.Millisecond)
		require.Empty(t, recs)
		if err != nil {
			require.ErrorContains(t, err, "times in a row")
			return
		}
		require.False(t, time.Now().After(deadline), "no error from Fetch while every connection broke before its first answer")
	}
}

// TestKafkaSourceQuietConnectionsDroppedAreNoFailure: on a partition with
// nothing new, connections that answered their fetches (empty) and were
// then dropped, again and again, are dialled again without an error: the
// partition is quiet, not failing.
func TestKafkaSourceQuietConnectionsDroppedAreNoFailure(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	topic := kafkatest.Topic(t, c, 1)
	produceN(t, c, topic, 0, 3)
	var dialer net.Dialer
	var drops atomic.Int32
	d := &kafkago.Dialer{Timeout: 10 * time.Second, DialFunc: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		time.AfterFunc(300*time.Millisecond, func() { drops.Add(1); conn.Close() })
		return conn, nil
	}}
	s, _ := testKafkaSourceWith(t, c.Addrs(), topic, -1, 10, 50*time.Millisecond, 20*time.Millisecond, d)
	defer s.Close()
	fetchInOrder(t, s, 0, 3, 10, 10*time.Second)
	// About ten drops of connections that were answered, then more
	// records, which still come.
	for drops.Load() < 10 {
		recs, err := s.Fetch(t.Context(), 200*time.Millisecond)
		require.NoError(t, err, "a quiet partition whose answered connections drop is not failing")
		require.Empty(t, recs)
	}
	produceN(t, c, topic, 3, 2)
	fetchInOrder(t, s, 3, 2, 10, 10*time.Second)
}

// TestKafkaSourceErrorAfterRecordsComesNext: records are handed over, then
// the broker answers fetches with an error code while the source lingers
// for more. The records come back first, the error on the next Fetch, and
// once the broker answers again the records after them, each once.
func TestKafkaSourceErrorAfterRecordsComesNext(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	topic := kafkatest.Topic(t, c, 1)
	produceN(t, c, topic, 0, 3)
	kf := c.Kfake()
	var fetches, failed atomic.Int32
	kf.ControlKey(kmsg.Fetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		switch n := fetches.Add(1); {
		case n == 1:
			return nil, nil, false // the first fetch is answered: the 3 records
		case failed.Load() >= 1:
			kf.DropControl()
			return nil, nil, false
		}
		failed.Add(1)
		return kafkatest.FetchErrorResponse(req, kerr.KafkaStorageError), nil, true
	})
	s, _ := testKafkaSourceWith(t, c.Addrs(), topic, -1, 10, 100*time.Millisecond, 2*time.Second, &kafkago.Dialer{Timeout: 10 * time.Second})
	defer s.Close()

	recs, err := s.Fetch(t.Context(), 10*time.Second)
	require.NoError(t, err, "the records read before the error come first")
	require.Len(t, recs, 3)
	for i, r := range recs {
		require.Equal(t, int64(i), r.Coord.Offset)
	}
	require.NotNil(t, s.held, "the error arrived while the source lingered, and is kept")
	_, err = s.Fetch(t.Context(), 10*time.Second)
	require.ErrorIs(t, err, kafkago.KafkaStorageError, "then the error, on the next Fetch")

	produceN(t, c, topic, 3, 2)
	fetchInOrder(t, s, 3, 2, 10, 10*time.Second)
}

// TestKafkaSourceReadsEveryCodec: batches compressed with each codec
// Kafka knows (written by franz-go's producer) come back with their keys,
// values and offsets.
func TestKafkaSourceReadsEveryCodec(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	topic := kafkatest.Topic(t, c, 1)
	codecs := []kgo.CompressionCodec{kgo.GzipCompression(), kgo.SnappyCompression(), kgo.Lz4Compression(), kgo.ZstdCompression(), kgo.NoCompression()}
	for i, codec := range codecs {
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.DefaultProduceTopic(topic),
			kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchCompression(codec))
		require.NoError(t, err)
		recs := make([]*kgo.Record, 20)
		for j := range recs {
			n := i*20 + j
			recs[j] = &kgo.Record{Key: []byte(fmt.Sprint("k", n)), Value: []byte(strings.Repeat(fmt.Sprint("v", n), 10))}
		}
		require.NoError(t, cl.ProduceSync(t.Context(), recs...).FirstErr())
		cl.Close()
	}
	s, _ := testKafkaSource(t, c.Addrs(), topic, -1, 500, 200*time.Millisecond)
	defer s.Close()
	next := int64(0)
	deadline := time.Now().Add(20 * time.Second)
	for next < 100 && time.Now().Before(deadline) {
		recs, err := s.Fetch(t.Context(), time.Second)
		require.NoError(t, err)
		for _, r := range recs {
			require.Equal(t, next, r.Coord.Offset)
			require.Equal(t, fmt.Sprint("k", next), string(r.Key))
			require.Equal(t, strings.Repeat(fmt.Sprint("v", next), 10), string(r.Value))
			next++
		}
		require.NoError(t, s.Ack(t.Context(), recs))
	}
	require.Equal(t, int64(100), next)
}

// TestAFetchWhoseChunkWaitedTakesWhatCameMeanwhile: with no linger, a
// Fetch whose first chunk waited for it (its worker was writing a batch)
// also takes the records produced meanwhile, which the fetcher reads as
// soon as it hands that chunk over, rather than leave them for a batch of
// their own.
func TestAFetchWhoseChunkWaitedTakesWhatCameMeanwhile(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	topic := kafkatest.Topic(t, c, 1)
	s, _ := testKafkaSourceWith(t, c.Addrs(), topic, 0, 100, 5*time.Second, 0, &kafkago.Dialer{Timeout: 10 * time.Second})
	defer s.Close()
	ctx := t.Context()

	produceN(t, c, topic, 0, 3)
	recs, err := s.Fetch(ctx, 10*time.Second)
	require.NoError(t, err)
	require.Len(t, recs, 3, "the first chunk, taken as soon as it came")
	require.NoError(t, s.Ack(ctx, recs))

	produceN(t, c, topic, 3, 2)
	// The next chunk (offsets 3 and 4) is handed over and waits, as for a
	// worker busy with its batch, while more records come.
	require.Eventually(t, func() bool {
		hwm, _ := s.Ends()
		return hwm == 5
	}, 10*time.Second, 5*time.Millisecond)
	time.Sleep(100 * time.Millisecond) // the worker's batch being written: the scenario, not a synchronisation
	produceN(t, c, topic, 5, 4)
	s.catchUp = 5 * time.Second // a bound, not a wait: the next chunk comes in a round trip
	recs, err = s.Fetch(ctx, 10*time.Second)
	require.NoError(t, err)
	var offsets []int64
	for _, r := range recs {
		offsets = append(offsets, r.Coord.Offset)
	}
	require.Equal(t, []int64{3, 4, 5, 6, 7, 8}, offsets, "the waiting chunk and what came meanwhile, in one batch")
}

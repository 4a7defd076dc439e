package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
)

var _ Source = (*kafkaSource)(nil)

// kafkaSource is one Kafka partition as a [Source]: a reader positioned
// at the partition's stored position, acknowledged batches handed to the
// group's committer.
type kafkaSource struct {
	topic     string
	partition int
	r         *kafka.Reader
	log       *slog.Logger
	// batchSize and linger bound one Fetch.
	batchSize int
	linger    time.Duration
	// bounds reads the partition's first and last offsets from its leader.
	bounds func(ctx context.Context) (first, last int64, err error)
	// committed hands an acknowledged position to the group's committer.
	committed func(partition int, next int64)
	// lost counts records deleted from the log before they were read.
	lost *atomic.Int64
	// moved tells the worker its position moved without a batch: records
	// below the log start were deleted before they were read.
	moved func(next int64)

	// position is the next offset to read as stored, -1 for none;
	// readSincePosition is set once a record was read after the reader
	// was (re)positioned there.
	position          int64
	readSincePosition bool
	// hwm is the partition's end as last seen by a fetch.
	hwm int64
	// lastLen is how many records the last fetch returned.
	lastLen int
}

// kafkaSourceConfig is what [openKafkaSource] needs besides the reader's
// settings.
type kafkaSourceConfig struct {
	Brokers   []string
	Topic     string
	Partition int
	Dialer    *kafka.Dialer
	MaxWait   time.Duration
	BatchSize int
	Linger    time.Duration
	Log       *slog.Logger
	Bounds    func(ctx context.Context) (first, last int64, err error)
	Committed func(partition int, next int64)
	Lost      *atomic.Int64
	Moved     func(next int64)
}

// openKafkaSource opens a reader on the partition at position, the
// position the claim returned (-1 for none: start at start, which is
// kafka.FirstOffset or kafka.LastOffset).
func openKafkaSource(c kafkaSourceConfig, position, start int64) (*kafkaSource, error) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:   c.Brokers,
		Topic:     c.Topic,
		Partition: c.Partition,
		MinBytes:  1,
		MaxBytes:  16 << 20,
		MaxWait:   c.MaxWait,
		// The reader fetches in the background while a batch is written:
		// a queue of a whole batch lets the next one be ready when the
		// write ends (kafka-go's default of 100 made batches of ~100
		// records once the log was behind).
		QueueCapacity: c.BatchSize,
		Dialer:        c.Dialer,
		ErrorLogger:   kafka.LoggerFunc(func(msg string, args ...any) { c.Log.Debug("kafka: " + fmt.Sprintf(msg, args...)) }),
		// Return an out-of-range position instead of retrying it for ever
		// in silence: see [kafkaSource.outOfRange].
		OffsetOutOfRangeError: true,
	})
	if err := r.SetOffset(start); err != nil {
		r.Close()
		return nil, fmt.Errorf("projection: %s/%d: set offset %d: %w", c.Topic, c.Partition, start, err)
	}
	return &kafkaSource{
		topic: c.Topic, partition: c.Partition, r: r, log: c.Log,
		batchSize: c.BatchSize, linger: c.Linger,
		bounds: c.Bounds, committed: c.Committed, lost: c.Lost, moved: c.Moved,
		position: position,
	}, nil
}

// Fetch implements [Source]. An out-of-range position is handled here
// ([kafkaSource.outOfRange]) and returns no records and no error.
func (s *kafkaSource) Fetch(ctx context.Context, wait time.Duration) ([]Record, error) {
	fctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	m, err := s.r.FetchMessage(fctx)
	if err != nil {
		switch {
		case ctx.Err() != nil || fctx.Err() != nil:
			return nil, nil
		case errors.Is(err, kafka.OffsetOutOfRange):
			s.outOfRange(ctx)
			return nil, nil
		default:
			return nil, fmt.Errorf("fetch %s/%d: %w", s.topic, s.partition, err)
		}
	}
	if s.position >= 0 && m.Offset > s.position && !s.readSincePosition {
		// kafka-go moves a reader whose offset is below the log start to
		// the log start without a word: records were deleted (retention,
		// compaction) before this projection read them. Say so.
		s.log.Error("records between the stored position and the first record read were never delivered: deleted from the log (retention or compaction) before they were read",
			"position", s.position, "first_read", m.Offset, "lost_records", m.Offset-s.position)
		s.lost.Add(m.Offset - s.position)
	}
	s.readSincePosition = true
	// Sized by the last batch: growing a slice of records to a full batch
	// copied each record about twice, and was the largest allocation in
	// the process in the allocation profile of a deltas run.
	recs := make([]Record, 0, min(max(s.lastLen, 64), s.batchSize))
	recs = append(recs, s.record(m))
	s.hwm = max(s.hwm, m.HighWaterMark)
	lctx, cancel := context.WithTimeout(ctx, s.linger)
	defer cancel()
	for len(recs) < s.batchSize {
		m, err := s.r.FetchMessage(lctx)
		if err != nil {
			break
		}
		recs = append(recs, s.record(m))
		s.hwm = max(s.hwm, m.HighWaterMark)
	}
	s.lastLen = len(recs)
	return recs, nil
}

func (s *kafkaSource) record(m kafka.Message) Record {
	return Record{Key: m.Key, Value: m.Value, Time: m.Time, Coord: Coord{Partition: s.partition, Offset: m.Offset}}
}

// Ack implements [Source]: the position after recs is offered to the
// group's committer, which commits it to the group for lag tooling only.
func (s *kafkaSource) Ack(_ context.Context, recs []Record) error {
	if len(recs) == 0 {
		return nil
	}
	next := recs[len(recs)-1].Coord.Offset + 1
	s.position = next
	s.committed(s.partition, next)
	return nil
}

// Ordered implements [Source]: a partition is an ordered log with one
// fenced owner.
func (s *kafkaSource) Ordered() bool { return true }

// Lag implements [Source], from the partition's end as last fetched.
func (s *kafkaSource) Lag(context.Context) (int64, error) {
	if s.position < 0 {
		return s.hwm, nil
	}
	return max(s.hwm-s.position, 0), nil
}

// end is the partition's end as last seen by a fetch, for the status.
func (s *kafkaSource) end() int64 { return s.hwm }

// Close implements [Source].
func (s *kafkaSource) Close() error { return s.r.Close() }

// outOfRange handles a position the partition no longer holds. Below the
// log start, records were deleted (retention, compaction, DeleteRecords)
// before they were read: nothing can read them any more, so the source
// says so loudly, counts them, and goes on from the log start (the gaps
// they leave are held and closed like any other). Past the log end, the
// topic was recreated or its log truncated: the source reports it and
// waits rather than skip what will be appended.
func (s *kafkaSource) outOfRange(ctx context.Context) {
	first, last, err := s.bounds(ctx)
	switch {
	case err != nil:
		s.log.Warn("offset out of range; reading the partition's bounds failed", "position", s.position, "err", err)
		sleep(ctx, time.Second)
	case s.position >= 0 && s.position < first:
		s.log.Error("records were deleted from the log before they were read (retention or compaction); continuing from the log start",
			"position", s.position, "log_start", first, "lost_records", first-s.position)
		s.lost.Add(first - s.position)
		s.position = first
		s.readSincePosition = false
		s.moved(first)
	case s.position > last:
		s.log.Error("the stored position is past the end of the partition: was the topic recreated or its log truncated? waiting; rebuild the projection if the topic was recreated",
			"position", s.position, "log_end", last)
		sleep(ctx, 10*time.Second)
	default:
		sleep(ctx, time.Second)
	}
	next := s.position
	if next < 0 {
		next = kafka.FirstOffset
	}
	if err := s.r.SetOffset(next); err != nil {
		s.log.Warn("set offset", "offset", next, "err", err)
	}
}

package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/projector/projector/source"
)

// Partition is one Kafka partition as the engine reads it: a [partitionFetcher]
// reading the partition from the stored position in the background,
// acknowledged batches handed to the group's committer.
type Partition struct {
	topic     string
	partition int
	log       *slog.Logger
	// batchSize and linger bound one Fetch.
	batchSize int
	linger    time.Duration
	// catchUp is how long a Fetch whose first chunk waited for it waits
	// for the next one (catchUpWait; tests set more); tookWaiting says
	// the chunk receive returned last was there before it asked.
	catchUp     time.Duration
	tookWaiting bool
	// fetcher reads ahead of the batches; newFetcher starts one at an
	// offset (again after [Partition.outOfRange] moved the position).
	fetcher    *partitionFetcher
	newFetcher func(offset int64) *partitionFetcher
	// held is what the fetcher handed over that the last Fetch could not
	// return: a chunk that did not fit in its batch, or an error that came
	// after its records. The next Fetch starts with it.
	held *fetched
	// bounds reads the partition's first and last offsets from its leader.
	bounds func(ctx context.Context) (first, last int64, err error)
	// committed hands an acknowledged position to the group's committer.
	committed func(partition int, next int64)
	// lost counts records deleted from the log before they were read.
	lost *atomic.Int64
	// moved tells the worker its position moved without a batch: records
	// below the log start were deleted before they were read, or reading
	// passed offsets that hold nothing to deliver.
	moved func(next int64)
	// newLog is [PartitionConfig.NewLog].
	newLog func(ctx context.Context, position int64) (int64, error)

	// position is the next offset to read as stored, -1 for none;
	// readSincePosition is set once a record was read after the fetcher
	// was (re)positioned there.
	position          int64
	readSincePosition bool
	// hwm and stable are the partition's end and its last stable offset
	// as last seen by a fetch.
	hwm, stable int64
	// readCommitted reads committed (see [fetcherConfig]).
	readCommitted bool
}

// kafkaSourceConfig is what [openKafkaSource] needs.
type PartitionConfig struct {
	Brokers   []string
	Topic     string
	Partition int
	Dialer    *kafkago.Dialer
	// ReadCommitted reads committed: nothing past the last stable offset,
	// no record of an aborted transaction.
	ReadCommitted bool
	MaxWait       time.Duration
	BatchSize     int
	Linger        time.Duration
	Log           *slog.Logger
	Bounds        func(ctx context.Context) (first, last int64, err error)
	Committed     func(partition int, next int64)
	Lost          *atomic.Int64
	Moved         func(next int64)
	// NewLog is told the position is past the log's end; it returns where
	// reading goes on (the position itself to wait).
	NewLog func(ctx context.Context, position int64) (int64, error)
}

// OpenPartition starts reading the partition at position, the position
// the claim returned (-1 for none: start at start, which is
// kafkago.FirstOffset or kafkago.LastOffset). It does not wait for the
// brokers: a partition that cannot be read shows as errors from Fetch.
func OpenPartition(c PartitionConfig, position, start int64) (*Partition, error) {
	if c.BatchSize < 1 {
		return nil, fmt.Errorf("projection: %s/%d: batch size %d: want at least 1", c.Topic, c.Partition, c.BatchSize)
	}
	s := &Partition{
		topic: c.Topic, partition: c.Partition, log: c.Log,
		batchSize: c.BatchSize, linger: c.Linger, catchUp: catchUpWait,
		newFetcher: func(offset int64) *partitionFetcher {
			return startPartitionFetcher(fetcherConfig{
				dialer: c.Dialer, brokers: c.Brokers, topic: c.Topic, partition: c.Partition,
				maxWait: c.MaxWait, chunk: c.BatchSize, readCommitted: c.ReadCommitted, log: c.Log,
			}, offset)
		},
		bounds: c.Bounds, committed: c.Committed, lost: c.Lost, moved: c.Moved, newLog: c.NewLog,
		position: position, readCommitted: c.ReadCommitted,
	}
	s.fetcher = s.newFetcher(start)
	return s, nil
}

// Fetch is the engine's. An out-of-range position is handled here
// ([Partition.outOfRange]) and returns no records and no error.
//
// The fetcher hands records over a chunk at a time, whole batches while
// the partition is behind: such a chunk is returned at once, without the
// linger. A chunk is never split: one that does not fit in the batch
// gathered so far waits for the next Fetch, so that batches keep the
// fetcher's whole chunks rather than copying every record to realign them.
func (s *Partition) Fetch(ctx context.Context, wait time.Duration) ([]source.Record, error) {
	if ctx.Err() != nil {
		return nil, nil
	}
	c, ok := s.receive(ctx, wait)
	if !ok {
		return nil, nil
	}
	// A chunk that was there before this Fetch asked, offered a while ago.
	stale := s.tookWaiting && time.Since(c.ready) > staleChunk
	if c.err != nil {
		if errors.Is(c.err, kafkago.OffsetOutOfRange) {
			s.outOfRange(ctx)
			return nil, nil
		}
		return nil, fmt.Errorf("fetch %s/%d: %w", s.topic, s.partition, c.err)
	}
	if c.first >= 0 && s.position >= 0 && c.first > s.position && !s.readSincePosition {
		// The first entry after the stored position is further on: the
		// records between were compacted away before this projection read
		// them (a position below the log start comes back as out of range
		// instead: see [Partition.outOfRange]). Say so.
		s.log.Error("records between the stored position and the first record read were never delivered: deleted from the log (retention or compaction) before they were read",
			"position", s.position, "first_read", c.first, "lost_records", c.first-s.position)
		s.lost.Add(c.first - s.position)
	}
	s.readSincePosition = true
	if len(c.recs) == 0 {
		// Reading passed offsets that hold nothing to deliver, with no
		// record after them yet: the position moves past them.
		if c.next > s.position {
			s.position = c.next
			s.moved(c.next)
		}
		return nil, nil
	}
	recs := c.recs
	carrySkipped(recs, c.next)
	if len(recs) < s.batchSize {
		// With no linger, a chunk that waited for this worker (its last
		// batch was being written) is followed in the log by what came
		// meanwhile, which the fetcher, free again, is reading now: wait
		// for that one chunk too, rather than leave it for a batch of its
		// own. A chunk held back by the last Fetch counts as waiting: the
		// next one is then usually waiting too, and taken at once.
		// Otherwise the linger is the wait.
		catchUp := s.linger <= 0 && stale
		until := time.Now().Add(s.linger)
		for len(recs) < s.batchSize {
			wait := time.Until(until)
			if catchUp {
				wait, catchUp = max(wait, s.catchUp), false
			}
			c, ok := s.receive(ctx, wait)
			if !ok {
				break
			}
			if c.err != nil || len(recs)+len(c.recs) > s.batchSize {
				s.held = &c
				break
			}
			// recs is the fetcher's chunk, ours now: appending to it
			// reuses its spare room before growing.
			recs = append(recs, c.recs...)
			carrySkipped(recs, c.next)
		}
	}
	return recs, nil
}

// staleChunk is how long a chunk may wait for its worker before the worker,
// taking it, also waits up to catchUpWait for the next chunk, of the records
// that came meanwhile: the fetcher reads them as soon as it hands the chunk
// over, and the broker answers at once when there are records, so the wait
// is about a round trip; on a partition that went quiet it is the most a
// batch is delayed.
const (
	staleChunk  = 2 * time.Millisecond
	catchUpWait = 20 * time.Millisecond
)

// carrySkipped gives the last of recs the offsets passed after it, up to
// next.
func carrySkipped(recs []source.Record, next int64) {
	last := &recs[len(recs)-1]
	last.Skipped = max(next-last.Coord.Offset-1, 0)
}

// receive returns what the fetcher handed over: what the last Fetch held
// back, else the next chunk or error, waiting up to d for it; false when
// d passed or ctx ended first.
func (s *Partition) receive(ctx context.Context, d time.Duration) (fetched, bool) {
	if c := s.held; c != nil {
		s.held, s.tookWaiting = nil, true
		return *c, true
	}
	// A chunk already waiting is taken without a timer.
	select {
	case c := <-s.fetcher.out:
		s.tookWaiting = true
		return c, true
	default:
	}
	if d <= 0 {
		return fetched{}, false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case c := <-s.fetcher.out:
		s.tookWaiting = false
		return c, true
	case <-t.C:
	case <-ctx.Done():
	}
	return fetched{}, false
}

// Ack is the engine's: the position after recs is offered to the
// group's committer, which commits it to the group for lag tooling only.
// With no records, the position the partition moved to on its own (told
// through Moved) was stored: it is offered the same way.
func (s *Partition) Ack(_ context.Context, recs []source.Record) error {
	if len(recs) > 0 {
		s.position = recs[len(recs)-1].Next()
	}
	if s.position >= 0 {
		s.committed(s.partition, s.position)
	}
	return nil
}

// Ordered is the engine's: a partition is an ordered log with one
// fenced owner.
func (s *Partition) Ordered() bool { return true }

// Lag is the engine's, from the partition's end as last fetched: its
// last stable offset reading committed, else its high watermark.
func (s *Partition) Lag(context.Context) (int64, error) {
	hwm, stable := s.Ends()
	end := hwm
	if s.readCommitted {
		end = stable
	}
	if s.position < 0 {
		return end, nil
	}
	return max(end-s.position, 0), nil
}

// Ends is the partition's high watermark and last stable offset as last
// seen by a fetch, for the status. They never go back, not even across a
// restart of the fetcher.
func (s *Partition) Ends() (hwm, stable int64) {
	s.hwm = max(s.hwm, s.fetcher.hwm.Load())
	s.stable = max(s.stable, s.fetcher.stable.Load())
	return s.hwm, s.stable
}

// Close is the engine's: it stops the fetcher, a fetch in flight
// included, and waits for it.
func (s *Partition) Close() error {
	s.fetcher.stop()
	return nil
}

// outOfRange handles a position the partition no longer holds. Below the
// log start, records were deleted (retention, compaction, DeleteRecords)
// before they were read: nothing can read them any more, so the source
// says so loudly, counts them, and goes on from the log start (the gaps
// they leave are held and closed like any other). Past the log end, the
// topic was recreated or its log truncated: the source reports it and
// waits rather than skip what will be appended.
func (s *Partition) outOfRange(ctx context.Context) {
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
	case s.position > last && s.newLog != nil:
		next, err := s.newLog(ctx, s.position)
		switch {
		case err != nil:
			s.log.Warn("the stored position is past the end of the partition; comparing the log with what was read failed; trying again", "position", s.position, "log_end", last, "err", err)
			sleep(ctx, time.Second)
		case next != s.position:
			s.position = next
			s.readSincePosition = false
			s.moved(next)
		default:
			sleep(ctx, time.Second)
		}
	case s.position > last:
		s.log.Error("the stored position is past the end of the partition: was the topic recreated or its log truncated? waiting",
			"position", s.position, "log_end", last)
		sleep(ctx, 10*time.Second)
	default:
		sleep(ctx, time.Second)
	}
	next := s.position
	if next < 0 {
		next = kafkago.FirstOffset
	}
	// The fetcher stopped when it handed the error over; a new one reads
	// from the position as it is now.
	s.fetcher.stop()
	s.held = nil
	s.fetcher = s.newFetcher(next)
}

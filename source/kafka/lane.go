package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/projector/projector/source"
)

// LaneConfig is one partition of the group's assignment, and how it is
// read.
type LaneConfig struct {
	Topic     string
	Partition int
	Brokers   []string
	Dialer    *kafkago.Dialer
	// ReadCommitted reads committed: nothing past the last stable offset,
	// no record of an aborted transaction.
	ReadCommitted bool
	// MaxWait is how long the broker holds a fetch with nothing to return;
	// BatchSize and Linger bound one Fetch.
	MaxWait   time.Duration
	BatchSize int
	Linger    time.Duration
	Log       *slog.Logger
	// Committed hands acknowledged positions to the generation's
	// committer (besides the reader's [source.LaneHooks] Committed).
	Committed func(partition int, next int64)
}

// Lane is one partition of the group's assignment as a [source.Lane]:
// fenced, a log.
type Lane struct{ c LaneConfig }

// NewLane returns the lane c describes.
func NewLane(c LaneConfig) *Lane { return &Lane{c} }

var _ source.Lane = (*Lane)(nil)

func (l *Lane) Scope() (string, int) { return l.c.Topic, l.c.Partition }

func (l *Lane) Caps() source.LaneCaps { return source.LaneCaps{Fenced: true, Log: true} }

// Bounds reads the partition's first offset and its high watermark: a
// position up to the high watermark is in the log, also past the last
// stable offset.
func (l *Lane) Bounds(ctx context.Context) (first, end int64, err error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := DialLog(dctx, l.c.Dialer, l.c.Brokers, l.c.Topic, l.c.Partition)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	return conn.Bounds(false)
}

// RecordAt reads the record at offset, or the first after it when it is
// gone (compaction). It reads uncommitted: a record read before is there
// whatever became of its transaction.
func (l *Lane) RecordAt(ctx context.Context, offset int64) (source.Record, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := DialLog(dctx, l.c.Dialer, l.c.Brokers, l.c.Topic, l.c.Partition)
	if err != nil {
		return source.Record{}, err
	}
	defer conn.Close()
	stop := context.AfterFunc(dctx, func() { conn.Close() })
	defer stop()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	lf, err := conn.Fetch(offset, 1<<20, 100*time.Millisecond, false)
	if err != nil {
		return source.Record{}, fmt.Errorf("read %s/%d at %d: %w", l.c.Topic, l.c.Partition, offset, err)
	}
	defer lf.Close()
	m, ok, err := lf.Next()
	switch {
	case err != nil:
		return source.Record{}, fmt.Errorf("read %s/%d at %d: %w", l.c.Topic, l.c.Partition, offset, err)
	case !ok:
		return source.Record{}, fmt.Errorf("read %s/%d at %d: no record", l.c.Topic, l.c.Partition, offset)
	}
	return m, nil
}

// Open starts the partition's fetcher. It does not wait for the brokers:
// a partition that cannot be read shows as errors from Fetch.
func (l *Lane) Open(ctx context.Context, position, start int64, h source.LaneHooks) (source.Reader, error) {
	// Acknowledged positions go to the lane's committer (the group's),
	// and to the hooks' Committed where the engine asks to hear of them.
	committed := func(partition int, next int64) {
		if l.c.Committed != nil {
			l.c.Committed(partition, next)
		}
		if h.Committed != nil {
			h.Committed(next)
		}
	}
	if h.Moved == nil {
		h.Moved = func(int64) {}
	}
	if h.Lost == nil {
		h.Lost = &atomic.Int64{}
	}
	// A stored position is where reading goes on; start is only for a
	// lane that has none.
	if position >= 0 {
		start = position
	}
	src, err := OpenPartition(PartitionConfig{
		Brokers: l.c.Brokers, Topic: l.c.Topic, Partition: l.c.Partition, Dialer: l.c.Dialer,
		ReadCommitted: l.c.ReadCommitted, MaxWait: l.c.MaxWait, BatchSize: l.c.BatchSize, Linger: l.c.Linger, Log: l.c.Log,
		Bounds: l.Bounds, Committed: committed, Lost: h.Lost, Moved: h.Moved, NewLog: h.NewLog,
	}, position, start)
	if err != nil {
		return nil, err
	}
	return kafkaReader{src}, nil
}

// kafkaReader is a partition's reader: nothing ends it for good but the
// generation.
type kafkaReader struct{ *Partition }

func (kafkaReader) Err() error { return nil }

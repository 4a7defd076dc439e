package projection

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	kafkasrc "github.com/projector/projector/source/kafka"
)

// kafkaLane is one partition of the group's assignment as a [Lane]:
// fenced, a log.
type kafkaLane struct {
	topic     string
	partition int
	brokers   []string
	dialer    *kafka.Dialer
	// readCommitted, maxWait, batchSize and linger are how it is read.
	readCommitted bool
	maxWait       time.Duration
	batchSize     int
	linger        time.Duration
	log           *slog.Logger
	// committed hands acknowledged positions to the generation's
	// committer.
	committed func(partition int, next int64)
}

var _ Lane = (*kafkaLane)(nil)

func (l *kafkaLane) Scope() (string, int) { return l.topic, l.partition }

func (l *kafkaLane) Caps() LaneCaps { return LaneCaps{Fenced: true, Log: true} }

// Bounds reads the partition's first offset and its high watermark: a
// position up to the high watermark is in the log, also past the last
// stable offset.
func (l *kafkaLane) Bounds(ctx context.Context) (first, end int64, err error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := kafkasrc.DialLog(dctx, l.dialer, l.brokers, l.topic, l.partition)
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
func (l *kafkaLane) RecordAt(ctx context.Context, offset int64) (Record, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := kafkasrc.DialLog(dctx, l.dialer, l.brokers, l.topic, l.partition)
	if err != nil {
		return Record{}, err
	}
	defer conn.Close()
	stop := context.AfterFunc(dctx, func() { conn.Close() })
	defer stop()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	lf, err := conn.Fetch(offset, 1<<20, 100*time.Millisecond, false)
	if err != nil {
		return Record{}, fmt.Errorf("read %s/%d at %d: %w", l.topic, l.partition, offset, err)
	}
	defer lf.Close()
	m, ok, err := lf.Next()
	switch {
	case err != nil:
		return Record{}, fmt.Errorf("read %s/%d at %d: %w", l.topic, l.partition, offset, err)
	case !ok:
		return Record{}, fmt.Errorf("read %s/%d at %d: no record", l.topic, l.partition, offset)
	}
	return m, nil
}

// Open starts the partition's fetcher. It does not wait for the brokers:
// a partition that cannot be read shows as errors from Fetch.
func (l *kafkaLane) Open(ctx context.Context, position, start int64, h LaneHooks) (Reader, error) {
	src, err := kafkasrc.OpenPartition(kafkasrc.PartitionConfig{
		Brokers: l.brokers, Topic: l.topic, Partition: l.partition, Dialer: l.dialer,
		ReadCommitted: l.readCommitted, MaxWait: l.maxWait, BatchSize: l.batchSize, Linger: l.linger, Log: l.log,
		Bounds: l.Bounds, Committed: l.committed, Lost: h.Lost, Moved: h.Moved, NewLog: h.NewLog,
	}, position, start)
	if err != nil {
		return nil, err
	}
	return kafkaReader{src}, nil
}

// kafkaReader is a partition's reader: nothing ends it for good but the
// generation.
type kafkaReader struct{ *kafkasrc.Partition }

func (kafkaReader) Err() error { return nil }

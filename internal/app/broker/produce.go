package broker

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"
)

// Record is a record to produce at an explicit partition. A nil Value is a
// tombstone (a null value on the wire), an empty one is a zero-length value.
type Record struct {
	Partition  int
	Key, Value []byte
	Headers    []kafka.Header
}

// A produce request carries at most this many records or bytes for one
// partition. The bytes stay well under the broker's message.max.bytes
// (1 MiB + 12 in kfake, as in Kafka), counting a generous per-record overhead.
const (
	maxBatchRecords = 5000
	maxBatchBytes   = 512 << 10
	recordOverhead  = 64
)

// parallelPartitions bounds how many partitions Produce writes at once.
const parallelPartitions = 8

// Produce writes recs to topic, each to its own Partition, and returns the
// offset the broker assigned to each, in the order of recs. It waits for
// every record to be acknowledged by all in-sync replicas (RequireAll).
//
// Records for one partition are appended in the order given, in batches of
// up to 5000 (one round trip each, never one per record); partitions are
// written concurrently. Offsets within one call are consecutive per
// partition. On error some batches may have been written: the topic is
// a test's own, so callers start again with a new one rather than retry.
func (c *Cluster) Produce(ctx context.Context, topic string, recs ...Record) ([]int64, error) {
	offsets := make([]int64, len(recs))
	if len(recs) == 0 {
		return offsets, nil
	}

	byPartition := make(map[int][]int) // partition -> indexes into recs, in order
	for i, r := range recs {
		if r.Partition < 0 {
			return nil, fmt.Errorf("broker: produce %s: record %d has partition %d", topic, i, r.Partition)
		}
		byPartition[r.Partition] = append(byPartition[r.Partition], i)
	}

	now := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallelPartitions)
	for p, idx := range byPartition {
		g.Go(func() error {
			for len(idx) > 0 {
				n, size := 0, 0
				for n < len(idx) && n < maxBatchRecords {
					r := recs[idx[n]]
					size += len(r.Key) + len(r.Value) + recordOverhead
					for _, h := range r.Headers {
						size += len(h.Key) + len(h.Value)
					}
					if n > 0 && size > maxBatchBytes {
						break
					}
					n++
				}
				base, err := c.produceBatch(gctx, topic, p, recs, idx[:n], now)
				if err != nil {
					return fmt.Errorf("broker: produce %s p%d (record %d): %w", topic, p, idx[0], err)
				}
				for i, ri := range idx[:n] {
					offsets[ri] = base + int64(i)
				}
				idx = idx[n:]
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return offsets, nil
}

// produceBatch sends recs[idx...] to one partition in one request and returns
// the offset of the first.
func (c *Cluster) produceBatch(ctx context.Context, topic string, partition int, recs []Record, idx []int, now time.Time) (int64, error) {
	batch := make([]kafka.Record, len(idx))
	for i, ri := range idx {
		r := recs[ri]
		batch[i] = kafka.Record{
			Time:    now,
			Key:     kafka.NewBytes(r.Key),
			Value:   kafka.NewBytes(r.Value),
			Headers: r.Headers,
		}
	}
	resp, err := c.client.Produce(ctx, &kafka.ProduceRequest{
		Topic:        topic,
		Partition:    partition,
		RequiredAcks: kafka.RequireAll,
		Records:      kafka.NewRecordReader(batch...),
	})
	if err != nil {
		return 0, err
	}
	if resp.Error != nil {
		return 0, resp.Error
	}
	for i, err := range resp.RecordErrors {
		return 0, fmt.Errorf("record %d of batch: %w", i, err)
	}
	return resp.BaseOffset, nil
}

// ProduceKeyed writes msgs to topic through a kafka.Writer that picks the
// partition from the key with kafka.Murmur2Balancer, the Java client's
// partitioner, so generated streams land where a Java producer would put
// them. A message with a nil key goes to a random partition. Messages of one
// key keep their order. It waits for every message to be acknowledged by all
// in-sync replicas. The messages' Topic and Partition must be unset.
func (c *Cluster) ProduceKeyed(ctx context.Context, topic string, msgs ...kafka.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	w := &kafka.Writer{
		Addr:      kafka.TCP(c.addrs...),
		Topic:     topic,
		Balancer:  &kafka.Murmur2Balancer{},
		Transport: c.transport,
		// The defaults (100 records, 1 s linger, no acks for a literal
		// Writer) make a large write crawl and return before the broker
		// has the records. BatchBytes stays at kafka-go's 1 MiB, which
		// fits the broker's message.max.bytes.
		RequiredAcks: kafka.RequireAll,
		BatchSize:    maxBatchRecords,
		BatchTimeout: 2 * time.Millisecond,
	}
	err := w.WriteMessages(ctx, msgs...)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("broker: produce keyed %s: %w", topic, err)
	}
	return nil
}

// HighWatermarks returns, for each partition of topic, its high watermark:
// the offset the next record produced there will get (Kafka's "latest"
// offset, kafka.LastOffset). With no transactions in flight, a consumer that
// has read every record stands at this offset.
func (c *Cluster) HighWatermarks(ctx context.Context, topic string) (map[int]int64, error) {
	n, err := c.Partitions(ctx, topic)
	if err != nil {
		return nil, err
	}
	reqs := make([]kafka.OffsetRequest, n)
	for p := range n {
		// kafka-go sends each entry as its own request to the
		// partition's leader and merges the answers.
		reqs[p] = kafka.LastOffsetOf(p)
	}
	resp, err := c.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{
		Topics: map[string][]kafka.OffsetRequest{topic: reqs},
	})
	if err != nil {
		return nil, fmt.Errorf("broker: high watermarks of %s: %w", topic, err)
	}
	hw := make(map[int]int64, n)
	for _, po := range resp.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("broker: high watermarks of %s p%d: %w", topic, po.Partition, po.Error)
		}
		hw[po.Partition] = po.LastOffset
	}
	if len(hw) != n {
		return nil, fmt.Errorf("broker: high watermarks of %s: %d partitions answered, want %d", topic, len(hw), n)
	}
	return hw, nil
}

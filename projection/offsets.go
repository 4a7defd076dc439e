package projection

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// HighWatermarks asks the brokers for the end offset of every partition of
// topic, for lag reporting.
func HighWatermarks(ctx context.Context, brokers []string, topic string) (map[int]int64, error) {
	if len(brokers) == 0 {
		return nil, fmt.Errorf("projection: no brokers")
	}
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: &kafka.Transport{}}
	meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("projection: metadata of %s: %w", topic, err)
	}
	var reqs []kafka.OffsetRequest
	for _, t := range meta.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			return nil, fmt.Errorf("projection: topic %s: %w", topic, t.Error)
		}
		for _, p := range t.Partitions {
			reqs = append(reqs, kafka.LastOffsetOf(p.ID))
		}
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("projection: topic %s has no partitions", topic)
	}
	res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("projection: list offsets of %s: %w", topic, err)
	}
	out := map[int]int64{}
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("projection: offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
		out[po.Partition] = po.LastOffset
	}
	return out, nil
}

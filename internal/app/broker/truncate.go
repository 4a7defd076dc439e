package broker

import (
	"context"
	"fmt"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DeleteRecords deletes the records of topic's partition below before, as
// retention does: the partition's log then starts at before.
func (c *Cluster) DeleteRecords(ctx context.Context, topic string, partition int, before int64) error {
	req := kmsg.NewPtrDeleteRecordsRequest()
	req.TimeoutMillis = 5000
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewDeleteRecordsRequestTopicPartition()
	rp.Partition, rp.Offset = int32(partition), before
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	// kafka-go has no DeleteRecords; franz-go's client sends it to the
	// partition's leader.
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.addrs...))
	if err != nil {
		return fmt.Errorf("broker: delete records of %s/%d below %d: %w", topic, partition, before, err)
	}
	defer cl.Close()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("broker: delete records of %s/%d below %d: %w", topic, partition, before, err)
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				return fmt.Errorf("broker: delete records of %s/%d below %d: %w", topic, partition, before, kafka.Error(p.ErrorCode))
			}
		}
	}
	return nil
}

// DeleteTopic deletes topic and returns once a fresh metadata request no
// longer shows it.
func (c *Cluster) DeleteTopic(ctx context.Context, topic string) error {
	resp, err := c.client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	if err != nil {
		return fmt.Errorf("broker: delete topic %s: %w", topic, err)
	}
	if err := resp.Errors[topic]; err != nil {
		return fmt.Errorf("broker: delete topic %s: %w", topic, err)
	}
	if err := poll(ctx, func() bool {
		ps, err := c.readPartitions(ctx, topic)
		return err != nil || len(ps) == 0
	}); err != nil {
		return fmt.Errorf("broker: delete topic %s: %w", topic, err)
	}
	c.refreshMetadata()
	return nil
}

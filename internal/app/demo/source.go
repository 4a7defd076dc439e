package demo

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"golang.org/x/sync/errgroup"

	"github.com/projector/projector/internal/app/broker"
	"github.com/projector/projector/internal/app/jobgen"
	"github.com/projector/projector/internal/app/sqsemu"
	"github.com/projector/projector/projection"
	"github.com/projector/projector/source/sqs/sqscfg"
	"github.com/projector/projector/store"
)

// feed is where the demo's stream goes and the engine reads it from.
type feed interface {
	describe() string
	// configure points the engine at the source.
	configure(c *projection.Config)
	produce(ctx context.Context, recs []jobgen.Record) error
	// lag is what is left to project, and how much was produced.
	lag(ctx context.Context, st *store.Store) (lag, total int64, err error)
	close()
}

// kafkaFeed is a topic on the in-process broker.
type kafkaFeed struct {
	cluster *broker.Cluster
	topic   string
}

func startBroker(ctx context.Context, partitions int) (*kafkaFeed, error) {
	cluster, err := broker.Start()
	if err != nil {
		return nil, fmt.Errorf("demo: start the in-process Kafka broker: %w", err)
	}
	f := &kafkaFeed{cluster: cluster, topic: "job-events"}
	if err := cluster.CreateTopic(ctx, f.topic, partitions); err != nil {
		cluster.Close()
		return nil, fmt.Errorf("demo: create topic: %w", err)
	}
	return f, nil
}

func (f *kafkaFeed) describe() string {
	return fmt.Sprintf("broker   in-process Kafka protocol on %s, topic %s", strings.Join(f.cluster.Addrs(), ","), f.topic)
}

func (f *kafkaFeed) configure(c *projection.Config) {
	c.Brokers, c.Topic, c.Group, c.MaxWait = f.cluster.Addrs(), f.topic, "projector-demo", 250*time.Millisecond
	c.HeartbeatInterval, c.SessionTimeout = broker.GroupHeartbeatInterval, broker.GroupSessionTimeout
	c.RebalanceTimeout, c.JoinGroupBackoff = broker.GroupRebalanceTimeout, broker.GroupJoinBackoff
	c.PartitionWatchInterval = broker.GroupPartitionWatchInterval
}

func (f *kafkaFeed) produce(ctx context.Context, stream []jobgen.Record) error {
	recs := make([]broker.Record, len(stream))
	for i, r := range stream {
		recs[i] = broker.Record{Partition: r.Partition, Key: r.Key, Value: r.Value}
	}
	for len(recs) > 0 {
		n := min(len(recs), 2000)
		if _, err := f.cluster.Produce(ctx, f.topic, recs[:n]...); err != nil {
			return err
		}
		recs = recs[n:]
	}
	return nil
}

func (f *kafkaFeed) lag(ctx context.Context, st *store.Store) (int64, int64, error) {
	hwm, err := f.cluster.HighWatermarks(ctx, f.topic)
	if err != nil {
		return 0, 0, err
	}
	pos, err := st.Positions(ctx)
	if err != nil {
		return 0, 0, err
	}
	var lag, total int64
	have := map[int]int64{}
	for _, ps := range pos {
		have[ps.Partition] = ps.NextOffset
	}
	for part, h := range hwm {
		total += h
		lag += h - max(have[part], 0)
	}
	return lag, total, nil
}

func (f *kafkaFeed) close() { f.cluster.Close() }

// queueFeed is a FIFO queue on the SQS emulator. Each record is sent with
// its job as its message group, except a misrouted one, which goes to a
// group of strays: SQS then keeps no order for it, as Kafka keeps none for
// a record in another partition. Every record has a deduplication id of
// its own, so the stream's duplicates arrive.
type queueFeed struct {
	emu    *sqsemu.Emulator
	client *sqs.Client
	url    string
	sent   atomic.Int64
	state  *projection.SQS
}

func startQueue(ctx context.Context) (*queueFeed, error) {
	emu, err := sqsemu.Start(ctx)
	if err != nil {
		return nil, fmt.Errorf("demo: start the SQS emulator: %w", err)
	}
	url, err := emu.CreateFIFO(ctx, "job-events.fifo", 30*time.Second)
	if err != nil {
		emu.Close()
		return nil, err
	}
	f := &queueFeed{emu: emu, client: emu.Client(), url: url}
	f.state = &projection.SQS{QueueURL: url, Endpoint: emu.Endpoint, Region: sqsemu.Region, Wait: time.Second, Visibility: 30 * time.Second,
		Credentials: &sqscfg.Credentials{AccessKeyID: sqsemu.AccessKey, SecretAccessKey: sqsemu.SecretKey}}
	return f, nil
}

func (f *queueFeed) describe() string {
	return fmt.Sprintf("queue    SQS emulator (fauxqs) on %s, FIFO queue %s", f.emu.Endpoint, f.url)
}

func (f *queueFeed) configure(c *projection.Config) {
	c.Source, c.SQS = projection.SourceSQS, *f.state
}

// produce sends the records ten per request, from four senders that each
// own a quarter of the groups, so each group's records keep their order.
func (f *queueFeed) produce(ctx context.Context, recs []jobgen.Record) error {
	const senders = 4
	lanes := make([][]int, senders)
	group := func(r jobgen.Record) string {
		if r.Fault == "misrouted" {
			return "strays"
		}
		return string(r.Key)
	}
	for i, r := range recs {
		h := fnv.New32a()
		h.Write([]byte(group(r)))
		lanes[h.Sum32()%senders] = append(lanes[h.Sum32()%senders], i)
	}
	c := f.client
	// Deduplication ids run on across calls: a record of a later call
	// is not a duplicate of the one an earlier call sent at its index.
	base := f.sent.Load()
	g, gctx := errgroup.WithContext(ctx)
	for _, lane := range lanes {
		g.Go(func() error {
			for len(lane) > 0 {
				n := min(len(lane), 10)
				entries := make([]types.SendMessageBatchRequestEntry, n)
				for k, i := range lane[:n] {
					entries[k] = types.SendMessageBatchRequestEntry{
						Id: aws.String(strconv.Itoa(k)), MessageBody: aws.String(string(recs[i].Value)),
						MessageGroupId: aws.String(group(recs[i])), MessageDeduplicationId: aws.String(strconv.FormatInt(base+int64(i), 10)),
					}
				}
				out, err := c.SendMessageBatch(gctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(f.url), Entries: entries})
				if err != nil {
					return err
				}
				if len(out.Failed) > 0 {
					return fmt.Errorf("send: %s: %s", aws.ToString(out.Failed[0].Code), aws.ToString(out.Failed[0].Message))
				}
				f.sent.Add(int64(n))
				lane = lane[n:]
			}
			return nil
		})
	}
	return g.Wait()
}

func (f *queueFeed) lag(ctx context.Context, _ *store.Store) (int64, int64, error) {
	out, err := f.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(f.url),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages,
			types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		return 0, 0, fmt.Errorf("demo: queue attributes: %w", err)
	}
	var lag int64
	for _, v := range out.Attributes {
		n, _ := strconv.ParseInt(v, 10, 64)
		lag += n
	}
	return lag, f.sent.Load(), nil
}

func (f *queueFeed) close() { f.emu.Close() }

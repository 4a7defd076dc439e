package kafka_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/projector/projector/internal/testkit/kafkatest"
	"github.com/projector/projector/source/kafka"
	"github.com/projector/projector/source/sourcetest"
)

// TestConformance runs the source conformance suite against partition
// lanes of a kfake broker, reached over TCP by kafka-go through a link the
// suite can cut: a topic of one partition per case.
func TestConformance(t *testing.T) {
	c := kafkatest.New(t)
	sourcetest.Run(t, sourcetest.Harness{
		Features: sourcetest.Features{OrderScope: sourcetest.OrderLane, Fenced: true, Log: true, Outage: true},
		New: func(t *testing.T, o sourcetest.Options) sourcetest.Env {
			topic := kafkatest.Topic(t, c, 1)
			link := sourcetest.NewLink(t)
			lane := kafka.NewLane(kafka.LaneConfig{
				Topic: topic, Partition: 0, Brokers: c.Addrs(),
				Dialer:  &kafkago.Dialer{Timeout: 5 * time.Second, DialFunc: link.DialContext},
				MaxWait: 200 * time.Millisecond, BatchSize: o.BatchSize, Linger: 20 * time.Millisecond,
				Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			return sourcetest.Env{
				Lane: lane,
				Link: link,
				Produce: func(t *testing.T, msgs ...sourcetest.Message) {
					t.Helper()
					recs := make([]kafkatest.Record, len(msgs))
					for i, m := range msgs {
						recs[i] = kafkatest.Record{Partition: 0, Key: []byte(m.Key), Value: []byte(m.Value)}
					}
					if _, err := c.Produce(t.Context(), topic, recs...); err != nil {
						t.Fatalf("produce to %s: %v", topic, err)
					}
				},
			}
		},
	})
}

package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/kafkatest"
)

// LogStarts tells a rebuild's swap where the partitions it did not read
// begin: after retention deleted the start of one, that is its new start.
func TestLogStartsFollowRetention(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := kafkatest.New(t)
	topic := kafkatest.Topic(t, c, 3)
	for i := range 10 {
		_, err := c.Produce(ctx, topic, kafkatest.Record{Partition: 0, Value: []byte(`{}`), Key: []byte{byte(i)}},
			kafkatest.Record{Partition: 1, Value: []byte(`{}`)})
		require.NoError(t, err)
	}
	require.NoError(t, c.DeleteRecords(ctx, topic, 0, 4))
	starts, err := LogStarts(ctx, Config{Brokers: c.Addrs()}, topic, []int{0, 1, 2})
	require.NoError(t, err)
	require.Equal(t, map[int]int64{0: 4, 1: 0, 2: 0}, starts)
}

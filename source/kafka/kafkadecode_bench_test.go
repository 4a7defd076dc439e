package kafka

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/kafkatest"
)

// BenchmarkReadPartition reads a partition of 100,000 records of about
// 200 bytes, whole, as the fetcher reads it ([logConn], read committed)
// and as it read it before, through kafka-go's Conn (read uncommitted,
// markers as messages), to compare the cost per record:
//
//	go test -run XXX -bench ReadPartition -benchmem ./projection/
func BenchmarkReadPartition(b *testing.B) {
	c := kafkatest.New(b)
	topic := kafkatest.Topic(b, c, 1)
	const n = 100_000
	value := strings.Repeat("x", 200)
	recs := make([]kafkatest.Record, n)
	for i := range recs {
		recs[i] = kafkatest.Record{Key: []byte(fmt.Sprint("job-", i%5000)), Value: []byte(value)}
	}
	_, err := c.Produce(context.Background(), topic, recs...)
	require.NoError(b, err)
	d := &kafkago.Dialer{Timeout: 10 * time.Second}
	ctx := context.Background()

	b.Run("logConn", func(b *testing.B) {
		conn, err := DialLog(ctx, d, c.Addrs(), topic, 0)
		require.NoError(b, err)
		defer conn.Close()
		b.ResetTimer()
		for range b.N {
			next, read := int64(0), 0
			for next < n {
				lf, err := conn.Fetch(next, fetchMaxBytes, time.Second, true)
				require.NoError(b, err)
				for {
					_, ok, err := lf.Next()
					require.NoError(b, err)
					if !ok {
						break
					}
					read++
				}
				next = lf.next
				require.NoError(b, lf.Close())
			}
			require.Equal(b, n, read)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/record")
	})
	b.Run("kafka-go Conn", func(b *testing.B) {
		conn, err := d.DialLeader(ctx, "tcp", c.Addrs()[0], topic, 0)
		require.NoError(b, err)
		defer conn.Close()
		b.ResetTimer()
		for range b.N {
			next, read := int64(0), 0
			for next < n {
				_, err := conn.Seek(next, kafkago.SeekAbsolute|kafkago.SeekDontCheck)
				require.NoError(b, err)
				batch := conn.ReadBatchWith(kafkago.ReadBatchConfig{MinBytes: 1, MaxBytes: fetchMaxBytes, MaxWait: time.Second})
				for {
					m, err := batch.ReadMessage()
					if err != nil {
						break
					}
					next = m.Offset + 1
					read++
				}
				require.NoError(b, batch.Close())
			}
			require.Equal(b, n, read)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/record")
	})
}

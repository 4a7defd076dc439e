package projection

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/kafkatest"
	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// TestRecordsDeletedBeforeTheyWereReadAreReportedAndTheStreamResumes: the
// stored position is below the log start because retention deleted records
// nobody had read. Nothing can read them any more; the worker must say so
// and count them, not retry the lost position for ever in silence, and go
// on from the log start.
func TestRecordsDeletedBeforeTheyWereReadAreReportedAndTheStreamResumes(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	ctx := context.Background()
	topic := fmt.Sprintf("retention-%d", time.Now().UnixNano())
	require.NoError(t, c.CreateTopic(ctx, topic, 1, kafka.ConfigEntry{ConfigName: "retention.bytes", ConfigValue: "1"}))
	r := &rig{t: t, kafka: c, topic: topic, store: pgtest.Store(t), parts: 1}

	// Offsets 0-2 go, by retention; 3-4 come after.
	r.produce(rec{0, "a", snap("a", 1, `{"n":1}`)}, rec{0, "a", snap("a", 2, `{"n":2}`)})
	r.produce(rec{0, "b", snap("b", 1, `{"n":1}`)})
	c.Kfake().ApplyRetention()
	r.produce(rec{0, "c", snap("c", 1, `{"n":1}`)}, rec{0, "a", snap("a", 3, `{"n":3}`)})

	// A previous owner had read nothing but the first record.
	claim, err := r.store.Claim(ctx, topic, 0, "previous")
	require.NoError(t, err)
	_, err = r.store.Apply(ctx, newPositionBatch(topic, claim.Epoch, 1))
	require.NoError(t, err)

	run := r.start(r.config())
	r.caughtUp(20*time.Second, run)
	rows := r.rows()
	require.Equal(t, int64(3), rows["a"].Version)
	require.Equal(t, int64(1), rows["c"].Version)
	require.NotContains(t, rows, "b", "b's only record was deleted before anyone read it")
	c2 := run.p.Status().Counters
	require.Equal(t, int64(2), c2.Lost, "offsets 1 and 2 were deleted unread, and reported")
	require.Equal(t, int64(2), c2.Consumed)
}

func newPositionBatch(topic string, epoch, next int64) *store.Batch {
	return &store.Batch{Topic: topic, Partition: 0, Epoch: epoch, NextOffset: next}
}

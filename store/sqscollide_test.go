package store_test

import (
	"context"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// TestSQSQuarantineOffsetCollision: the offset of an SQS record only
// stands for its message (its sequence number modulo 2^63), so two
// messages may share one. Both are quarantined, each under its own message
// id, whether they meet in one batch or in two, while a message delivered
// again is not quarantined twice.
func TestSQSQuarantineOffsetCollision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.Store(t)
	bad := func(msg, seq string) store.Bad {
		return store.Bad{Partition: -1, Offset: 7, Key: []byte(msg), Value: []byte(`{}`), Err: "bad " + msg,
			Coordinate: store.Coordinate{MessageID: msg, SequenceNumber: seq}}
	}
	apply := func(bs ...store.Bad) {
		t.Helper()
		_, err := s.Apply(ctx, &store.Batch{Topic: "sqs:q.fifo", Unfenced: true, NextOffset: 8, Bad: bs,
			// The batch's coordinates by offset can name only one of them.
			Coordinates: map[int64]store.Coordinate{7: bs[len(bs)-1].Coordinate}})
		require.NoError(t, err)
	}
	// 7 and 7 + 2^63 share the offset 7.
	apply(bad("m-a", "7"), bad("m-b", "9223372036854775815"))
	apply(bad("m-c", "18446744073709551623"))
	apply(bad("m-a", "7"), bad("m-c", "18446744073709551623")) // delivered again
	q, total, err := s.Quarantine(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 3, total, "%+v", q)
	var got []string
	offsets := map[int64]bool{}
	for _, r := range q {
		got = append(got, r.Coordinate.MessageID+" "+r.Coordinate.SequenceNumber+" "+string(r.Key))
		offsets[r.Offset] = true
	}
	sort.Strings(got)
	require.Equal(t, []string{"m-a 7 m-a", "m-b 9223372036854775815 m-b", "m-c 18446744073709551623 m-c"}, got)
	require.Len(t, offsets, 3, "each at an offset of its own")
	require.True(t, offsets[7])

	// A Kafka record's offset is its own: the same offset again is the
	// same record, quarantined once.
	claim, err := s.Claim(ctx, "t", 0, "me")
	require.NoError(t, err)
	for range 2 {
		_, err = s.Apply(ctx, &store.Batch{Topic: "t", Epoch: claim.Epoch, NextOffset: 8,
			Bad: []store.Bad{{Partition: -1, Offset: 7, Value: []byte(`{}`), Err: "bad"}}})
		require.NoError(t, err)
	}
	_, total, err = s.Quarantine(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 4, total)
}

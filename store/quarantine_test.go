package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// TestUnquarantineIsConditional: a replayed write applies only where the
// row is still what it was computed from, and the record leaves the
// quarantine in the same transaction, or not at all.
func TestUnquarantineIsConditional(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.Store(t)
	claim, err := s.Claim(ctx, "t", 0, "me")
	require.NoError(t, err)
	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: claim.Epoch, NextOffset: 3,
		Snapshots: []store.Write{{JobID: "j", Version: 2, State: []byte(`{"a":2}`)}},
		Bad: []store.Bad{{Partition: -1, Offset: 1, Key: []byte("j"), Value: []byte(`{}`), Err: "refused"},
			{Partition: -1, Offset: 2, Key: []byte("k"), Value: []byte(`{}`), Err: "refused"}}})
	require.NoError(t, err)
	recs, err := s.QuarantineRecords(ctx, store.QuarantineFilter{})
	require.NoError(t, err)
	require.Len(t, recs, 2)
	q := recs[1] // newest first: offset 1 is the older
	require.Equal(t, int64(1), q.Offset)

	// Computed from v1, but the row is at v2: nothing changes.
	err = s.Unquarantine(ctx, q, &store.Write{JobID: "j", Version: 2, State: []byte(`{"a":"x"}`), Expect: 1})
	var stale *store.StaleError
	require.True(t, errors.As(err, &stale), "%v", err)
	rows, err := s.LoadJobs(ctx, []string{"j"})
	require.NoError(t, err)
	require.JSONEq(t, `{"a":2}`, string(rows["j"].State))
	left, err := s.QuarantineRecords(ctx, store.QuarantineFilter{IDs: []int64{q.ID}})
	require.NoError(t, err)
	require.Len(t, left, 1, "the record stays")

	// Computed from v2: it applies and the record leaves.
	require.NoError(t, s.Unquarantine(ctx, q, &store.Write{JobID: "j", Version: 3, State: []byte(`{"a":3}`), Expect: 2, Offset: q.Offset}))
	rows, err = s.LoadJobs(ctx, []string{"j"})
	require.NoError(t, err)
	require.Equal(t, int64(3), rows["j"].Version)
	left, err = s.QuarantineRecords(ctx, store.QuarantineFilter{})
	require.NoError(t, err)
	require.Len(t, left, 1)
	require.Equal(t, int64(2), left[0].Offset)

	// A new reason is written once; the same reason writes nothing.
	require.NoError(t, s.Requarantine(ctx, left[0].ID, "still refused\x00"))
	again, err := s.QuarantineRecords(ctx, store.QuarantineFilter{IDs: []int64{left[0].ID}})
	require.NoError(t, err)
	require.Equal(t, "still refused", again[0].Error)

	n, err := s.PurgeQuarantine(ctx, again[0].Time)
	require.NoError(t, err)
	require.Zero(t, n, "purge --before deletes only what is older")
	n, err = s.PurgeQuarantine(ctx, again[0].Time.Add(time.Microsecond))
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

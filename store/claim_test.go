package store_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
)

// ClaimFrom stores its start in the statement that takes the partition,
// only while no position is stored; a stored position always wins.
func TestClaimFromStoresTheStartOnlyWhenNothingIsStored(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx := context.Background()

	next, err := s.NextOffset(ctx, "t", 0)
	require.NoError(t, err)
	require.Equal(t, int64(-1), next, "never claimed")

	// First claim of a partition never seen: the start is its position.
	c, err := s.ClaimFrom(ctx, "t", 0, "a", 7)
	require.NoError(t, err)
	require.Equal(t, int64(1), c.Epoch)
	require.Equal(t, int64(7), c.NextOffset)
	next, err = s.NextOffset(ctx, "t", 0)
	require.NoError(t, err)
	require.Equal(t, int64(7), next, "stored by the claim itself")

	// A later claim with another start keeps the stored position.
	c, err = s.ClaimFrom(ctx, "t", 0, "b", 12)
	require.NoError(t, err)
	require.Equal(t, int64(2), c.Epoch)
	require.Equal(t, int64(7), c.NextOffset, "a stored position wins over the start")

	// A row claimed earlier without a start (position -1) takes one.
	c, err = s.Claim(ctx, "t", 1, "a")
	require.NoError(t, err)
	require.Equal(t, int64(-1), c.NextOffset)
	c, err = s.ClaimFrom(ctx, "t", 1, "b", 3)
	require.NoError(t, err)
	require.Equal(t, int64(2), c.Epoch)
	require.Equal(t, int64(3), c.NextOffset)

	// A claim without a start stores nothing.
	c, err = s.ClaimFrom(ctx, "t", 2, "a", -1)
	require.NoError(t, err)
	require.Equal(t, int64(-1), c.NextOffset)

	_, err = s.ClaimFrom(ctx, "t", 3, "a", -2)
	require.Error(t, err)
}

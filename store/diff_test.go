package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// TestDiffCountsEveryDriftAndSamplesTheFirstIDs: the dry run's comparison
// counts every differing job and shows the first ids of each kind, in
// order, no more than asked for.
func TestDiffCountsEveryDriftAndSamplesTheFirstIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	live, err := store.New(pgtest.Pool(t), store.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, live.Migrate(ctx))
	shadow, err := live.Shadow()
	require.NoError(t, err)
	require.NoError(t, shadow.Migrate(ctx))
	sc, err := shadow.Claim(ctx, "t", 0, "shadow")
	require.NoError(t, err)
	lc, err := live.Claim(ctx, "t", 0, "live")
	require.NoError(t, err)
	var missing []store.Write
	for i := range 15 {
		missing = append(missing, store.Write{JobID: fmt.Sprintf("m%02d", 14-i), Version: 1, State: json.RawMessage(`{}`)})
	}
	_, err = shadow.Apply(ctx, &store.Batch{Topic: "t", Epoch: sc.Epoch, NextOffset: 15, Snapshots: append(missing,
		store.Write{JobID: "b", Version: 2, State: json.RawMessage(`{}`)})})
	require.NoError(t, err)
	_, err = live.Apply(ctx, &store.Batch{Topic: "t", Epoch: lc.Epoch, NextOffset: 2, Snapshots: []store.Write{
		{JobID: "b", Version: 1, State: json.RawMessage(`{}`)}, {JobID: "x", Version: 1, State: json.RawMessage(`{}`)}}})
	require.NoError(t, err)

	d, err := live.Diff(ctx, shadow, 10)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"missing": 15, "behind": 1, "extra": 1}, d.Counts)
	require.Equal(t, []string{"m00", "m01", "m02", "m03", "m04", "m05", "m06", "m07", "m08", "m09"}, d.Samples["missing"])
	require.Equal(t, []string{"b"}, d.Samples["behind"])
	require.Equal(t, []string{"x"}, d.Samples["extra"])
}

package projection

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// TestReplayRoundsAndOutcomes: a delta quarantined before the one it waits
// for applies in a second round; a delta whose predecessor never comes
// stays, waiting; a record that still does not decode stays, refused; a
// duplicate leaves.
func TestReplayRoundsAndOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Store(t)
	claim, err := st.Claim(ctx, "t", 0, "me")
	require.NoError(t, err)
	inc := func(v int, by int) []byte {
		return []byte(`{"job_id":"j","version":` + itoa(v) + `,"kind":"delta","ops":[{"op":"increment","path":"/n","by":` + itoa(by) + `}]}`)
	}
	_, err = st.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: claim.Epoch, NextOffset: 10,
		Snapshots: []store.Write{{JobID: "j", Version: 1, State: []byte(`{"n":0}`)}},
		Bad: []store.Bad{
			{Partition: -1, Offset: 1, Key: []byte("j"), Value: inc(3, 3), Err: "x"},
			{Partition: -1, Offset: 2, Key: []byte("j"), Value: inc(2, 2), Err: "x"},
			{Partition: -1, Offset: 3, Key: []byte("g"), Value: []byte("garbage"), Err: "x"},
			{Partition: -1, Offset: 4, Key: []byte("j"), Value: inc(5, 5), Err: "x"},
			{Partition: -1, Offset: 5, Key: []byte("j"), Value: inc(1, 1), Err: "x"},
		}})
	require.NoError(t, err)
	ids, err := st.QuarantineIDs(ctx)
	require.NoError(t, err)
	require.Len(t, ids, 5)

	rep, err := Replay(ctx, st, ids)
	require.NoError(t, err)
	require.Equal(t, ReplayReport{Replayed: 5, Applied: 2, Duplicates: 1, Refused: 1, Waiting: 1}, rep)
	rows, err := st.LoadJobs(ctx, []string{"j"})
	require.NoError(t, err)
	require.Equal(t, int64(3), rows["j"].Version)
	require.JSONEq(t, `{"n":5}`, string(rows["j"].State))

	left, err := st.QuarantineRecords(ctx, store.QuarantineFilter{})
	require.NoError(t, err)
	require.Len(t, left, 2)
	require.Equal(t, int64(4), left[0].Offset)
	require.Equal(t, "replay: version 5 waits for version 4 (the row is at 3); replay it again once that is applied", left[0].Error)
	require.Equal(t, int64(3), left[1].Offset)
	require.Contains(t, left[1].Error, "value")

	// Again: nothing applies, the same two stay, unchanged.
	again, err := Replay(ctx, st, ids)
	require.NoError(t, err)
	require.Equal(t, ReplayReport{Replayed: 2, Refused: 1, Waiting: 1}, again)
	still, err := st.QuarantineRecords(ctx, store.QuarantineFilter{})
	require.NoError(t, err)
	require.Equal(t, left, still)
}

func itoa(i int) string { return fmt.Sprint(i) }

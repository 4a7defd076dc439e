package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// A batch's writes go to PostgreSQL in statements of bounded size; a batch
// of many more writes than one statement takes, and of states larger than
// one statement's bytes, applies whole and reports every write, and a
// stale update in its last part rolls all of it back.
func TestABatchLargerThanAStatementAppliesWhole(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx := context.Background()
	c, err := s.Claim(ctx, "t", 0, "me")
	require.NoError(t, err)

	const n = 2500
	big := `{"blob":"` + strings.Repeat("x", 400<<10) + `"}`
	state := func(id string, v int) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"id":%q,"v":%d}`, id, v))
	}
	var snaps, inserts []store.Write
	for i := range n {
		id := fmt.Sprintf("s-%d", i)
		snaps = append(snaps, store.Write{JobID: id, Version: 1, State: state(id, 1), Offset: int64(i)})
		id = fmt.Sprintf("u-%d", i)
		inserts = append(inserts, store.Write{JobID: id, Version: 1, State: state(id, 1), Offset: int64(i), LastOps: json.RawMessage(`[]`)})
	}
	for i := range 3 { // three states of 400 KiB: over a statement's bytes
		snaps = append(snaps, store.Write{JobID: fmt.Sprintf("big-%d", i), Version: 1, State: json.RawMessage(big)})
	}
	res, err := s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: c.Epoch, NextOffset: 1, Snapshots: snaps, Updates: inserts})
	require.NoError(t, err)
	require.Len(t, res.SnapshotsApplied, n+3, "every snapshot of every part is reported")

	// Every row moves on, in updates of several statements.
	var updates []store.Write
	for _, w := range append(append([]store.Write(nil), snaps...), inserts...) {
		next := store.Write{JobID: w.JobID, Version: 2, State: state(w.JobID, 2), Expect: 1}
		updates = append(updates, next)
	}
	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: c.Epoch, NextOffset: 2, Updates: updates})
	require.NoError(t, err)
	ids := make([]string, len(updates))
	for i, w := range updates {
		ids[i] = w.JobID
	}
	jobs, err := s.LoadJobs(ctx, ids)
	require.NoError(t, err)
	require.Len(t, jobs, len(ids), "no write of any part is lost")
	for _, id := range ids {
		require.Equal(t, int64(2), jobs[id].Version, "%s", id)
		require.JSONEq(t, string(state(id, 2)), string(jobs[id].State), "%s", id)
	}

	// A conflict (the row's version with other content) is found in a
	// part after the first too, and the same content is no conflict.
	var again []store.Write
	for i := range 1500 {
		id := fmt.Sprintf("s-%d", i)
		again = append(again, store.Write{JobID: id, Version: 2, State: state(id, 2)})
	}
	again[1400].State = json.RawMessage(`{"other":true}`)
	res, err = s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: c.Epoch, NextOffset: 2, Snapshots: again})
	require.NoError(t, err)
	require.Empty(t, res.SnapshotsApplied)
	require.Equal(t, map[string]bool{"s-1400": true}, res.SnapshotConflicts)

	// A stale update in the last part rolls back the parts before it.
	for i := range updates {
		updates[i].Version, updates[i].State, updates[i].Expect = 3, state(updates[i].JobID, 3), 2
	}
	last := len(updates) - 1
	updates[last].Expect = 1
	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: c.Epoch, NextOffset: 3, Updates: updates})
	var stale *store.StaleError
	require.True(t, errors.As(err, &stale), "want a stale error, got %v", err)
	require.Equal(t, []string{updates[last].JobID}, stale.Jobs)
	jobs, err = s.LoadJobs(ctx, []string{ids[0], ids[last]})
	require.NoError(t, err)
	require.Equal(t, int64(2), jobs[ids[0]].Version, "the first part's write was rolled back with the batch")
	c2, err := s.Claim(ctx, "t", 0, "next")
	require.NoError(t, err)
	require.Equal(t, int64(2), c2.NextOffset, "the position did not move past the refused batch")
}

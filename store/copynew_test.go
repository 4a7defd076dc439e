package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// A write known new (store.Write.New) is copied in: every column as the
// insert it replaces would have written it.
func TestNewJobsAreCopiedInWithEveryColumn(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	b := newBatcher(t, s, 4)
	b.must(store.Batch{Updates: []store.Write{
		{JobID: "copied", Version: 7, State: json.RawMessage(`{"n": 7}`), Offset: 41, EventID: "e7", LastOps: json.RawMessage(`[{"op":"add","path":"/n","value":1}]`), New: true},
		{JobID: "bare", Version: 1, State: json.RawMessage(`{}`), Offset: 42, New: true},
		{JobID: "inserted", Version: 2, State: json.RawMessage(`{"n": 2}`), Offset: 43, EventID: "e2"},
	}})
	type row struct {
		version   int64
		state     string
		topic     string
		partition int32
		offset    int64
		eventID   *string
		lastOps   *string
		updated   time.Time
	}
	read := func(id string) row {
		var r row
		err := s.Pool().QueryRow(context.Background(), `SELECT version, state::text, source_topic, source_partition, source_offset, event_id, last_ops::text, updated_at
			FROM `+s.JobsTable()+` WHERE job_id = $1`, id).Scan(&r.version, &r.state, &r.topic, &r.partition, &r.offset, &r.eventID, &r.lastOps, &r.updated)
		require.NoError(t, err, id)
		return r
	}
	copied, bare, inserted := read("copied"), read("bare"), read("inserted")
	require.Equal(t, int64(7), copied.version)
	require.JSONEq(t, `{"n": 7}`, copied.state)
	require.Equal(t, "t", copied.topic)
	require.Equal(t, int32(4), copied.partition)
	require.Equal(t, int64(41), copied.offset)
	require.Equal(t, "e7", *copied.eventID)
	require.JSONEq(t, `[{"op":"add","path":"/n","value":1}]`, *copied.lastOps)
	require.Equal(t, int64(1), bare.version)
	require.JSONEq(t, `{}`, bare.state)
	require.Equal(t, int64(42), bare.offset)
	require.Nil(t, bare.eventID, "no event id is NULL, as the insert writes it")
	require.Nil(t, bare.lastOps, "no ops is NULL, as the insert writes it")
	require.Equal(t, inserted.updated, copied.updated, "updated_at is the transaction's now(), as the insert's")
	require.Equal(t, inserted.topic, bare.topic)
	require.Equal(t, inserted.partition, bare.partition)
}

// A job known new that has a row after all fails its batch as stale, and
// nothing of the batch is written.
func TestANewJobThatHasARowFailsTheBatchAsStale(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	b := newBatcher(t, s, 0)
	b.must(store.Batch{Snapshots: []store.Write{snapshotW("j", 3, `{"n": 3}`)}})
	_, err := b.apply(store.Batch{
		Snapshots: []store.Write{snapshotW("other", 1, `{}`)},
		Updates: []store.Write{
			{JobID: "k", Version: 1, State: json.RawMessage(`{"n": 1}`), New: true},
			{JobID: "j", Version: 1, State: json.RawMessage(`{"n": 1}`), New: true},
		}})
	var stale *store.StaleError
	require.True(t, errors.As(err, &stale), "got %v", err)
	require.ElementsMatch(t, []string{"k", "j"}, stale.Jobs, "every job of the copy is read again")
	v, state, ok := rowOf(t, s, "j")
	require.True(t, ok)
	require.Equal(t, int64(3), v)
	require.JSONEq(t, `{"n": 3}`, state)
	for _, id := range []string{"k", "other"} {
		_, _, ok := rowOf(t, s, id)
		require.False(t, ok, "%s: the whole batch rolled back", id)
	}
}

// A job known new that has a tombstone fails its batch as stale: the copy
// never brings back a deleted job.
func TestANewJobThatHasATombstoneFailsTheBatchAsStale(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	b := newBatcher(t, s, 0)
	b.must(store.Batch{Deletes: []store.Write{deleteW("d", 5)}})
	_, err := b.apply(store.Batch{Updates: []store.Write{
		{JobID: "fine", Version: 1, State: json.RawMessage(`{}`), New: true},
		{JobID: "d", Version: 1, State: json.RawMessage(`{"n": 1}`), New: true},
	}})
	var stale *store.StaleError
	require.True(t, errors.As(err, &stale), "got %v", err)
	require.Equal(t, []string{"d"}, stale.Jobs)
	for _, id := range []string{"d", "fine"} {
		_, _, ok := rowOf(t, s, id)
		require.False(t, ok, "%s: no row", id)
	}
	v, ok := tombstoneOf(t, s, "d")
	require.True(t, ok)
	require.Equal(t, int64(5), v)
}

// The copy is streamed a read at a time: many rows, and rows larger than
// one read, all arrive whole.
func TestManyNewJobsAreCopiedExactly(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	b := newBatcher(t, s, 1)
	var ws []store.Write
	want := map[string]string{}
	for i := range 3000 {
		id := fmt.Sprintf("job-%04d-é", i)
		state := fmt.Sprintf(`{"i": %d, "note": "%s"}`, i, strings.Repeat("x", i%97))
		if i == 1500 {
			state = fmt.Sprintf(`{"big": "%s"}`, strings.Repeat("y", 200_000))
		}
		ws = append(ws, store.Write{JobID: id, Version: int64(i + 1), State: json.RawMessage(state), Offset: int64(i), New: true})
		want[id] = state
	}
	b.must(store.Batch{Updates: ws})
	rows, err := s.Pool().Query(context.Background(), `SELECT job_id, version, state::text, source_offset FROM `+s.JobsTable())
	require.NoError(t, err)
	got := 0
	for rows.Next() {
		var id, state string
		var v, off int64
		require.NoError(t, rows.Scan(&id, &v, &state, &off))
		require.Contains(t, want, id)
		require.JSONEq(t, want[id], state, id)
		require.Equal(t, off+1, v, id)
		got++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, len(want), got)
}

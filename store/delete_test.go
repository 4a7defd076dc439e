package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// batcher applies batches to one claimed partition, each moving the
// position by one.
type batcher struct {
	t     *testing.T
	s     *store.Store
	part  int
	epoch int64
	next  int64
}

func newBatcher(t *testing.T, s *store.Store, part int) *batcher {
	c, err := s.Claim(context.Background(), "t", part, fmt.Sprint("owner-", part))
	require.NoError(t, err)
	return &batcher{t: t, s: s, part: part, epoch: c.Epoch}
}

func (b *batcher) apply(batch store.Batch) (store.Result, error) {
	b.next++
	batch.Topic, batch.Partition, batch.Epoch, batch.NextOffset = "t", b.part, b.epoch, b.next
	return b.s.Apply(context.Background(), &batch)
}

func (b *batcher) must(batch store.Batch) store.Result {
	b.t.Helper()
	res, err := b.apply(batch)
	require.NoError(b.t, err)
	return res
}

func snapshotW(id string, v int64, state string) store.Write {
	return store.Write{JobID: id, Version: v, State: json.RawMessage(state)}
}

func deleteW(id string, v int64) store.Write {
	return store.Write{JobID: id, Version: v, Deleted: true}
}

// rowOf reads the read-model table itself, as a reader does.
func rowOf(t *testing.T, s *store.Store, id string) (int64, string, bool) {
	t.Helper()
	var v int64
	var state string
	err := s.Pool().QueryRow(context.Background(), `SELECT version, state::text FROM `+s.JobsTable()+` WHERE job_id = $1`, id).Scan(&v, &state)
	if err != nil {
		require.ErrorContains(t, err, "no rows")
		return 0, "", false
	}
	return v, state, true
}

func tombstoneOf(t *testing.T, s *store.Store, id string) (int64, bool) {
	t.Helper()
	ts, err := s.Tombstones(context.Background(), []string{id})
	require.NoError(t, err)
	tomb, ok := ts[id]
	return tomb.Version, ok
}

func TestDeleteIsVersionedLikeASnapshot(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	b := newBatcher(t, s, 0)

	b.must(store.Batch{Snapshots: []store.Write{snapshotW("a", 1, `{"n":1}`)}})
	res := b.must(store.Batch{Deletes: []store.Write{deleteW("a", 3), deleteW("never-seen", 5)}})
	require.Equal(t, map[string]int64{"a": 1, "never-seen": 0}, res.DeletesApplied)
	_, _, ok := rowOf(t, s, "a")
	require.False(t, ok, "a deleted job must leave the read model")
	v, ok := tombstoneOf(t, s, "a")
	require.True(t, ok)
	require.Equal(t, int64(3), v)

	jobs, err := s.LoadJobs(context.Background(), []string{"a", "never-seen", "other"})
	require.NoError(t, err)
	require.Equal(t, map[string]store.Job{
		"a":          {ID: "a", Version: 3, Deleted: true},
		"never-seen": {ID: "never-seen", Version: 5, Deleted: true},
	}, jobs)

	// At or below the tombstone: stale, even with no row to compare with.
	res = b.must(store.Batch{
		Snapshots: []store.Write{snapshotW("a", 2, `{"n":2}`), snapshotW("never-seen", 5, `{"n":5}`)},
		Deletes:   []store.Write{deleteW("other", 1)},
	})
	require.Empty(t, res.SnapshotsApplied)
	require.Empty(t, res.SnapshotConflicts, "a snapshot at a tombstone's version is stale, not a conflict")
	res = b.must(store.Batch{Deletes: []store.Write{deleteW("a", 3), deleteW("never-seen", 2)}})
	require.Empty(t, res.DeletesApplied)
	require.Empty(t, res.DeleteConflicts)
	_, _, ok = rowOf(t, s, "a")
	require.False(t, ok)

	// Above it: the job is created again and its tombstone goes.
	res = b.must(store.Batch{Snapshots: []store.Write{snapshotW("a", 4, `{"again":true}`)}})
	require.Equal(t, map[string]int64{"a": 3}, res.SnapshotsApplied, "before is the tombstone's version")
	v, state, ok := rowOf(t, s, "a")
	require.True(t, ok)
	require.Equal(t, int64(4), v)
	require.JSONEq(t, `{"again":true}`, state)
	_, ok = tombstoneOf(t, s, "a")
	require.False(t, ok, "a job has a row or a tombstone, never both")

	// A delete at a live row's own version is a conflict; the row stays.
	res = b.must(store.Batch{Deletes: []store.Write{deleteW("a", 4)}})
	require.Empty(t, res.DeletesApplied)
	require.Equal(t, map[string]bool{"a": true}, res.DeleteConflicts)
	_, _, ok = rowOf(t, s, "a")
	require.True(t, ok)
}

// Writes computed from a known job apply only while the job is still what
// they were computed from: a row at Expect, nothing, or a tombstone at
// Expect.
func TestUpdatesToAndFromDeleted(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	b := newBatcher(t, s, 0)
	b.must(store.Batch{
		Snapshots: []store.Write{snapshotW("row", 2, `{"n":2}`)},
		Deletes:   []store.Write{deleteW("tomb", 3)},
	})

	var stale *store.StaleError
	for _, w := range []store.Write{
		{JobID: "row", Version: 3, Deleted: true, Expect: 1},                       // the row is at 2
		{JobID: "tomb", Version: 4, Deleted: true},                                 // a tombstone, not nothing
		{JobID: "tomb", Version: 4, Deleted: true, Expect: 2, ExpectDeleted: true}, // the tombstone is at 3
		{JobID: "tomb", Version: 4, State: json.RawMessage(`{}`)},                  // a delta on "nothing"
		{JobID: "tomb", Version: 5, State: json.RawMessage(`{}`), Expect: 4, ExpectDeleted: true},
		{JobID: "row", Version: 3, State: json.RawMessage(`{}`), Expect: 2, ExpectDeleted: true},
	} {
		_, err := b.apply(store.Batch{Updates: []store.Write{w}})
		require.ErrorAs(t, err, &stale, "%+v", w)
	}

	b.must(store.Batch{Updates: []store.Write{
		{JobID: "row", Version: 4, Deleted: true, Expect: 2},                                           // row -> deleted
		{JobID: "tomb", Version: 5, State: json.RawMessage(`{"n":5}`), Expect: 3, ExpectDeleted: true}, // deleted -> row
		{JobID: "new", Version: 2, Deleted: true},                                                      // nothing -> deleted
	}})
	_, _, ok := rowOf(t, s, "row")
	require.False(t, ok)
	v, _ := tombstoneOf(t, s, "row")
	require.Equal(t, int64(4), v)
	v, state, ok := rowOf(t, s, "tomb")
	require.True(t, ok)
	require.Equal(t, int64(5), v)
	require.JSONEq(t, `{"n":5}`, state)
	_, ok = tombstoneOf(t, s, "tomb")
	require.False(t, ok)
	v, _ = tombstoneOf(t, s, "new")
	require.Equal(t, int64(2), v)

	b.must(store.Batch{Updates: []store.Write{{JobID: "new", Version: 7, Deleted: true, Expect: 2, ExpectDeleted: true}}})
	v, _ = tombstoneOf(t, s, "new")
	require.Equal(t, int64(7), v)
}

// Two partitions write the same jobs at once (a repartition, a misrouted
// producer): one deletes, the other writes a snapshot below the delete or
// inserts a first version. Whatever the interleaving, a job deleted at v3
// never comes back with a version at or below 3, and a job never has a
// row and a tombstone at once.
func TestConcurrentDeletesNeverLoseToOlderWrites(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	deleter, writer := newBatcher(t, s, 0), newBatcher(t, s, 1)
	const rounds = 60
	ids := make([]string, rounds)
	for i := range ids {
		ids[i] = fmt.Sprintf("job-%03d", i)
	}
	// Half the jobs start with a row at v1, half with nothing.
	var seed []store.Write
	for i, id := range ids {
		if i%2 == 0 {
			seed = append(seed, snapshotW(id, 1, `{"n":1}`))
		}
	}
	deleter.must(store.Batch{Snapshots: seed})

	for i, id := range ids {
		var wg sync.WaitGroup
		start := make(chan struct{})
		var derr, werr error
		wg.Go(func() {
			<-start
			_, derr = deleter.apply(store.Batch{Deletes: []store.Write{deleteW(id, 3)}})
		})
		wg.Go(func() {
			<-start
			switch i % 4 {
			case 0, 1: // a late snapshot
				_, werr = writer.apply(store.Batch{Snapshots: []store.Write{snapshotW(id, 2, `{"n":2}`)}})
			case 2: // a delta on the row at v1
				_, werr = writer.apply(store.Batch{Updates: []store.Write{{JobID: id, Version: 2, State: json.RawMessage(`{"n":2}`), Expect: 1}}})
			case 3: // a first delta on a job never seen
				_, werr = writer.apply(store.Batch{Updates: []store.Write{{JobID: id, Version: 1, State: json.RawMessage(`{"n":1}`)}}})
			}
		})
		close(start)
		wg.Wait()
		require.NoError(t, derr, id)
		var stale *store.StaleError
		if werr != nil {
			require.ErrorAs(t, werr, &stale, "%s: the only refusal is a moved row", id)
		}
		v, state, hasRow := rowOf(t, s, id)
		require.False(t, hasRow, "%s came back at v%d %s after its delete at v3", id, v, state)
		tv, ok := tombstoneOf(t, s, id)
		require.True(t, ok, id)
		require.Equal(t, int64(3), tv, id)
	}
}

func TestPruneTombstones(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx := context.Background()
	b := newBatcher(t, s, 0)
	b.must(store.Batch{
		Snapshots: []store.Write{snapshotW("a", 1, `{"n":1}`)},
	})
	b.must(store.Batch{Deletes: []store.Write{deleteW("a", 3), deleteW("b", 3), deleteW("c", 3)}})

	// Nothing is older than an hour ago.
	n, err := s.PruneTombstones(ctx, time.Now().Add(-time.Hour), 10)
	require.NoError(t, err)
	require.Zero(t, n)
	count, err := s.CountTombstones(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), count)

	// In small batches: at most the limit per call.
	n, err = s.PruneTombstones(ctx, time.Now().Add(time.Hour), 2)
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	n, err = s.PruneTombstones(ctx, time.Now().Add(time.Hour), 2)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	count, err = s.CountTombstones(ctx)
	require.NoError(t, err)
	require.Zero(t, count)

	// The documented trade-off: once its tombstone is pruned, a job can
	// be created again by a snapshot older than its delete.
	res := b.must(store.Batch{Snapshots: []store.Write{snapshotW("a", 2, `{"old":true}`)}})
	require.Equal(t, map[string]int64{"a": 0}, res.SnapshotsApplied)
	v, state, ok := rowOf(t, s, "a")
	require.True(t, ok)
	require.Equal(t, int64(2), v)
	require.JSONEq(t, `{"old":true}`, state)
}

// A held job that was deleted waits from its tombstone's version, and
// status says so.
func TestHeldJobsOfADeletedJob(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	b := newBatcher(t, s, 0)
	b.must(store.Batch{
		Deletes: []store.Write{deleteW("a", 3)},
		Hold:    []store.Held{{JobID: "a", Version: 6, Ops: json.RawMessage(`[{"op":"set","path":"/n","value":6}]`), Since: time.Now()}},
	})
	held, total, err := s.HeldJobs(context.Background(), 10)
	require.NoError(t, err)
	require.Equal(t, 1, total)
	require.Equal(t, int64(3), held[0].RowVersion)
	require.Equal(t, []int64{4, 5}, held[0].Missing)
}

// Every instance prunes: one pruner passes over the tombstones another
// (or a batch) has locked instead of waiting for them.
func TestPruneTombstonesSkipsLockedOnes(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx := context.Background()
	b := newBatcher(t, s, 0)
	b.must(store.Batch{Deletes: []store.Write{deleteW("a", 3)}})
	b.must(store.Batch{Deletes: []store.Write{deleteW("b", 3)}})

	// Another pruner is deleting the oldest, uncommitted.
	other, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer other.Rollback(ctx)
	tag, err := other.Exec(ctx, `DELETE FROM `+s.Schema()+`.projector_tombstones WHERE job_id = 'a'`)
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())

	pruned := make(chan int64, 1)
	go func() {
		n, err := s.PruneTombstones(ctx, time.Now().Add(time.Hour), 1)
		if err != nil {
			n = -1
		}
		pruned <- n
	}()
	var n int64
	require.Eventually(t, func() bool {
		select {
		case n = <-pruned:
			return true
		default:
			return false
		}
	}, 30*time.Second, 10*time.Millisecond, "the pruner waits for the other's rows")
	require.Equal(t, int64(1), n, "the next unlocked tombstone is pruned")
	_, ok := tombstoneOf(t, s, "b")
	require.False(t, ok)
	require.NoError(t, other.Rollback(ctx))
}

package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

func TestMigrateIsIdempotentAndSafeConcurrently(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			s, err := store.New(pgtest.Pool(t), store.Config{Schema: schema, Table: "jobs"})
			if err == nil {
				err = s.Migrate(ctx)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	s, err := store.New(pgtest.Pool(t), store.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx), "a second migration run must be a no-op")
}

func TestConfigRejectsNonIdentifiers(t *testing.T) {
	t.Parallel()
	for _, c := range []store.Config{
		{Schema: "a;drop"}, {Table: "1jobs"}, {Table: `jo"bs`},
		{Table: "Jobs"}, {Schema: "Public"}, {Table: "jobs-x"}, {Table: "j\u00f6bs"},
		{Table: strings.Repeat("j", store.MaxTableBytes+1)}, {Schema: strings.Repeat("s", 64)},
		{Table: "projector_held"}, {Table: "projector_rebuild_jobs"}, {Table: "projector_"},
	} {
		require.Error(t, c.Validate(), "%+v", c)
	}
	for _, c := range []store.Config{
		{}, {Schema: "s_1", Table: "jobs_2"}, {Table: strings.Repeat("j", store.MaxTableBytes)},
		{Schema: strings.Repeat("s", 63)}, {Table: "my_projector_jobs"}, {Table: "jobs_rebuild"},
	} {
		require.NoError(t, c.Validate(), "%+v", c)
	}
}

func TestSnapshotWritesAreVersionMonotonic(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx := context.Background()
	c, err := s.Claim(ctx, "t", 0, "me")
	require.NoError(t, err)
	require.Equal(t, int64(1), c.Epoch)
	require.Equal(t, int64(-1), c.NextOffset)

	res, err := s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: c.Epoch, NextOffset: 2, Snapshots: []store.Write{
		{JobID: "a", Version: 2, State: json.RawMessage(`{"s":"completed"}`)},
		{JobID: "b", Version: 1, State: json.RawMessage(`{"s":"running"}`)},
	}})
	require.NoError(t, err)
	require.Len(t, res.SnapshotsApplied, 2)

	res, err = s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: c.Epoch, NextOffset: 4, Snapshots: []store.Write{
		{JobID: "a", Version: 1, State: json.RawMessage(`{"s":"running"}`)},
		{JobID: "b", Version: 3, State: json.RawMessage(`{"s":"failed"}`)},
	}})
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"b": 1}, res.SnapshotsApplied, "a's older snapshot is stale; b moved from 1")

	jobs, err := s.LoadJobs(ctx, []string{"a", "b", "missing"})
	require.NoError(t, err)
	require.Len(t, jobs, 2)
	require.Equal(t, int64(2), jobs["a"].Version)
	require.JSONEq(t, `{"s":"completed"}`, string(jobs["a"].State))
	require.Equal(t, int64(3), jobs["b"].Version)

	c2, err := s.Claim(ctx, "t", 0, "me-again")
	require.NoError(t, err)
	require.Equal(t, int64(2), c2.Epoch)
	require.Equal(t, int64(4), c2.NextOffset, "the position committed with the last batch")
}

func TestApplyByAnOldEpochIsFencedAndWritesNothing(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx := context.Background()
	old, err := s.Claim(ctx, "t", 3, "old")
	require.NoError(t, err)
	_, err = s.Claim(ctx, "t", 3, "new")
	require.NoError(t, err)
	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Partition: 3, Epoch: old.Epoch, NextOffset: 10,
		Snapshots: []store.Write{{JobID: "x", Version: 1, State: json.RawMessage(`{}`)}},
		Bad:       []store.Bad{{Partition: -1, Offset: 9, Err: "nope"}}})
	require.ErrorIs(t, err, store.ErrFenced)
	jobs, err := s.LoadJobs(ctx, []string{"x"})
	require.NoError(t, err)
	require.Empty(t, jobs)
}

func TestUpdateOnAMovedRowRollsBackWithStaleError(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx := context.Background()
	c, err := s.Claim(ctx, "t", 0, "me")
	require.NoError(t, err)
	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Epoch: c.Epoch, NextOffset: 1,
		Updates: []store.Write{{JobID: "j", Version: 1, State: json.RawMessage(`{"n":1}`), Expect: 0}}})
	require.NoError(t, err)
	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Epoch: c.Epoch, NextOffset: 2,
		Updates: []store.Write{{JobID: "j", Version: 2, State: json.RawMessage(`{"n":2}`), Expect: 1}}})
	require.NoError(t, err)

	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Epoch: c.Epoch, NextOffset: 3,
		Snapshots: []store.Write{{JobID: "other", Version: 1, State: json.RawMessage(`{}`)}},
		Updates:   []store.Write{{JobID: "j", Version: 2, State: json.RawMessage(`{"n":99}`), Expect: 1}}})
	var stale *store.StaleError
	require.True(t, errors.As(err, &stale), "got %v", err)
	require.Equal(t, []string{"j"}, stale.Jobs)
	jobs, err := s.LoadJobs(ctx, []string{"j", "other"})
	require.NoError(t, err)
	require.JSONEq(t, `{"n":2}`, string(jobs["j"].State))
	require.NotContains(t, jobs, "other", "the whole batch rolled back")
}

func TestSnapshotAtTheRowsVersionWithOtherContentIsAConflict(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx := context.Background()
	c, err := s.Claim(ctx, "t", 0, "me")
	require.NoError(t, err)
	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Epoch: c.Epoch, NextOffset: 1, Snapshots: []store.Write{
		{JobID: "a", Version: 2, State: json.RawMessage(`{"s":"completed","n":1}`)},
		{JobID: "b", Version: 2, State: json.RawMessage(`{"s":"completed"}`)},
	}})
	require.NoError(t, err)
	res, err := s.Apply(ctx, &store.Batch{Topic: "t", Epoch: c.Epoch, NextOffset: 2, Snapshots: []store.Write{
		{JobID: "a", Version: 2, State: json.RawMessage(`{"n":1.0, "s":"completed"}`)}, // same JSON value
		{JobID: "b", Version: 2, State: json.RawMessage(`{"s":"failed"}`)},
	}})
	require.NoError(t, err)
	require.Empty(t, res.SnapshotsApplied)
	require.Equal(t, map[string]bool{"b": true}, res.SnapshotConflicts)
	jobs, err := s.LoadJobs(ctx, []string{"b"})
	require.NoError(t, err)
	require.JSONEq(t, `{"s":"completed"}`, string(jobs["b"].State), "the first applied wins")
}

func TestSwapMakesTheShadowLiveAndFencesTheOldOwner(t *testing.T) {
	t.Parallel()
	live := pgtest.Store(t)
	ctx := context.Background()
	old, err := live.Claim(ctx, "t", 0, "live")
	require.NoError(t, err)
	_, err = live.Apply(ctx, &store.Batch{Topic: "t", Epoch: old.Epoch, NextOffset: 5,
		Snapshots: []store.Write{{JobID: "a", Version: 1, State: json.RawMessage(`{"wrong":true}`)}},
		Bad:       []store.Bad{{Partition: -1, Offset: 3, Err: "old bad"}}})
	require.NoError(t, err)

	shadow, err := live.Shadow()
	require.NoError(t, err)
	require.NoError(t, shadow.Reset(ctx))
	require.NoError(t, shadow.Migrate(ctx))
	sc, err := shadow.Claim(ctx, "t", 0, "rebuild")
	require.NoError(t, err)
	_, err = shadow.Apply(ctx, &store.Batch{Topic: "t", Epoch: sc.Epoch, NextOffset: 9,
		Snapshots: []store.Write{{JobID: "a", Version: 2, State: json.RawMessage(`{"right":true}`)}},
		Hold:      []store.Held{{JobID: "b", Version: 3, Partition: 0, Offset: 8, Ops: json.RawMessage(`[]`)}},
		Bad:       []store.Bad{{Partition: -1, Offset: 3, Err: "rebuilt bad"}, {Partition: -1, Offset: 4, Err: "new bad"}}})
	require.NoError(t, err)

	res, err := live.Swap(ctx, shadow, true)
	require.NoError(t, err)
	require.NotEmpty(t, res.OldTable)

	jobs, err := live.Jobs(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	require.JSONEq(t, `{"right":true}`, string(jobs["a"].State))
	pos, err := live.Positions(ctx)
	require.NoError(t, err)
	require.Len(t, pos, 1)
	require.Equal(t, int64(9), pos[0].NextOffset, "the shadow's position is live")
	require.Greater(t, pos[0].Epoch, old.Epoch)
	held, n, err := live.HeldJobs(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "b", held[0].JobID)
	q, qn, err := live.Quarantine(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 2, qn, "the rebuild's quarantine is merged into the live one, one row per record")
	errs := map[int64]string{}
	for _, r := range q {
		errs[r.Offset] = r.Error
	}
	require.Equal(t, map[int64]string{3: "rebuilt bad", 4: "new bad"}, errs)

	_, err = live.Apply(ctx, &store.Batch{Topic: "t", Epoch: old.Epoch, NextOffset: 6})
	require.ErrorIs(t, err, store.ErrFenced, "an instance still running on the old model is fenced")

	// A second rebuild starts clean: the shadow's names are free again.
	// This one read nothing: partition 0, which the live model had read,
	// keeps its jobs and is read again from its start.
	require.NoError(t, shadow.Reset(ctx))
	require.NoError(t, shadow.Migrate(ctx))
	res, err = live.Swap(ctx, shadow, false)
	require.NoError(t, err)
	require.Zero(t, res.Deleted)
	require.Equal(t, int64(9), res.Reread)
	jobs, err = live.Jobs(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	require.JSONEq(t, `{"right":true}`, string(jobs["a"].State))
	_, qn, err = live.Quarantine(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 2, qn, "a rebuild never deletes the quarantine")
}

func TestHeldJobsSayWhatTheyWaitFor(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx := context.Background()
	c, err := s.Claim(ctx, "t", 0, "me")
	require.NoError(t, err)
	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Epoch: c.Epoch, NextOffset: 5,
		Snapshots: []store.Write{{JobID: "a", Version: 2, State: json.RawMessage(`{}`)}},
		Hold: []store.Held{
			{JobID: "a", Version: 5, Ops: json.RawMessage(`[]`)}, {JobID: "a", Version: 7, Ops: json.RawMessage(`[]`)},
			{JobID: "b", Version: 3, Ops: json.RawMessage(`[]`)},
		}})
	require.NoError(t, err)
	held, n, err := s.HeldJobs(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	byJob := map[string]store.HeldSummary{}
	for _, h := range held {
		byJob[h.JobID] = h
	}
	require.Equal(t, int64(2), byJob["a"].RowVersion)
	require.Equal(t, []int64{3, 4, 6}, byJob["a"].Missing)
	require.Equal(t, []int64{5, 7}, byJob["a"].Versions)
	require.Equal(t, int64(0), byJob["b"].RowVersion, "no row yet")
	require.Equal(t, []int64{1, 2}, byJob["b"].Missing)
}

// TestSwapWaitsForABatchInFlightWithoutDeadlock: a live batch holds its
// position row and then writes the read model; a swap that starts between
// the two waits for the batch instead of deadlocking with it, and the batch's
// owner is fenced afterwards.
func TestSwapWaitsForABatchInFlightWithoutDeadlock(t *testing.T) {
	t.Parallel()
	live := pgtest.Store(t)
	ctx := context.Background()
	c, err := live.Claim(ctx, "t", 0, "live")
	require.NoError(t, err)
	shadow, err := live.Shadow()
	require.NoError(t, err)
	require.NoError(t, shadow.Reset(ctx))
	require.NoError(t, shadow.Migrate(ctx))
	sc, err := shadow.Claim(ctx, "t", 0, "rebuild")
	require.NoError(t, err)
	_, err = shadow.Apply(ctx, &store.Batch{Topic: "t", Epoch: sc.Epoch, NextOffset: 7,
		Snapshots: []store.Write{{JobID: "a", Version: 3, State: json.RawMessage(`{"rebuilt":true}`)}}})
	require.NoError(t, err)

	// The live batch, by hand: the fence first, as store.Apply does.
	tx, err := live.Pool().Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, `UPDATE `+schemaOf(live)+`.projector_partitions SET next_offset = 5 WHERE projection = 'jobs' AND epoch = $1`, c.Epoch)
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())

	swapped := make(chan error, 1)
	go func() {
		_, err := live.Swap(ctx, shadow, false)
		swapped <- err
	}()
	// The swap waits on the batch's row lock.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting int
		require.NoError(t, live.Pool().QueryRow(ctx,
			`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE%'`).Scan(&waiting))
		if waiting > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the swap never waited for the batch")
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
	}
	// The batch goes on to write the read model, then commits: no deadlock.
	_, err = tx.Exec(ctx, `INSERT INTO `+live.JobsTable()+` (job_id, version, state) VALUES ('b', 1, '{}')`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-swapped)

	jobs, err := live.Jobs(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 1, "the rebuilt model is live")
	require.JSONEq(t, `{"rebuilt":true}`, string(jobs["a"].State))
	_, err = live.Apply(ctx, &store.Batch{Topic: "t", Epoch: c.Epoch, NextOffset: 6})
	require.ErrorIs(t, err, store.ErrFenced)
}

func schemaOf(s *store.Store) string {
	table := s.JobsTable() // "schema"."jobs"
	return table[:strings.Index(table, ".")]
}

// TestUpdatesStayOnTheirRowsPage checks the read model leaves room on its
// pages for the next version of a row: an update that stays on its row's
// page can be HOT (no new primary key entry, the old version pruned on the
// page), one that must move cannot. A batch that updates a third of the
// rows of every page must fit; with pages filled to the brim, every
// updated row would move.
func TestUpdatesStayOnTheirRowsPage(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx := context.Background()
	c, err := s.Claim(ctx, "t", 0, "me")
	require.NoError(t, err)
	state := func(v int64) json.RawMessage {
		return json.RawMessage(`{"status":"running","version":` + strconv.FormatInt(v, 10) + `,"note":"` + strings.Repeat("x", 150) + `"}`)
	}
	const jobs = 600
	write := func(version, next int64, every int) {
		var ws []store.Write
		for i := 0; i < jobs; i += every {
			ws = append(ws, store.Write{JobID: fmt.Sprintf("job-%04d", i), Version: version, State: state(version), Expect: version - 1})
		}
		_, err := s.Apply(ctx, &store.Batch{Topic: "t", Epoch: c.Epoch, NextOffset: next, Updates: ws})
		require.NoError(t, err)
	}
	pages := func() map[string]int64 {
		rows, err := pgtest.Pool(t).Query(ctx, `SELECT job_id, (ctid::text::point)[0]::bigint FROM `+s.JobsTable())
		require.NoError(t, err)
		out := map[string]int64{}
		var id string
		var page int64
		_, err = pgx.ForEachRow(rows, []any{&id, &page}, func() error { out[id] = page; return nil })
		require.NoError(t, err)
		return out
	}
	write(1, 1, 1)
	before := pages()
	require.Greater(t, slices.Max(slices.Collect(maps.Values(before))), int64(5), "the rows must span several pages for the test to mean anything")
	write(2, 2, 3)
	after := pages()
	moved := 0
	for id, p := range before {
		if after[id] != p {
			moved++
		}
	}
	require.Zero(t, moved, "%d of %d updated rows moved to another page", moved, jobs/3)
}

// A live partition the shadow never read (added while the rebuild ran, or
// unclaimed when the catch-up bound ended) has none of its jobs in the
// rebuilt rows. The swap must neither drop its position (the next claim
// resolved it again, under --start latest to the log's end, and the
// partition's records were never read) nor its epoch (a new row started at
// 1, and an owner frozen before the swap passed the fence a few claims
// later): it starts at its log's start, with an epoch above every earlier
// one.
func TestSwapNeitherDropsNorForgetsPartitionsTheShadowDidNotRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		logStarts store.LogStarts
		wantStart int64
	}{
		{"log start asked", func(_ context.Context, topic string, parts []int) (map[int]int64, error) {
			require.Equal(t, "t", topic)
			require.ElementsMatch(t, []int{1, 3}, parts, "asked only for the partitions the shadow did not read")
			return map[int]int64{1: 7, 3: 7}, nil
		}, 7},
		{"no log start", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			live := pgtest.Store(t)
			// Partition 0: read by both. Partition 1: live at 50, never read
			// by the shadow. Partition 2: claimed four times, never
			// processed. Partition 3: live at 30, the shadow's row still at
			// -1 (claimed, nothing read).
			l0 := newBatcher(t, live, 0)
			l0.must(store.Batch{Snapshots: []store.Write{snapshotW("a", 1, `{"p":0}`)}})
			c1, err := live.Claim(ctx, "t", 1, "live")
			require.NoError(t, err)
			_, err = live.Apply(ctx, &store.Batch{Topic: "t", Partition: 1, Epoch: c1.Epoch, NextOffset: 50,
				Snapshots: []store.Write{snapshotW("only1", 1, `{"p":1}`)}})
			require.NoError(t, err)
			var c2 store.Claim
			for range 4 {
				c2, err = live.Claim(ctx, "t", 2, "live")
				require.NoError(t, err)
			}
			require.Equal(t, int64(-1), c2.NextOffset)
			c3, err := live.Claim(ctx, "t", 3, "live")
			require.NoError(t, err)
			_, err = live.Apply(ctx, &store.Batch{Topic: "t", Partition: 3, Epoch: c3.Epoch, NextOffset: 30})
			require.NoError(t, err)
			before := map[int]int64{}
			pos, err := live.Positions(ctx)
			require.NoError(t, err)
			for _, p := range pos {
				before[p.Partition] = p.Epoch
			}

			shadow, err := live.Shadow()
			require.NoError(t, err)
			require.NoError(t, shadow.Reset(ctx))
			require.NoError(t, shadow.Migrate(ctx))
			s0 := newBatcher(t, shadow, 0)
			s0.must(store.Batch{Snapshots: []store.Write{snapshotW("a", 1, `{"p":0}`)}})
			_, err = shadow.Claim(ctx, "t", 3, "rebuild")
			require.NoError(t, err)

			res, err := live.SwapCaughtUp(ctx, shadow, false, nil, tc.logStarts)
			require.NoError(t, err)
			require.Equal(t, (50-tc.wantStart)+(30-tc.wantStart), res.Reread, "the records of the unread partitions are read again")

			pos, err = live.Positions(ctx)
			require.NoError(t, err)
			after := map[int]store.Position{}
			for _, p := range pos {
				after[p.Partition] = p
			}
			require.Len(t, after, 4, "every live partition keeps a row")
			require.Equal(t, int64(1), after[0].NextOffset, "the shadow's position")
			require.Equal(t, tc.wantStart, after[1].NextOffset, "read again from the log's start, never dropped")
			require.Equal(t, int64(-1), after[2].NextOffset, "never processed: --start still decides")
			require.Equal(t, tc.wantStart, after[3].NextOffset, "the shadow's -1 does not replace a live position")
			for p, e := range before {
				require.Greater(t, after[p].Epoch, e, "partition %d's epoch moves past every epoch before the swap", p)
			}
			// The job only partition 1 carried stays: what retention removed
			// below the log's start would never be read again.
			_, _, ok := rowOf(t, live, "only1")
			require.True(t, ok, "the job of the partition the shadow did not read is kept")

			// A claim with --start latest after the swap keeps the stored
			// start, never the log's end.
			c, err := live.ClaimFrom(ctx, "t", 1, "live-2", 500)
			require.NoError(t, err)
			require.Equal(t, tc.wantStart, c.NextOffset)
			// The owner of partition 2 frozen before the swap stays fenced
			// however often the partition is claimed after it.
			for range 4 {
				_, err = live.Claim(ctx, "t", 2, "live-2")
				require.NoError(t, err)
			}
			_, err = live.Apply(ctx, &store.Batch{Topic: "t", Partition: 2, Epoch: c2.Epoch, NextOffset: 3})
			require.ErrorIs(t, err, store.ErrFenced)
			_, err = live.Apply(ctx, &store.Batch{Topic: "t", Partition: 1, Epoch: c1.Epoch, NextOffset: 51})
			require.ErrorIs(t, err, store.ErrFenced)
		})
	}
}

// A claim of a partition with no row yet, made while a swap runs (the
// topic grew during the rebuild), waits for the swap: it would insert a
// row the swap's locks do not cover, and the swap would drop it, with its
// position and epoch.
func TestAClaimDuringASwapWaitsForIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	live := pgtest.Store(t)
	l0 := newBatcher(t, live, 0)
	l0.must(store.Batch{Snapshots: []store.Write{snapshotW("a", 1, `{"p":0}`)}})
	shadow, err := live.Shadow()
	require.NoError(t, err)
	require.NoError(t, shadow.Reset(ctx))
	require.NoError(t, shadow.Migrate(ctx))
	s0 := newBatcher(t, shadow, 0)
	s0.must(store.Batch{Snapshots: []store.Write{snapshotW("a", 1, `{"p":0}`)}})

	catchUp := func(ctx context.Context, _ []store.PartitionPosition) error {
		_, err := live.ClaimFrom(ctx, "t", 4, "live-a", 0)
		var sw *store.SwapWaitError
		require.ErrorAs(t, err, &sw, "a first claim during the swap waits for it")
		return nil
	}
	_, err = live.SwapCaughtUp(ctx, shadow, false, catchUp, nil)
	require.NoError(t, err)
	c, err := live.ClaimFrom(ctx, "t", 4, "live-a", 0)
	require.NoError(t, err)
	require.Equal(t, int64(0), c.NextOffset)
}

// The count of logs a partition replaced names the quarantine's rows of
// earlier logs (<topic>~log<n>): a swap keeps it, so the next new log gets
// a name of its own.
func TestSwapKeepsTheCountOfLogsReplaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	live := pgtest.Store(t)
	l0 := newBatcher(t, live, 0)
	l0.must(store.Batch{Bad: []store.Bad{{Partition: -1, Offset: 5, Err: "bad in log 0"}}})
	resets, err := live.MoveToLog(ctx, "t", 0, l0.epoch, 0, true)
	require.NoError(t, err)
	require.Equal(t, 1, resets)

	shadow, err := live.Shadow()
	require.NoError(t, err)
	require.NoError(t, shadow.Reset(ctx))
	require.NoError(t, shadow.Migrate(ctx))
	s0 := newBatcher(t, shadow, 0)
	s0.must(store.Batch{Bad: []store.Bad{{Partition: -1, Offset: 5, Err: "bad in log 1"}}})
	_, err = live.SwapCaughtUp(ctx, shadow, false, nil, nil)
	require.NoError(t, err)

	c, err := live.Claim(ctx, "t", 0, "live")
	require.NoError(t, err)
	resets, err = live.MoveToLog(ctx, "t", 0, c.Epoch, 0, true)
	require.NoError(t, err)
	require.Equal(t, 2, resets)
	q, n, err := live.Quarantine(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	topics := map[string]string{}
	for _, r := range q {
		topics[r.Topic] = r.Error
	}
	require.Equal(t, map[string]string{"t~log1": "bad in log 0", "t~log2": "bad in log 1"}, topics)
}

// Every statement of a batch is planned for its own arguments: a generic
// plan, made once the table's statistics said it was empty, would scan the
// grown table once per row of the batch's arrays. The setting is the
// batch's alone and leaves the pool's connections as they were.
func TestBatchStatementsArePlannedForTheirArguments(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx := context.Background()
	log := pgx.Identifier{s.Schema(), "plan_modes"}.Sanitize()
	fn := pgx.Identifier{s.Schema(), "log_plan_mode"}.Sanitize()
	for _, sql := range []string{
		`CREATE TABLE ` + log + ` (mode text NOT NULL)`,
		`CREATE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN INSERT INTO ` + log + ` VALUES (current_setting('plan_cache_mode')); RETURN NEW; END $$`,
		`CREATE TRIGGER log_plan_mode BEFORE INSERT OR UPDATE ON ` + s.JobsTable() + ` FOR EACH ROW EXECUTE FUNCTION ` + fn + `()`,
	} {
		_, err := s.Pool().Exec(ctx, sql)
		require.NoError(t, err)
	}
	c, err := s.Claim(ctx, "t", 0, "me")
	require.NoError(t, err)
	for i := range 7 { // past the five runs after which PostgreSQL may keep a generic plan
		_, err = s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: c.Epoch, NextOffset: int64(i + 1), Snapshots: []store.Write{
			{JobID: fmt.Sprint("j", i), Version: 1, State: json.RawMessage(`{"n":1}`)},
		}, Updates: []store.Write{
			{JobID: "u", Version: int64(i + 1), Expect: int64(i), State: json.RawMessage(`{"n":2}`)},
		}})
		require.NoError(t, err)
	}
	var modes []string
	rows, err := s.Pool().Query(ctx, `SELECT mode FROM `+log)
	require.NoError(t, err)
	modes, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, modes, 14)
	for _, m := range modes {
		require.Equal(t, "force_custom_plan", m)
	}
	var outside string
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT current_setting('plan_cache_mode')`).Scan(&outside))
	require.Equal(t, "auto", outside, "the setting is local to the batch's transaction")
}

package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

const queueTopic = "sqs:q.fifo"

func heldDelta(id string, v int64) store.Held {
	return store.Held{JobID: id, Version: v, Ops: json.RawMessage(`[{"op":"increment","path":"/n","by":1}]`), Since: time.Now()}
}

// heldInLine lists the held deltas whose job's row (or tombstone) is not
// behind them: each names a version nothing would ever release.
func heldInLine(t *testing.T, s *store.Store) []string {
	t.Helper()
	rows, err := s.Pool().Query(context.Background(), `SELECT h.job_id || ':' || h.version || ' (row at ' || coalesce(j.version, tb.version, 0) || ')'
		FROM `+pgx.Identifier{s.Schema(), "projector_held"}.Sanitize()+` h
		LEFT JOIN `+s.JobsTable()+` j ON j.job_id = h.job_id
		LEFT JOIN `+pgx.Identifier{s.Schema(), "projector_tombstones"}.Sanitize()+` tb ON tb.projection = h.projection AND tb.job_id = h.job_id
		WHERE h.projection = $1 AND h.version <= coalesce(j.version, tb.version, 0) + 1 ORDER BY 1`, s.Projection())
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

func heldVersions(t *testing.T, s *store.Store, topic string) []string {
	t.Helper()
	held, err := s.LoadHeld(context.Background(), topic, 0)
	require.NoError(t, err)
	var out []string
	for _, h := range held {
		out = append(out, fmt.Sprintf("%s:%d", h.JobID, h.Version))
	}
	return out
}

// TestHoldNotBehindTheRowIsStale: a delta is stored as held only while its
// job's row, or its tombstone, is behind it with a version missing in
// between. Planned from an out-of-date view (the row moved since), a hold
// of the next version or of one already applied fails the batch with a
// StaleError naming the job, and the batch writes nothing; behind, it is
// held. Fenced or not, the rule is the same.
func TestHoldNotBehindTheRowIsStale(t *testing.T) {
	t.Parallel()
	for _, unfenced := range []bool{false, true} {
		t.Run(fmt.Sprintf("unfenced=%v", unfenced), func(t *testing.T) {
			t.Parallel()
			s := pgtest.Store(t)
			ctx := context.Background()
			topic := "t"
			var epoch int64
			if unfenced {
				topic = queueTopic
			} else {
				c, err := s.Claim(ctx, topic, 0, "me")
				require.NoError(t, err)
				epoch = c.Epoch
			}
			next := int64(0)
			apply := func(b store.Batch) error {
				next++
				b.Topic, b.Epoch, b.NextOffset, b.Unfenced = topic, epoch, next, unfenced
				_, err := s.Apply(ctx, &b)
				return err
			}
			require.NoError(t, apply(store.Batch{
				Snapshots: []store.Write{snapshotW("x", 3, `{"n":3}`)},
				Deletes:   []store.Write{deleteW("d", 3)},
			}))
			for _, c := range []struct {
				held  store.Held
				stale bool
			}{
				{heldDelta("x", 4), true},  // next in line
				{heldDelta("x", 3), true},  // applied already
				{heldDelta("d", 4), true},  // next after the delete: refused when planned again
				{heldDelta("x", 5), false}, // behind: 4 is missing
				{heldDelta("d", 5), false},
				{heldDelta("new", 2), false}, // no row: 1 is missing
				{heldDelta("new", 1), true},
			} {
				err := apply(store.Batch{Snapshots: []store.Write{snapshotW("other", next, `{}`)}, Hold: []store.Held{c.held}})
				if !c.stale {
					require.NoError(t, err, "%s:%d", c.held.JobID, c.held.Version)
					continue
				}
				var stale *store.StaleError
				require.True(t, errors.As(err, &stale), "%s:%d: got %v", c.held.JobID, c.held.Version, err)
				require.Equal(t, []string{c.held.JobID}, stale.Jobs)
			}
			require.Equal(t, []string{"d:5", "new:2", "x:5"}, heldVersions(t, s, topic))
			jobs, err := s.LoadJobs(ctx, []string{"other"})
			require.NoError(t, err)
			require.Equal(t, int64(6), jobs["other"].Version, "a stale batch writes nothing")
			require.Empty(t, heldInLine(t, s))
		})
	}
}

// TestUnfencedWriteUnderAnotherInstancesHeldDelta: on a queue, instance B
// holds x:5 while the row is at 3; instance A, which never saw it, then
// applies x:4. Committed as planned, x:5 would stay held with nothing
// missing, and nothing would ever release it. A's batch fails with a
// StaleError naming x instead, and writes nothing; planned again with the
// held delta, it applies x:4, x:5 and releases x:5. A snapshot that covers
// held deltas it does not release is refused the same way. A fenced
// batch's owner knows every held delta of its partition, and is not
// checked.
func TestUnfencedWriteUnderAnotherInstancesHeldDelta(t *testing.T) {
	t.Parallel()
	s := pgtest.Store(t)
	ctx := context.Background()
	apply := func(b store.Batch) error {
		b.Topic, b.NextOffset, b.Unfenced = queueTopic, 1, true
		_, err := s.Apply(ctx, &b)
		return err
	}
	require.NoError(t, apply(store.Batch{Snapshots: []store.Write{snapshotW("x", 3, `{"n":3}`), snapshotW("y", 1, `{"n":1}`)}}))
	require.NoError(t, apply(store.Batch{Hold: []store.Held{heldDelta("x", 5), heldDelta("y", 4)}}))

	requireStale := func(err error, jobs ...string) {
		t.Helper()
		var stale *store.StaleError
		require.True(t, errors.As(err, &stale), "got %v", err)
		require.Equal(t, jobs, stale.Jobs)
	}
	// x:4 fills the gap below x:5.
	requireStale(apply(store.Batch{
		Updates: []store.Write{{JobID: "x", Version: 4, State: json.RawMessage(`{"n":4}`), Expect: 3}},
		Bad:     []store.Bad{{Partition: -1, Offset: 1, Err: "bad"}},
	}), "x")
	// A snapshot above y:4 covers it.
	requireStale(apply(store.Batch{Snapshots: []store.Write{snapshotW("y", 5, `{"n":5}`)}}), "y")
	// Holding x:6 behind x:5, without knowing x:5, is not in line: allowed.
	require.NoError(t, apply(store.Batch{Hold: []store.Held{heldDelta("x", 6)}}))
	jobs, err := s.LoadJobs(ctx, []string{"x", "y"})
	require.NoError(t, err)
	require.Equal(t, int64(3), jobs["x"].Version, "the refused batches wrote nothing")
	require.Equal(t, int64(1), jobs["y"].Version)
	_, total, err := s.Quarantine(ctx, 10)
	require.NoError(t, err)
	require.Zero(t, total, "the refused batch wrote nothing")

	// Planned again with the held deltas: applied and released.
	require.NoError(t, apply(store.Batch{
		Updates: []store.Write{{JobID: "x", Version: 6, State: json.RawMessage(`{"n":6}`), Expect: 3}},
		Release: []store.HeldKey{{JobID: "x", Version: 5}, {JobID: "x", Version: 6}},
	}))
	require.NoError(t, apply(store.Batch{
		Snapshots: []store.Write{snapshotW("y", 5, `{"n":5}`)},
		Release:   []store.HeldKey{{JobID: "y", Version: 4}},
	}))
	require.Empty(t, heldVersions(t, s, queueTopic))

	// A fenced batch is not checked: its owner knows its held deltas.
	c, err := s.Claim(ctx, "t", 0, "me")
	require.NoError(t, err)
	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Epoch: c.Epoch, NextOffset: 1,
		Snapshots: []store.Write{snapshotW("k", 1, `{}`)}, Hold: []store.Held{heldDelta("k", 3)}})
	require.NoError(t, err)
	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Epoch: c.Epoch, NextOffset: 2,
		Updates: []store.Write{{JobID: "k", Version: 2, State: json.RawMessage(`{}`), Expect: 1}}})
	require.NoError(t, err)
}

// TestUnfencedHoldAndWriteOfOneJobAreOrdered: instance A applies x:3 (the
// row is at 2) while instance B, planning from the same row, holds x:4.
// Each batch checks the other's effect, the hold the row and the write the
// held rows, but a check sees only what is committed: run side by side,
// A's check could pass before B's hold committed and B's before A's write
// did, leaving x:4 held with nothing missing. Here A is stopped after its
// check, before its commit (its quarantine insert waits for the test's
// open transaction), while B runs. B must wait for A, then see the row at
// 3 and fail with a StaleError; no held delta is left in line.
func TestUnfencedHoldAndWriteOfOneJobAreOrdered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.Store(t)
	require.NoError(t, applyErr(s, store.Batch{Snapshots: []store.Write{snapshotW("x", 2, `{"n":2}`)}}))

	// B's batches run on a pool of their own, named, to see when they wait.
	name := "held-order-" + s.Schema()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	cfg.MaxConns = 2
	bPool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer bPool.Close()
	b, err := store.New(bPool, store.Config{Schema: s.Schema()})
	require.NoError(t, err)

	// The test's transaction takes the quarantine key A's batch writes.
	block, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer block.Rollback(ctx)
	_, err = block.Exec(ctx, `INSERT INTO `+pgx.Identifier{s.Schema(), "projector_quarantine"}.Sanitize()+`
		(projection, topic, partition, "offset", error) VALUES ($1, $2, 0, 9, 'the test holds this key')`, s.Projection(), queueTopic)
	require.NoError(t, err)

	aDone := make(chan error, 1)
	go func() {
		aDone <- applyErr(s, store.Batch{
			Updates: []store.Write{{JobID: "x", Version: 3, State: json.RawMessage(`{"n":3}`), Expect: 2}},
			Bad:     []store.Bad{{Partition: -1, Offset: 9, Err: "bad"}},
		})
	}()
	waiting := func(app, query string) bool {
		var n int
		require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND application_name = $1 AND query LIKE $2`, app, query).Scan(&n))
		return n > 0
	}
	app := ""
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT current_setting('application_name')`).Scan(&app))
	require.Eventually(t, func() bool {
		return waiting(app, "%"+s.Schema()+"%projector_quarantine%")
	}, 10*time.Second, 10*time.Millisecond, "A's batch does not wait at its quarantine insert")

	bDone := make(chan error, 1)
	go func() { bDone <- applyErr(b, store.Batch{Hold: []store.Held{heldDelta("x", 4)}}) }()
	var bErr error
	bFinished := false
	require.Eventually(t, func() bool {
		select {
		case bErr = <-bDone:
			bFinished = true
			return true
		default:
			return waiting(name, "%")
		}
	}, 10*time.Second, 10*time.Millisecond, "B's batch neither finished nor waits")
	require.False(t, bFinished, "B's hold committed while A's write was in flight (err %v): x:4 is held with the row about to be at 3", bErr)

	require.NoError(t, block.Rollback(ctx))
	require.NoError(t, <-aDone)
	bErr = <-bDone
	var stale *store.StaleError
	require.True(t, errors.As(bErr, &stale), "got %v", bErr)
	require.Equal(t, []string{"x"}, stale.Jobs)
	require.Empty(t, heldInLine(t, s))
}

func applyErr(s *store.Store, b store.Batch) error {
	b.Topic, b.NextOffset, b.Unfenced = queueTopic, 1, true
	_, err := s.Apply(context.Background(), &b)
	return err
}

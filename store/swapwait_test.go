package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// TestBatchesAndClaimsSayTheyWaitForASwap: while a rebuild's swap holds the
// partition rows, a batch and a claim give up waiting after the claim lock
// bound with a *SwapWaitError (not an outage at the one-minute statement
// bound, nor a stuck owner); once the swap commits, the batch is fenced and
// a claim continues from the rebuilt position.
func TestBatchesAndClaimsSayTheyWaitForASwap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	live, err := store.New(pgtest.Pool(t), store.Config{Schema: schema, Table: "jobs", ClaimLockTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, live.Migrate(ctx))
	shadow, err := live.Shadow()
	require.NoError(t, err)
	require.NoError(t, shadow.Migrate(ctx))

	write := func(s *store.Store, epoch, next int64, version int64) error {
		_, err := s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: epoch, NextOffset: next,
			Snapshots: []store.Write{{JobID: "j", Version: version, State: json.RawMessage(`{"v":1}`), Offset: next - 1}}})
		return err
	}
	lc, err := live.Claim(ctx, "t", 0, "live")
	require.NoError(t, err)
	require.NoError(t, write(live, lc.Epoch, 10, 1))
	sc, err := shadow.Claim(ctx, "t", 0, "shadow")
	require.NoError(t, err)
	require.NoError(t, write(shadow, sc.Epoch, 7, 2))

	// A user's trigger makes the swap's update of the differing row slow,
	// with the partition rows locked.
	pool := pgtest.Pool(t)
	jobs := live.JobsTable()
	_, err = pool.Exec(ctx, `CREATE FUNCTION `+schema+`.slow() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(3); RETURN NEW; END $$`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TRIGGER slow BEFORE UPDATE ON `+jobs+` FOR EACH ROW EXECUTE FUNCTION `+schema+`.slow()`)
	require.NoError(t, err)

	swapped := make(chan error, 1)
	go func() {
		_, err := live.Swap(ctx, shadow, false)
		swapped <- err
	}()
	// Wait until the swap holds the partition rows: a batch then waits.
	var batchErr error
	require.Eventually(t, func() bool {
		batchErr = write(live, lc.Epoch, 11, 3)
		var sw *store.SwapWaitError
		return errors.As(batchErr, &sw)
	}, 10*time.Second, 50*time.Millisecond, "a batch waiting for the swap says so: %v", batchErr)
	require.Contains(t, batchErr.Error(), "a rebuild is swapping its rows into "+schema+".jobs")

	_, err = live.Claim(ctx, "t", 0, "other")
	var sw *store.SwapWaitError
	require.ErrorAs(t, err, &sw, "a claim waiting for the swap says so")
	var cw *store.ClaimWaitError
	require.False(t, errors.As(err, &cw), "not blamed on a previous owner: %v", err)

	select {
	case err := <-swapped:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the swap did not end")
	}
	require.ErrorIs(t, write(live, lc.Epoch, 11, 3), store.ErrFenced, "the swap fenced the old owner")
	c, err := live.Claim(ctx, "t", 0, "live")
	require.NoError(t, err)
	require.EqualValues(t, 7, c.NextOffset, "claimed again from the rebuilt position")
	rows, err := live.LoadJobs(ctx, []string{"j"})
	require.NoError(t, err)
	require.EqualValues(t, 2, rows["j"].Version, "the rows match the position handed over")
}

// TestSwapLetsTheShadowCatchUp: the swap locks the live positions first
// and hands them to catchUp, while the shadow's own positions are still
// free to move; the rows and positions handed over are the shadow's after
// it caught up, so no record a live instance had projected is rolled
// back. Where the shadow still lags, the swap says how many records the
// live instances read again.
func TestSwapLetsTheShadowCatchUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	live, err := store.New(pgtest.Pool(t), store.Config{Schema: schema, Table: "jobs", ClaimLockTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, live.Migrate(ctx))
	write := func(s *store.Store, epoch, next, version int64) error {
		_, err := s.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: epoch, NextOffset: next,
			Snapshots: []store.Write{{JobID: "j", Version: version, State: json.RawMessage(`{}`), Offset: next - 1}}})
		return err
	}
	lc, err := live.Claim(ctx, "t", 0, "live")
	require.NoError(t, err)
	// The live instance projected v3 at offset 12.
	require.NoError(t, write(live, lc.Epoch, 13, 3))

	for _, tc := range []struct {
		name       string
		catchUp    bool
		wantNext   int64
		wantVer    int64
		wantReread int64
	}{
		{"caught up", true, 13, 3, 0},
		{"still behind", false, 10, 2, 3},
	} {
		shadow, err := live.Shadow()
		require.NoError(t, err)
		require.NoError(t, shadow.Reset(ctx))
		require.NoError(t, shadow.Migrate(ctx))
		sc, err := shadow.Claim(ctx, "t", 0, "shadow")
		require.NoError(t, err)
		// The shadow had read up to offset 9 (v2) when the swap began.
		require.NoError(t, write(shadow, sc.Epoch, 10, 2))

		var seen []store.PartitionPosition
		res, err := live.SwapCaughtUp(ctx, shadow, false, func(ctx context.Context, pos []store.PartitionPosition) error {
			seen = pos
			// Live batches wait while catchUp runs.
			var sw *store.SwapWaitError
			require.ErrorAs(t, write(live, lc.Epoch, 14, 4), &sw, tc.name)
			if tc.catchUp {
				return write(shadow, sc.Epoch, 13, 3)
			}
			return nil
		}, nil)
		require.NoError(t, err, tc.name)
		require.Equal(t, []store.PartitionPosition{{Topic: "t", Partition: 0, Next: 13}}, seen, tc.name)
		require.Equal(t, tc.wantReread, res.Reread, tc.name)
		pos, err := live.Positions(ctx)
		require.NoError(t, err)
		require.Len(t, pos, 1)
		require.Equal(t, tc.wantNext, pos[0].NextOffset, tc.name)
		rows, err := live.LoadJobs(ctx, []string{"j"})
		require.NoError(t, err)
		require.Equal(t, tc.wantVer, rows["j"].Version, "%s: the rows match the positions handed over", tc.name)
		lc, err = live.Claim(ctx, "t", 0, "live")
		require.NoError(t, err)
		require.NoError(t, write(live, lc.Epoch, 13, 3), "the live instance projects again from the rebuilt position")
	}
}

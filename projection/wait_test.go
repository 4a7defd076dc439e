package projection

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
	"github.com/projector/projector/wait"
)

// waiterApart is a Waiter on a pool and store of its own: a service that
// reads the model, or another instance, attached to no engine and owning
// no partition. Its poll is an hour away: it is answered by what the
// engine announces, which it does (its store's Notify is off) only
// because this Waiter holds a lease.
func (r *rig) waiterApart() *wait.Waiter {
	r.t.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.URL())
	require.NoError(r.t, err)
	r.t.Cleanup(pool.Close)
	st, err := store.New(pool, store.Config{Schema: r.store.Schema(), Table: r.store.Projection()})
	require.NoError(r.t, err)
	w, err := wait.New(wait.Config{Store: st, Poll: time.Hour})
	require.NoError(r.t, err)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(ctx)
	}()
	r.t.Cleanup(func() { stop(); <-done })
	// Its lease recorded before any write: a batch whose transaction
	// began before would commit unannounced, and wait for the poll.
	require.Eventually(r.t, func() bool {
		var live bool
		require.NoError(r.t, pgtest.Pool(r.t).QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM `+
			pgx.Identifier{r.store.Schema(), "projector_wait_leases"}.Sanitize()+` WHERE projection = $1 AND expires_at > now())`,
			r.store.Projection()).Scan(&live))
		return live
	}, 10*time.Second, time.Millisecond, "the waiter holds its lease")
	return w
}

// TestWaitersAreAnsweredByTheCommitsOfTheEngine: a Waiter apart from the
// engine (owning no partition, see waiterApart) answers a wait for a
// job's version once the batch that applies it commits; the delay from
// the write becoming visible (seen by a poller every millisecond) to the
// answer is reported, not asserted.
func TestWaitersAreAnsweredByTheCommitsOfTheEngine(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2)
	r.start(r.config())
	w := r.waiterApart()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	poller, err := pgtest.Pool(t).Acquire(ctx)
	require.NoError(t, err)
	defer poller.Release()

	const rounds = 20
	var delays []time.Duration
	for i := range rounds {
		job := "job-" + string(rune('a'+i))
		type answer struct {
			st  wait.JobState
			err error
			at  time.Time
		}
		got := make(chan answer, 1)
		go func() {
			st, err := w.WaitJob(ctx, job, 1)
			got <- answer{st, err, time.Now()}
		}()
		r.eventually(5*time.Second, "the waiter is held", func() (bool, string) { return w.Waiting() == 1, "" })
		r.produce(rec{i % 2, job, snap(job, 1, `{"n":1}`)})
		var seen time.Time
		for seen.IsZero() {
			var n int
			require.NoError(t, poller.QueryRow(ctx, `SELECT count(*) FROM `+r.store.JobsTable()+` WHERE job_id = $1`, job).Scan(&n))
			if n > 0 {
				seen = time.Now()
			} else {
				time.Sleep(time.Millisecond) // a poll's interval, not synchronisation
			}
		}
		a := <-got
		require.NoError(t, a.err)
		require.True(t, a.st.Reached)
		delays = append(delays, a.at.Sub(seen))
	}
	slices.Sort(delays)
	t.Logf("answer after the write was visible to a 1 ms poller, %d waits: median %s, max %s (negative: the answer came first)",
		rounds, delays[rounds/2], delays[rounds-1])
}

// TestWaitOnAHeldJobTimesOutWithTheMissingVersions: a job held behind a
// gap does not reach the version its held delta has; the answer at the
// timeout says which versions it waits for.
func TestWaitOnAHeldJobTimesOutWithTheMissingVersions(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	r.start(r.config(func(c *Config) { c.GapWait, c.GapWaitOff = time.Hour, false }))
	w := r.waiterApart()
	r.produce(rec{0, "g", snap("g", 1, `{"n":1}`)}, rec{0, "g", dlt("g", 4, `[{"op":"set","path":"/n","value":4}]`)})
	r.caughtUp(30 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	st, err := w.WaitJob(ctx, "g", 4)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, st.Reached)
	require.Equal(t, int64(1), st.Version)
	require.Equal(t, []int64{2, 3}, st.Missing)
}

// TestWaitByPositionPassesQuarantinedAndDuplicateRecords: a wait for the
// offset of a record that changed nothing (quarantined, or a duplicate)
// is answered once the position passes it.
func TestWaitByPositionPassesQuarantinedAndDuplicateRecords(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	r.start(r.config())
	w := r.waiterApart()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type answer struct {
		st  wait.PositionState
		err error
	}
	for _, c := range []struct {
		name  string
		value string
	}{{"quarantined", "not json"}, {"duplicate", snap("d", 1, `{}`)}} {
		offs := r.produce(rec{0, "d", snap("d", 1, `{}`)})
		r.caughtUp(30 * time.Second)
		got := make(chan answer, 1)
		go func() {
			st, err := w.WaitPosition(ctx, r.topic, 0, offs[0]+1)
			got <- answer{st, err}
		}()
		r.eventually(5*time.Second, "the waiter is held", func() (bool, string) { return w.Waiting() == 1, "" })
		at := r.produce(rec{0, "d", c.value})
		require.Equal(t, offs[0]+1, at[0])
		a := <-got
		require.NoError(t, a.err, c.name)
		require.True(t, a.st.Reached, c.name)
		require.Equal(t, at[0]+1, a.st.Position, c.name)
	}
}

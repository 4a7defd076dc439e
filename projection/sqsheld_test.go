package projection

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/app/sqsemu"
	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/internal/testkit/sqstest"
	"github.com/projector/projector/store"
)

var sharedQueueSeq atomic.Int64

// sharedQueue is one queue, by name, on two emulators: two instances each
// reading one of them work the same projection's queue (held rows are
// kept under the queue's name), and the test decides which instance
// receives which message.
type sharedQueue struct {
	t      *testing.T
	emus   [2]*sqsemu.Emulator
	urls   [2]string
	store  *store.Store
	logger *slog.Logger
}

func newSharedQueue(t *testing.T, emus [2]*sqsemu.Emulator) *sharedQueue {
	t.Helper()
	q := &sharedQueue{t: t, emus: emus, store: pgtest.Store(t),
		logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	name := fmt.Sprintf("shared-%d", sharedQueueSeq.Add(1))
	for i, e := range emus {
		url, err := e.CreateFIFO(t.Context(), name, 2*time.Second)
		require.NoError(t, err)
		q.urls[i] = url
	}
	return q
}

// start runs instance i (0 or 1) on its emulator's copy of the queue.
func (q *sharedQueue) start(i int, mod func(*Config)) *running {
	q.t.Helper()
	cfg := Config{
		Source: SourceSQS, SQS: emulatorSQS(q.emus[i], q.urls[i], 2*time.Second), Store: q.store,
		Owner: fmt.Sprintf("instance-%d", i), Logger: q.logger.With("instance", i),
		BatchSize: 100, BatchLinger: 20 * time.Millisecond, GapRetryMin: 50 * time.Millisecond, GapRetryMax: 500 * time.Millisecond,
	}
	mod(&cfg)
	p, err := New(cfg)
	require.NoError(q.t, err)
	p.adoptEvery = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{p: p, stop: cancel, done: make(chan error, 1)}
	go func() { run.done <- p.Run(ctx) }()
	q.t.Cleanup(func() { run.halt(q.t) })
	return run
}

// send sends group/value pairs to instance i's queue.
func (q *sharedQueue) send(i int, groupValues ...string) {
	q.t.Helper()
	sendSQS(q.t, q.emus[i], q.urls[i], groupValues...)
}

func (q *sharedQueue) row(id string) store.Job {
	q.t.Helper()
	rows, err := q.store.LoadJobs(q.t.Context(), []string{id})
	require.NoError(q.t, err)
	return rows[id]
}

func (q *sharedQueue) held() []store.HeldSummary {
	q.t.Helper()
	held, _, err := q.store.HeldJobs(q.t.Context(), 100)
	require.NoError(q.t, err)
	return held
}

// until polls cond every 20 ms for up to within, failing with what it
// last said.
func (q *sharedQueue) until(within time.Duration, what string, cond func() (bool, string)) time.Duration {
	q.t.Helper()
	start := time.Now()
	last := ""
	for time.Since(start) < within {
		ok, why := cond()
		if ok {
			return time.Since(start)
		}
		last = why
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
	q.t.Fatalf("%s: not within %s: %s", what, within, last)
	return 0
}

// TestSQSHeldDeltasOfAnotherInstanceLeaveNoStaleView is the adoption story
// of two instances on one queue, once with the re-read step off and once
// with it on, the gap wait far longer than the test waits:
//
//   - A holds x:3 (x is at 1); B starts and adopts it, x at 1 in its view;
//     A receives x:2 and applies x:2 and x:3; B receives x:4. B's view is
//     out of date: planned from it, x:4 would be held with nothing missing,
//     its message deleted, and x left at 3 until the re-read step (after
//     the gap wait) or for ever without it. B must apply x:4 at once.
//   - B holds y:3 (y is at 1); A, which has never seen y:3, receives y:2.
//     Applied as planned, y:2 would leave y:3 held with nothing missing.
//     A must take y:3 on and apply both, and B must drop its view of a gap
//     that another instance closed.
//
// Each act ends with the job at its last version well within the gap wait,
// no held row in the store, and neither instance reporting a held job.
func TestSQSHeldDeltasOfAnotherInstanceLeaveNoStaleView(t *testing.T) {
	if testing.Short() {
		t.Skip("two emulators, four instances: about 20 s")
	}
	emus := [2]*sqsemu.Emulator{sqstest.New(t), sqstest.New(t)}
	const gapWait = 30 * time.Second
	const within = 10 * time.Second
	for _, reread := range []bool{false, true} {
		t.Run(fmt.Sprintf("reread=%v", reread), func(t *testing.T) {
			q := newSharedQueue(t, emus)
			mod := func(c *Config) { c.GapWait, c.GapWaitOff = gapWait, false; c.NoReread = !reread }
			noneHeld := func(runs ...*running) (bool, string) {
				if h := q.held(); len(h) > 0 {
					return false, fmt.Sprintf("held rows %+v", h)
				}
				for i, r := range runs {
					if n := r.p.Status().Counters.HeldJobs; n > 0 {
						return false, fmt.Sprintf("instance %d reports %d held jobs", i, n)
					}
				}
				return true, ""
			}

			a := q.start(0, mod)
			q.send(0, "x", qsnap("x", 1, `{"n":1}`), "x", qincr("x", 3, 100))
			q.until(within, "A holds x:3", func() (bool, string) {
				h := q.held()
				return len(h) == 1 && q.row("x").Version == 1, fmt.Sprintf("held %+v", h)
			})
			b := q.start(1, mod)
			q.until(within, "B adopts x:3", func() (bool, string) {
				n := b.p.Status().Counters.HeldJobs
				return n == 1, fmt.Sprintf("B holds %d jobs", n)
			})
			q.send(0, "x", qincr("x", 2, 10))
			q.until(within, "A applies x:2 and x:3", func() (bool, string) {
				return q.row("x").Version == 3 && len(q.held()) == 0, fmt.Sprintf("x at %d", q.row("x").Version)
			})
			q.send(1, "x", qincr("x", 4, 1000))
			took := q.until(within, "B applies x:4", func() (bool, string) {
				x := q.row("x")
				return x.Version == 4, fmt.Sprintf("x at %d, held %+v", x.Version, q.held())
			})
			require.JSONEq(t, `{"n":1111}`, string(q.row("x").State))
			t.Logf("x:4 applied %s after it was sent", took.Round(time.Millisecond))
			q.until(within, "no held row, no held job reported", func() (bool, string) { return noneHeld(a, b) })

			q.send(1, "y", qsnap("y", 1, `{"n":1}`), "y", qincr("y", 3, 100))
			q.until(within, "B holds y:3", func() (bool, string) {
				h := q.held()
				return len(h) == 1 && h[0].JobID == "y" && q.row("y").Version == 1, fmt.Sprintf("held %+v", h)
			})
			q.send(0, "y", qincr("y", 2, 10))
			took = q.until(within, "A applies y:2 and y:3", func() (bool, string) {
				y := q.row("y")
				return y.Version == 3, fmt.Sprintf("y at %d, held %+v", y.Version, q.held())
			})
			require.JSONEq(t, `{"n":111}`, string(q.row("y").State))
			t.Logf("y:2 and y:3 applied %s after y:2 was sent", took.Round(time.Millisecond))
			q.until(within, "no held row, no held job reported", func() (bool, string) { return noneHeld(a, b) })
		})
	}
}

// TestSQSRefusedHeldDeltaIsQuarantined is the isolation of a refused
// batch on a queue: big:3 is held, big:2 releases it, and PostgreSQL
// refuses big:3's effect (a number past numeric's range). The record is
// applied apart from the held delta, which stays stored meanwhile, set
// aside on purpose; then big:3 alone is refused and quarantined. The job
// ends at 2 with nothing held, and the engine goes on.
func TestSQSRefusedHeldDeltaIsQuarantined(t *testing.T) {
	r := newSQSRig(t, 2*time.Second)
	run := r.start(r.config(func(c *Config) { c.NoReread = true; c.GapWait, c.GapWaitOff = time.Hour, false }))
	sendSQS(t, r.emu, r.queue,
		"big", qsnap("big", 1, `{"n":`+big+`}`),
		"big", fmt.Sprintf(`{"job_id":"big","version":3,"kind":"delta","ops":[{"op":"increment","path":"/n","by":%s}]}`, big),
		"big", `{"job_id":"big","version":2,"kind":"delta","ops":[{"op":"set","path":"/s","value":"v2"}]}`,
		"after", qsnap("after", 1, `{}`),
	)
	r.drained(30 * time.Second)
	rows, err := r.store.Jobs(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(2), rows["big"].Version)
	require.Contains(t, rows, "after")
	q, total, err := r.store.Quarantine(t.Context(), 10)
	require.NoError(t, err)
	require.Equal(t, 1, total, "%+v", q)
	require.Contains(t, q[0].Error, "SQLSTATE 22003")
	select {
	case err := <-run.done:
		t.Fatalf("the engine stopped: %v", err)
	default:
	}
	require.Zero(t, run.p.Status().Counters.HeldJobs)
}

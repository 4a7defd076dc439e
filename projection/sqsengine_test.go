package projection

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/app/sqsemu"
	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/internal/testkit/sqstest"
	sqssrc "github.com/projector/projector/source/sqs"
	"github.com/projector/projector/store"
)

// sqsRig is one test's emulator, queue and store.
type sqsRig struct {
	t     *testing.T
	emu   *sqsemu.Emulator
	queue string
	store *store.Store
}

func newSQSRig(t *testing.T, visibility time.Duration) *sqsRig {
	t.Helper()
	e := sqstest.New(t)
	return &sqsRig{t: t, emu: e, queue: sqstest.Queue(t, e, visibility), store: pgtest.Store(t)}
}

// config is a fast-reacting SQS engine configuration for tests.
func (r *sqsRig) config(mod ...func(*Config)) Config {
	cfg := Config{
		Source:      SourceSQS,
		SQS:         emulatorSQS(r.emu, r.queue, 2*time.Second),
		Store:       r.store,
		Logger:      slog.New(slog.NewTextHandler(testWriter{r.t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		BatchSize:   500, // BatchLinger: the default (none), as `projector run` has it
		GapWaitOff:  true,
		GapRetryMin: 50 * time.Millisecond,
		GapRetryMax: 500 * time.Millisecond,
	}
	for _, m := range mod {
		m(&cfg)
	}
	return cfg
}

func (r *sqsRig) start(cfg Config) *running {
	r.t.Helper()
	return startEngine(r.t, cfg)
}

// drained waits until the queue holds no message, visible or in flight,
// and no job is held.
func (r *sqsRig) drained(within time.Duration) {
	r.t.Helper()
	c, err := sqssrc.Connect(r.t.Context(), emulatorSQS(r.emu, r.queue, time.Second))
	require.NoError(r.t, err)
	defer c.Close()
	deadline := time.Now().Add(within)
	last := ""
	for time.Now().Before(deadline) {
		n, err := c.Counts(r.t.Context())
		require.NoError(r.t, err)
		held, _, err := r.store.HeldJobs(r.t.Context(), 1)
		require.NoError(r.t, err)
		if n == (SQSCounts{}) && len(held) == 0 {
			return
		}
		last = fmt.Sprintf("queue %+v, %d held", n, len(held))
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}
	r.t.Fatalf("the queue did not drain within %s: %s", within, last)
}

func qsnap(job string, v int, state string) string {
	return fmt.Sprintf(`{"job_id":%q,"version":%d,"kind":"snapshot","state":%s}`, job, v, state)
}

func qincr(job string, v int, by int) string {
	return fmt.Sprintf(`{"job_id":%q,"version":%d,"kind":"delta","ops":[{"op":"increment","path":"/n","by":%d}]}`, job, v, by)
}

// TestSQSProjects runs an engine on a queue: snapshots, deltas, a delta
// ahead of a gap that the late version fills, a duplicate, a bad record
// and a message whose group is not its job all end exact, every message
// is deleted, and the bad record's quarantine row carries its message id
// and sequence number.
func TestSQSProjects(t *testing.T) {
	r := newSQSRig(t, 2*time.Second)
	run := r.start(r.config())
	sendSQS(t, r.emu, r.queue,
		"a", qsnap("a", 1, `{"n":1}`),
		"a", qincr("a", 2, 10),
		"a", qincr("a", 4, 1000), // ahead of a gap
		"a", qincr("a", 3, 100), // fills it
		"a", qincr("a", 3, 100), // a duplicate
		"b", qsnap("b", 2, `{"n":2}`),
		"b", qsnap("b", 1, `{"n":1}`), // stale
		"c", `{"job_id":"c","version":"one"}`, // bad
		"elsewhere", qsnap("d", 1, `{"n":4}`), // group is not the job
	)
	r.drained(20 * time.Second)
	rows, err := r.store.Jobs(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(4), rows["a"].Version)
	require.JSONEq(t, `{"n":1111}`, string(rows["a"].State))
	require.Equal(t, int64(2), rows["b"].Version)
	require.Equal(t, int64(1), rows["d"].Version)
	q, total, err := r.store.Quarantine(t.Context(), 10)
	require.NoError(t, err)
	require.Equal(t, 1, total)
	require.Contains(t, q[0].Error, "version")
	require.NotEmpty(t, q[0].Coordinate.MessageID, "the quarantine row names the SQS message")
	require.NotEmpty(t, q[0].Coordinate.SequenceNumber)
	require.True(t, strings.HasPrefix(q[0].Topic, "sqs:"), q[0].Topic)

	s := run.p.Status()
	require.Equal(t, int64(9), s.Counters.Consumed)
	require.Equal(t, int64(1), s.Counters.Duplicates)
	require.Equal(t, int64(1), s.Counters.Stale)
	require.Equal(t, int64(1), s.Counters.Held, "a:4 waits for a:3")
	require.Equal(t, int64(1), s.Counters.Quarantined)
	require.Equal(t, SourceSQS, s.Source)
	require.NotNil(t, s.SQS)
	require.Equal(t, int64(1), s.SQS.Counters.GroupNotJobID)
	// The queue is empty once the deletes answered; the counter follows.
	require.Eventually(t, func() bool {
		c := run.p.Status().SQS.Counters
		return c.Deleted == c.Received
	}, 5*time.Second, 10*time.Millisecond, "every message received was deleted")
	require.True(t, run.p.Ready(), "%+v", run.p.Readiness())
}

// TestSQSAdoptsHeldDeltasOfAnotherInstance: another instance on the queue
// held a delta and stopped for good, leaving it in projector_held; a
// running instance, which did not see it at its start, adopts it and
// applies it once the missing version arrives.
func TestSQSAdoptsHeldDeltasOfAnotherInstance(t *testing.T) {
	r := newSQSRig(t, 2*time.Second)
	p, err := New(r.config())
	require.NoError(t, err)
	p.adoptEvery = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{p: p, stop: cancel, done: make(chan error, 1)}
	go func() { run.done <- p.Run(ctx) }()
	t.Cleanup(func() { run.halt(t) })

	sendSQS(t, r.emu, r.queue, "x", qsnap("x", 1, `{"n":1}`))
	require.Eventually(t, func() bool { return p.Status().Counters.Applied == 1 }, 10*time.Second, 20*time.Millisecond)
	// The other instance's batch: x:3 held, behind the missing x:2.
	_, err = r.store.Apply(t.Context(), &store.Batch{Topic: p.Config().Topic, Unfenced: true, NextOffset: 1,
		Hold:        []store.Held{{JobID: "x", Version: 3, Offset: 99, Ops: []byte(`[{"op":"increment","path":"/n","by":100}]`), Since: time.Now()}},
		Coordinates: map[int64]store.Coordinate{99: {MessageID: "m-99", SequenceNumber: "99"}}})
	require.NoError(t, err)
	held, _, err := r.store.HeldJobs(t.Context(), 10)
	require.NoError(t, err)
	require.Len(t, held, 1)

	sendSQS(t, r.emu, r.queue, "x", qincr("x", 2, 10))
	r.drained(20 * time.Second)
	rows, err := r.store.Jobs(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(3), rows["x"].Version)
	require.JSONEq(t, `{"n":111}`, string(rows["x"].State))
	require.Zero(t, p.Status().Counters.HeldJobs)
}

package projection

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/observe"
	sqssrc "github.com/projector/projector/source/sqs"
	"github.com/projector/projector/source/sqs/sqscfg"
	"github.com/projector/projector/store"
)

// TestSpilledHeldDeltaReleasedElsewhereIsNotAnOutage: past half the cache
// budget, held deltas adopted from the queue are kept without their ops,
// which stay in PostgreSQL. Another instance then releases one (it applied
// x:2 and x:3). When x:4 arrives here, the plan finds x:3's ops stored no
// more: that is the job moved on elsewhere, not a database failure. The
// job is read again and x:4 applied in the same commit, with no database
// error counted, no outage logged, and no reload of the whole state.
func TestSpilledHeldDeltaReleasedElsewhereIsNotAnOutage(t *testing.T) {
	t.Parallel()
	st := pgtest.Store(t)
	logs := &logLines{t: t}
	// The queue is never asked: batches are planned and committed here.
	q := SQS{QueueURL: "http://127.0.0.1:1/000000000000/spill.fifo", Region: "us-east-1",
		Credentials: &sqscfg.Credentials{AccessKeyID: "k", SecretAccessKey: "s"}}.WithDefaults()
	p, err := New(Config{Source: SourceSQS, SQS: q, Store: st, GapWaitOff: true, NoReread: true, Logger: logs.logger()})
	require.NoError(t, err)
	// A budget of one byte: the first held job pins past half of it, and
	// every held job after it keeps its ops in PostgreSQL.
	w := &worker{workerDeps: p.workerDeps(), beat: &observe.Beat{}, topic: p.Config().Topic, position: -1,
		log: p.cfg.Logger, cache: newJobCache(newCacheBudget(1)), stored: -1}
	w.detector = gapfill.NewDetector(w.cfg.GapPolicy)
	r := sqssrc.NewReader(p.src.(*sqssrc.Queue).Client(), p.cfg.Logger, 10)
	w.lane = sqssrc.NewLane(w.topic, r, 10, 0)
	// The receiver never runs: batches are handed to the worker here.
	w.src = sqssrc.NewSource(r, 10, 0)
	ctx := t.Context()

	other := func(b store.Batch) {
		t.Helper()
		b.Topic, b.Unfenced, b.NextOffset = w.topic, true, 1
		_, err := st.Apply(ctx, &b)
		require.NoError(t, err)
	}
	ops := func(by int) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`[{"op":"increment","path":"/n","by":%d}]`, by))
	}
	other(store.Batch{
		Snapshots: []store.Write{{JobID: "a", Version: 1, State: json.RawMessage(`{"n":1}`)}, {JobID: "x", Version: 1, State: json.RawMessage(`{"n":1}`)}},
		Hold: []store.Held{{JobID: "a", Version: 3, Ops: ops(100), Since: time.Now()},
			{JobID: "x", Version: 3, Ops: ops(100), Since: time.Now()}},
	})
	require.NoError(t, w.adoptHeld(ctx))
	x, ok := w.cache.peek("x")
	require.True(t, ok)
	require.True(t, spilled(x), "x's held delta is kept without its ops")
	require.Equal(t, int64(1), x.Version)

	// The other instance applies x:2 and x:3.
	other(store.Batch{
		Updates: []store.Write{{JobID: "x", Version: 3, State: json.RawMessage(`{"n":111}`), Expect: 1}},
		Release: []store.HeldKey{{JobID: "x", Version: 3}},
	})

	m := sqssrc.Message{ID: "m-4", Sequence: "4", Body: []byte(qincr("x", 4, 1000))}
	rec := Record{Value: m.Body, Time: time.Now(), Coord: Coord{Partition: -1, Offset: m.Offset(), MessageID: m.ID, Sequence: m.Sequence}}
	require.NoError(t, w.commit(ctx, []Record{rec}, nil))

	rows, err := st.LoadJobs(ctx, []string{"x"})
	require.NoError(t, err)
	require.Equal(t, int64(4), rows["x"].Version)
	require.JSONEq(t, `{"n":1111}`, string(rows["x"].State))
	require.Zero(t, p.counters.dbErrors.Load(), "a held delta released elsewhere was counted as a database error")
	require.Empty(t, logs.matching("PostgreSQL is failing"), "a held delta released elsewhere was logged as an outage")
	held, err := st.LoadHeld(ctx, w.topic, 0)
	require.NoError(t, err)
	require.Len(t, held, 1, "a:3 is still held")
	_, stillHeld := w.detector.Gap("x")
	require.False(t, stillHeld, "x is not held any more")
	_, aHeld := w.detector.Gap("a")
	require.True(t, aHeld)
}

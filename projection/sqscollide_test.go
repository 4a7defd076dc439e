package projection

import (
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/observe"
	sqssrc "github.com/projector/projector/source/sqs"
	"github.com/projector/projector/source/sqs/sqscfg"
)

// TestSQSOffsetCollisionKeepsEachMessage: two SQS messages whose sequence
// numbers are equal modulo 2^63 share an offset. Met in one batch, each
// held delta's row and each quarantine row name their own message, and
// neither quarantine row is dropped as a duplicate of the other.
func TestSQSOffsetCollisionKeepsEachMessage(t *testing.T) {
	t.Parallel()
	st := pgtest.Store(t)
	// The queue is never asked: the batch is planned and committed here.
	q := SQS{QueueURL: "http://127.0.0.1:1/000000000000/collide.fifo", Region: "us-east-1",
		Credentials: &sqscfg.Credentials{AccessKeyID: "k", SecretAccessKey: "s"}}.WithDefaults()
	p, err := New(Config{Source: SourceSQS, SQS: q, Store: st, GapWaitOff: true,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	require.NoError(t, err)
	w := &worker{workerDeps: p.workerDeps(), beat: &observe.Beat{}, topic: p.Config().Topic, position: -1,
		log: p.cfg.Logger, cache: newJobCache(p.budget), stored: -1}
	w.detector = gapfill.NewDetector(w.cfg.GapPolicy)
	r := sqssrc.NewReader(p.src.(*sqssrc.Queue).Client(), p.cfg.Logger, 10)
	w.lane = sqssrc.NewLane(w.topic, r, 10, 0)
	// The receiver never runs: batches are handed to the worker here.
	w.src = sqssrc.NewSource(r, 10, 0)

	rec := func(id, seq, body string) Record {
		m := sqssrc.Message{ID: id, Sequence: seq, Body: []byte(body)}
		return Record{Value: m.Body, Time: time.Now(), Coord: Coord{Partition: -1, Offset: m.Offset(), MessageID: id, Sequence: seq}}
	}
	recs := []Record{
		rec("m-a", "7", qincr("a", 3, 1)),                   // held: a is at 0
		rec("m-b", "9223372036854775815", qincr("b", 5, 1)), // held too, same offset
		rec("m-c", "18446744073709551623", `{"job_id":"c"`), // bad, same offset
		rec("m-d", "27670116110564327431", `{"job_id":"d"`), // bad, same offset
	}
	for _, r := range recs {
		require.Equal(t, int64(7), r.Coord.Offset)
	}
	require.NoError(t, w.commit(t.Context(), recs, nil))

	held, err := st.LoadHeld(t.Context(), w.topic, 0)
	require.NoError(t, err)
	var got []string
	for _, h := range held {
		got = append(got, h.JobID+" "+h.Coordinate.MessageID+" "+h.Coordinate.SequenceNumber)
	}
	require.Equal(t, []string{"a m-a 7", "b m-b 9223372036854775815"}, got)

	qs, total, err := st.Quarantine(t.Context(), 10)
	require.NoError(t, err)
	require.Equal(t, 2, total, "%+v", qs)
	got = nil
	for _, r := range qs {
		got = append(got, r.Coordinate.MessageID+" "+r.Coordinate.SequenceNumber+" "+string(r.Value))
	}
	sort.Strings(got)
	require.Equal(t, []string{`m-c 18446744073709551623 {"job_id":"c"`, `m-d 27670116110564327431 {"job_id":"d"`}, got)
}

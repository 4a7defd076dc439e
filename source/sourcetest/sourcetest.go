package sourcetest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/source"
)

// Order scopes: what a source keeps in order.
const (
	// OrderLane: the lane is one ordered log; every record comes in the
	// order produced, whatever its key (a Kafka partition).
	OrderLane = "partition"
	// OrderGroup: records of one key or group come in the order produced;
	// groups interleave (an SQS FIFO queue's message groups).
	OrderGroup = "group"
)

// Features say what a source's lanes are and can do; the suite checks
// what they claim and skips nothing else.
type Features struct {
	// OrderScope is OrderLane or OrderGroup.
	OrderScope string
	// Fenced, Log and Shared are the lane's [source.LaneCaps]. A Log lane
	// has bounds, a record at an offset and ends, its records have
	// offsets, and it is opened again at a position: the one
	// [source.LaneHooks.Committed] was told. A lane without a log answers
	// [source.ErrNoLog] and ends at -1, and releases what was not
	// acknowledged to be received again.
	Fenced, Log, Shared bool
	// Outage: [Env.Link] is set, and cutting it makes the service
	// unreachable.
	Outage bool
}

// Message is one record to produce: Key is the record's key on a Kafka
// lane and its message group on an SQS queue; Value its value.
type Message struct{ Key, Value string }

// Env is one fresh lane on the service, nothing produced into it yet.
type Env struct {
	Lane source.Lane
	// Produce appends msgs to the lane in order and returns once the
	// service accepted them.
	Produce func(t *testing.T, msgs ...Message)
	// Link is the network between the lane and the service, when
	// Features.Outage.
	Link *Link
}

// Options are what a case asks of a fresh lane.
type Options struct {
	// BatchSize bounds the records one Fetch returns.
	BatchSize int
	// Redelivery, when set, is how soon a record received and neither
	// acknowledged nor released comes back on a queue (its visibility
	// timeout): a receive whose answer an outage lost took it. Zero: far
	// longer than the suite waits, so that a record comes back in time
	// only when its reader released it. A log ignores it.
	Redelivery time.Duration
}

// Harness makes the lanes the suite reads.
type Harness struct {
	Features Features
	// New returns a fresh lane for t as o asks. What it starts ends with
	// t.
	New func(t *testing.T, o Options) Env
	// Within bounds how long the suite waits for records to arrive
	// (default 30s): a deadline for a failure message, not a measurement.
	Within time.Duration
}

// Run runs every case of the suite against h, each as a subtest of t, in
// parallel.
func Run(t *testing.T, h Harness) {
	if h.Within == 0 {
		h.Within = 30 * time.Second
	}
	switch h.Features.OrderScope {
	case OrderLane, OrderGroup:
	default:
		t.Fatalf("sourcetest: Features.OrderScope %q: want %q or %q", h.Features.OrderScope, OrderLane, OrderGroup)
	}
	for _, c := range []struct {
		name string
		run  func(t *testing.T, h Harness)
	}{
		{"Caps", testCaps},
		{"DeliversEveryRecordInOrderInBatches", testDelivers},
		{"AckOnlyAfterCommit", testAckAfterCommit},
		{"ReleaseOnClose", testReleaseOnClose},
		{"Ends", testEnds},
		{"Lag", testLag},
		{"StartLast", testStartLast},
		{"Outage", testOutage},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, h)
		})
	}
}

// messages returns n messages over keys keys, interleaved: key k<i%keys>,
// value "<key>/<from+i>", so that a value names its key and its place in
// the order produced.
func messages(from, n, keys int) []Message {
	out := make([]Message, n)
	for i := range out {
		k := fmt.Sprintf("k%d", (from+i)%keys)
		out[i] = Message{Key: k, Value: fmt.Sprintf("%s/%d", k, from+i)}
	}
	return out
}

func values(msgs []Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Value
	}
	return out
}

// reader is an open lane with what its hooks were told.
type reader struct {
	h     Harness
	r     source.Reader
	batch int
	// committed is the last position LaneHooks.Committed was told, -1 for
	// none.
	committed atomic.Int64
	lost      atomic.Int64
	closeOnce sync.Once
}

func open(t *testing.T, h Harness, env Env, batch int, position, start int64) *reader {
	t.Helper()
	rd := &reader{h: h, batch: batch}
	rd.committed.Store(-1)
	r, err := env.Lane.Open(t.Context(), position, start, source.LaneHooks{
		Committed: func(next int64) { rd.committed.Store(next) },
		Moved:     func(int64) {},
		NewLog:    func(_ context.Context, p int64) (int64, error) { return p, nil },
		Lost:      &rd.lost,
	})
	require.NoError(t, err, "Open")
	rd.r = r
	t.Cleanup(func() { rd.close(t) })
	return rd
}

func (rd *reader) close(t *testing.T) {
	rd.closeOnce.Do(func() { require.NoError(t, rd.r.Close(), "Close") })
}

// fetch is one Fetch, checked for what holds of every batch: no more
// records than the batch size, no error that ends the lane.
func (rd *reader) fetch(t *testing.T, wait time.Duration) ([]source.Record, error) {
	t.Helper()
	recs, err := rd.r.Fetch(t.Context(), wait)
	require.LessOrEqual(t, len(recs), rd.batch, "a batch of at most the batch size")
	require.NoError(t, rd.r.Err(), "Err while the service answers or is merely unreachable")
	if err != nil {
		require.Empty(t, recs, "records and an error from one Fetch")
	}
	return recs, err
}

// collect fetches until n records came, requiring no Fetch error, and
// acknowledges each batch when ack says so; it returns the batches.
func (rd *reader) collect(t *testing.T, n int, ack bool) [][]source.Record {
	t.Helper()
	var batches [][]source.Record
	got := 0
	for deadline := time.Now().Add(rd.h.Within); got < n && time.Now().Before(deadline); {
		recs, err := rd.fetch(t, 500*time.Millisecond)
		require.NoError(t, err, "Fetch while the service answers")
		if len(recs) == 0 {
			continue
		}
		batches = append(batches, recs)
		got += len(recs)
		if ack {
			require.NoError(t, rd.r.Ack(t.Context(), recs))
		}
	}
	require.GreaterOrEqual(t, got, n, "records delivered within %s", rd.h.Within)
	return batches
}

// quiet requires that nothing more comes within d.
func (rd *reader) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); {
		recs, err := rd.fetch(t, time.Until(end))
		require.NoError(t, err)
		require.Empty(t, recs, "records beyond those produced, or delivered twice: %v", vals(recs))
	}
}

func flat(batches [][]source.Record) []source.Record {
	var out []source.Record
	for _, b := range batches {
		out = append(out, b...)
	}
	return out
}

func vals(recs []source.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = string(r.Value)
	}
	return out
}

// keyOf is a delivered record's key or group, as the order scope sees
// it.
func (h Harness) keyOf(r source.Record) string {
	if h.Features.OrderScope == OrderGroup && r.Coord.Group != "" {
		return r.Coord.Group
	}
	return string(r.Key)
}

// checkDelivery requires recs to be exactly want, each once, in the
// order the source keeps: all of it on a lane ordered as a whole, within
// each key or group otherwise. Each record's key or group is the one it
// was produced with.
func (h Harness) checkDelivery(t *testing.T, recs []source.Record, want []string) {
	t.Helper()
	require.ElementsMatch(t, want, vals(recs), "every record produced delivered, each once, nothing else")
	place := map[string]int{}
	for i, v := range want {
		place[v] = i
	}
	last := map[string]int{}
	prev, prevOffset := -1, int64(-1)
	for _, r := range recs {
		v := string(r.Value)
		k, _, _ := strings.Cut(v, "/")
		require.Equal(t, k, h.keyOf(r), "record %s: its key or group", v)
		i := place[v]
		if h.Features.OrderScope == OrderLane {
			require.Greater(t, i, prev, "record %s after a record produced later, on a lane ordered as a whole", v)
			prev = i
		} else {
			if p, ok := last[k]; ok {
				require.Greater(t, i, p, "record %s after a record of its group produced later", v)
			}
			last[k] = i
		}
		if h.Features.Log {
			require.Greater(t, r.Coord.Offset, prevOffset, "record %s: offsets go up", v)
			prevOffset = r.Coord.Offset
		}
	}
}

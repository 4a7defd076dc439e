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
		Lost:      &atomic.Int64{},
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

func testCaps(t *testing.T, h Harness) {
	env := h.New(t, Options{BatchSize: 10})
	f := h.Features
	require.Equal(t, source.LaneCaps{Fenced: f.Fenced, Log: f.Log, Shared: f.Shared}, env.Lane.Caps())
	topic, _ := env.Lane.Scope()
	require.NotEmpty(t, topic, "Scope names the lane's rows in the store")
	require.Equal(t, f.Outage, env.Link != nil, "Features.Outage and Env.Link")
}

// testDelivers: records produced before and while a reader reads, over
// twelve keys interleaved, come back each once, in the order the source
// keeps, in batches of at most the batch size (full ones among them
// while the reader is behind), with Err nil throughout; then a Fetch
// returns nothing and no error once its wait passed.
func testDelivers(t *testing.T, h Harness) {
	// More keys than the batch size: a queue that hands out one message
	// of a group at a time (SQS FIFO while the group has one in flight)
	// can fill a batch too.
	const batch, keys = 7, 12
	env := h.New(t, Options{BatchSize: batch})
	first := messages(0, 60, keys)
	env.Produce(t, first...)
	rd := open(t, h, env, batch, -1, source.StartFirst)
	batches := rd.collect(t, 10, true)
	more := messages(60, 25, keys)
	env.Produce(t, more...)
	got := flat(batches)
	batches = append(batches, rd.collect(t, 85-len(got), true)...)
	want := append(values(first), values(more)...)
	h.checkDelivery(t, flat(batches), want)
	full := 0
	for _, b := range batches {
		if len(b) == batch {
			full++
		}
	}
	require.Positive(t, full, "no full batch while 60 records waited: batch lengths %v", lens(batches))
	t.Logf("85 records in %d batches (%d full): %v", len(batches), full, lens(batches))
	rd.quiet(t, time.Second)
}

func lens(batches [][]source.Record) []int {
	out := make([]int, len(batches))
	for i, b := range batches {
		out[i] = len(b)
	}
	return out
}

// testAckAfterCommit: of two batches read, the first acknowledged and
// the second not, after Close and a new Open (at the position the
// Committed hook was told, on a log) the second comes back, and
// everything after it, each once and in order; the first never does. On a
// log, the Committed hook is told the position after the acknowledged
// batch, and nothing before an Ack.
func testAckAfterCommit(t *testing.T, h Harness) {
	const batch = 4
	env := h.New(t, Options{BatchSize: batch})
	msgs := messages(0, 12, 2)
	env.Produce(t, msgs...)

	rd := open(t, h, env, batch, -1, source.StartFirst)
	a := rd.collect(t, 1, false)[0]
	require.EqualValues(t, -1, rd.committed.Load(), "Committed told of a position before any Ack")
	require.NoError(t, rd.r.Ack(t.Context(), a))
	position := int64(-1)
	if h.Features.Log {
		position = rd.committed.Load()
		require.Equal(t, a[len(a)-1].Next(), position, "Committed is told the position after the acknowledged batch")
	}
	b := rd.collect(t, 1, false)[0]
	rd.close(t)

	acked := map[string]bool{}
	for _, r := range a {
		acked[string(r.Value)] = true
	}
	var want []string
	for _, v := range values(msgs) {
		if !acked[v] {
			want = append(want, v)
		}
	}
	require.Len(t, want, len(msgs)-len(a))

	again := open(t, h, env, batch, position, source.StartFirst)
	got := flat(again.collect(t, len(want), true))
	h.checkDelivery(t, got, want)
	for _, r := range b {
		require.Contains(t, vals(got), string(r.Value), "a batch read and not acknowledged comes back")
	}
	again.quiet(t, time.Second)
	t.Logf("acknowledged %d, not acknowledged %d, delivered again %d", len(a), len(b), len(got))
}

// testReleaseOnClose: a reader that read one batch, and may have read
// ahead, is closed with nothing acknowledged; a new reader of the lane
// (from the start, on a log) receives every record, each once and in
// order: Close neither loses nor keeps what its reader held. On a queue
// the harness's visibility timeout is far longer than the suite waits,
// so only the release brings them back in time.
func testReleaseOnClose(t *testing.T, h Harness) {
	// More keys than the batch size, so that a queue's receiver has read
	// ahead of the batch (SQS FIFO hands out one message per group in
	// flight).
	const batch, keys = 3, 10
	env := h.New(t, Options{BatchSize: batch})
	msgs := messages(0, 30, keys)
	env.Produce(t, msgs...)
	rd := open(t, h, env, batch, -1, source.StartFirst)
	first := rd.collect(t, 1, false)
	rd.close(t)
	again := open(t, h, env, batch, -1, source.StartFirst)
	got := flat(again.collect(t, len(msgs), true))
	h.checkDelivery(t, got, values(msgs))
	again.quiet(t, time.Second)
	t.Logf("the closed reader had fetched %d", len(flat(first)))
}

// testEnds: on a log, Bounds reads the log's start and end, RecordAt the
// record at an offset, and Ends the end as the reader last saw it once it
// read to the end; without a log, Bounds and RecordAt answer ErrNoLog and
// Ends -1.
func testEnds(t *testing.T, h Harness) {
	env := h.New(t, Options{BatchSize: 10})
	msgs := messages(0, 5, 2)
	env.Produce(t, msgs...)
	rd := open(t, h, env, 10, -1, source.StartFirst)
	recs := flat(rd.collect(t, len(msgs), true))
	hwm, stable := rd.r.Ends()
	if !h.Features.Log {
		require.EqualValues(t, -1, hwm, "Ends without a log")
		require.EqualValues(t, -1, stable, "Ends without a log")
		_, _, err := env.Lane.Bounds(t.Context())
		require.ErrorIs(t, err, source.ErrNoLog)
		_, err = env.Lane.RecordAt(t.Context(), 0)
		require.ErrorIs(t, err, source.ErrNoLog)
		return
	}
	first, end, err := env.Lane.Bounds(t.Context())
	require.NoError(t, err)
	require.Equal(t, recs[0].Coord.Offset, first, "Bounds: the log starts at the first record")
	require.Equal(t, recs[len(recs)-1].Next(), end, "Bounds: the log ends after the last record")
	require.Equal(t, end, hwm, "Ends: the high watermark once read to the end")
	require.Equal(t, end, stable, "Ends: no transaction, the last stable offset is the high watermark")
	r, err := env.Lane.RecordAt(t.Context(), recs[2].Coord.Offset)
	require.NoError(t, err)
	require.Equal(t, msgs[2].Value, string(r.Value))
	require.Equal(t, msgs[2].Key, string(r.Key))
	require.Equal(t, recs[2].Coord.Offset, r.Coord.Offset)
}

// testStartLast: on a log, a reader with no position opened at StartLast
// reads only what is produced after it opened. A lane without a log has
// no start to choose: the case checks nothing there.
func testStartLast(t *testing.T, h Harness) {
	if !h.Features.Log {
		t.Skip("a lane without a log has no start to choose (Features.Log false)")
	}
	env := h.New(t, Options{BatchSize: 10})
	env.Produce(t, messages(0, 3, 1)...)
	rd := open(t, h, env, 10, -1, source.StartLast)
	// The reader knows where the log ends once it fetched once: wait for
	// the end it saw, then produce.
	for deadline := time.Now().Add(h.Within); ; {
		recs, err := rd.fetch(t, 100*time.Millisecond)
		require.NoError(t, err)
		require.Empty(t, recs, "records produced before a reader opened at StartLast")
		if hwm, _ := rd.r.Ends(); hwm == 3 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the reader saw no end of the log within %s", h.Within)
	}
	more := messages(3, 2, 1)
	env.Produce(t, more...)
	h.checkDelivery(t, flat(rd.collect(t, 2, true)), values(more))
	rd.quiet(t, 500*time.Millisecond)
}

// testOutage: with the service cut, Fetch returns an error (the engine
// reports the outage) and Err stays nil (an outage does not end the
// lane); restored, the reader delivers what was produced meanwhile, each
// once and in order, with no Open again.
func testOutage(t *testing.T, h Harness) {
	if !h.Features.Outage {
		t.Skip("the harness cannot cut the service (Features.Outage false)")
	}
	const batch = 5
	// A receive the cut interrupts may have been answered on the service
	// (SQS: a long poll open on the server takes messages produced
	// meanwhile): its messages come back after a short visibility
	// timeout.
	env := h.New(t, Options{BatchSize: batch, Redelivery: 2 * time.Second})
	before := messages(0, 4, 2)
	env.Produce(t, before...)
	rd := open(t, h, env, batch, -1, source.StartFirst)
	h.checkDelivery(t, flat(rd.collect(t, len(before), true)), values(before))

	env.Link.Cut()
	cut := time.Now()
	during := messages(4, 6, 2)
	env.Produce(t, during...)
	var got []source.Record
	var fetchErr error
	for deadline := time.Now().Add(2 * h.Within); fetchErr == nil && time.Now().Before(deadline); {
		recs, err := rd.fetch(t, 500*time.Millisecond)
		fetchErr = err
		got = append(got, recs...)
		require.NoError(t, rd.r.Ack(t.Context(), recs))
	}
	require.Error(t, fetchErr, "Fetch reports the unreachable service with an error within %s", 2*h.Within)
	reported := time.Since(cut)
	t.Logf("outage reported after %s: %v", reported.Round(time.Millisecond), fetchErr)

	env.Link.Restore()
	restored := time.Now()
	var errs int
	for deadline := time.Now().Add(2 * h.Within); len(got) < len(during) && time.Now().Before(deadline); {
		recs, err := rd.fetch(t, 500*time.Millisecond)
		if err != nil {
			errs++ // reported again until the reader reconnected
			continue
		}
		got = append(got, recs...)
		require.NoError(t, rd.r.Ack(t.Context(), recs))
	}
	h.checkDelivery(t, got, values(during))
	t.Logf("recovered: %d records %s after the restore (%d errors after it)", len(got), time.Since(restored).Round(time.Millisecond), errs)
	rd.quiet(t, time.Second)
	require.NoError(t, rd.r.Err())
}

// testLag: Lag counts the records produced and not acknowledged: all of
// them less the first batch once it was acknowledged, none once every
// record was.
func testLag(t *testing.T, h Harness) {
	const batch, n = 3, 10
	env := h.New(t, Options{BatchSize: batch})
	env.Produce(t, messages(0, n, n)...)
	rd := open(t, h, env, batch, -1, source.StartFirst)
	first := rd.collect(t, 1, true)[0]
	rd.lagIs(t, int64(n-len(first)), "after the first batch was acknowledged")
	rd.collect(t, n-len(first), true)
	rd.lagIs(t, 0, "once every record was acknowledged")
}

// lagIs requires Lag to come to want: a queue's counts and a log's end
// as the reader saw it may trail the last Ack briefly.
func (rd *reader) lagIs(t *testing.T, want int64, when string) {
	t.Helper()
	var lag int64
	var err error
	for deadline := time.Now().Add(rd.h.Within); time.Now().Before(deadline); {
		lag, err = rd.r.Lag(t.Context())
		require.NoError(t, err, "Lag %s", when)
		if lag == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, want, lag, "Lag %s", when)
}

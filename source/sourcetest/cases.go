package sourcetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/source"
)

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

package projection

import (
	"hash/crc32"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestRereadGoesOnPastABatchWhoseLastRecordsWereCompactedAway: Kafka's log
// cleaner keeps a batch's offset range when it removes records from it
// (the batch's last offset stays, so that a producer's sequence is kept),
// and a fetch reads from one log segment only. A fetch at an offset among
// the removed records of a cleaned segment's last batch is answered with
// that batch alone: no record at or after the offset. The re-read must go
// on past the batch's end, to the next segment, and complete there.
//
// kfake's cleaner cuts a cleaned batch to its last kept record, so the
// cleaned segments are served here by hand: offsets 0 to 4, one batch, and
// 5 to 9, one batch cleaned down to offsets 5 and 6 that keeps its range
// to 9. The active segment, from offset 10, is kfake's own, with the
// version the re-read looks for. Before the fix the re-read asked for
// offset 7, was answered with the cleaned batch alone, and stopped there
// with an error: the version at offset 11 was never found.
func TestRereadGoesOnPastABatchWhoseLastRecordsWereCompactedAway(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	filler := func(from, n int) []rec {
		out := make([]rec, n)
		for i := range out {
			out[i] = rec{0, "other", snap("other", int64(from+i+1), `{}`)}
		}
		return out
	}
	// What the cleaned segment stood for: offsets 0 to 9 in two batches.
	r.produce(filler(0, 5)...)
	r.produce(filler(5, 5)...)
	offs := r.produce(rec{0, "other", snap("other", 11, `{}`)}, rec{0, "job", dlt("job", 2, `[{"op":"set","path":"/a","value":1}]`)}, rec{0, "other", snap("other", 13, `{}`)})
	require.Equal(t, []int64{10, 11, 12}, offs)

	now := time.Now()
	kept := func(from, n int) []kmsg.Record {
		out := make([]kmsg.Record, n)
		for i := range out {
			out[i] = kmsg.Record{OffsetDelta: int32(i), Key: []byte("other"), Value: []byte(snap("other", int64(from+i+1), `{}`))}
		}
		return out
	}
	first := encodeBatch(0, 4, now, kept(0, 5)...)
	cleanedBatch := encodeBatch(5, 4, now, kept(5, 2)...)

	kf := r.kafka.Kfake()
	var cleaned atomic.Int32
	kf.ControlKey(kmsg.Fetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		f := req.(*kmsg.FetchRequest)
		if len(f.Topics) != 1 || len(f.Topics[0].Partitions) != 1 || f.Topics[0].Topic != r.topic {
			return nil, nil, false
		}
		offset := f.Topics[0].Partitions[0].FetchOffset
		var records []byte
		switch {
		case offset >= 10:
			return nil, nil, false // the active segment: kfake's own
		case offset >= 5:
			records = cleanedBatch
		default:
			records = first
		}
		cleaned.Add(1)
		resp := f.ResponseKind().(*kmsg.FetchResponse)
		st := kmsg.NewFetchResponseTopic()
		st.Topic, st.TopicID = f.Topics[0].Topic, f.Topics[0].TopicID
		sp := kmsg.NewFetchResponseTopicPartition()
		sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = 13, 13, 0
		sp.RecordBatches = records
		st.Partitions = append(st.Partitions, sp)
		resp.Topics = append(resp.Topics, st)
		return resp, nil, true
	})

	cfg := r.config().WithDefaults()
	p, err := New(cfg)
	require.NoError(t, err)
	found, err := (&logReader{r: p.src.Rereader()}).Reread(t.Context(), []string{"job"}, now.Add(-time.Minute))
	require.NoError(t, err, "the re-read stopped at the cleaned batch instead of reading on to the log's end")
	require.Len(t, found, 1)
	require.Equal(t, int64(11), found[0].Offset)
	require.Equal(t, int64(2), found[0].Event.Version)
	require.GreaterOrEqual(t, cleaned.Load(), int32(2), "both cleaned segments were read")
}

// encodeBatch encodes a v2 record batch at base whose last offset is
// base+lastDelta, whatever records it holds: Kafka's cleaner keeps a
// batch's range when it removes records from it.
func encodeBatch(base int64, lastDelta int32, ts time.Time, recs ...kmsg.Record) []byte {
	var raw []byte
	for _, rec := range recs {
		// A record's length is that of what follows it.
		rec.Length = 0
		body := rec.AppendTo(nil)
		rec.Length = int32(len(body) - 1)
		raw = rec.AppendTo(raw)
	}
	b := kmsg.RecordBatch{
		FirstOffset: base, Magic: 2, LastOffsetDelta: lastDelta,
		FirstTimestamp: ts.UnixMilli(), MaxTimestamp: ts.UnixMilli(),
		ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1,
		NumRecords: int32(len(recs)), Records: raw,
	}
	enc := b.AppendTo(nil)
	b.Length = int32(len(enc) - 12)
	enc = b.AppendTo(nil)
	b.CRC = int32(crc32.Checksum(enc[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b.AppendTo(nil)
}

// TestRereadCompletesOnACompactedTopic: a compacted topic whose cleaner
// removed the records of superseded keys, and a log that ends in records
// superseded before the cleaning: the re-read reads to the end it saw
// when it started, finds the version it looks for, and says it is
// complete.
func TestRereadCompletesOnACompactedTopic(t *testing.T) {
	t.Parallel()
	r := newRigTopicConfig(t, 1, kafka.ConfigEntry{ConfigName: "cleanup.policy", ConfigValue: "compact"})
	for i := range 5 {
		r.produce(rec{0, "other", snap("other", int64(i+1), `{}`)}, rec{0, "gone", snap("gone", int64(i+1), `{}`)})
	}
	r.produce(rec{0, "job", dlt("job", 2, `[{"op":"set","path":"/a","value":1}]`)})
	for i := range 5 {
		r.produce(rec{0, "other", snap("other", int64(i+6), `{}`)}, rec{0, "gone", snap("gone", int64(i+6), `{}`)})
	}
	r.produce(rec{0, "other", snap("other", 11, `{}`)})
	r.kafka.Kfake().Compact()
	cfg := r.config().WithDefaults()
	p, err := New(cfg)
	require.NoError(t, err)
	found, err := (&logReader{r: p.src.Rereader()}).Reread(t.Context(), []string{"job"}, time.Now().Add(-time.Minute))
	require.NoError(t, err)
	require.Len(t, found, 1)
	require.Equal(t, int64(10), found[0].Offset)
}

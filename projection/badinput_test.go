package projection

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

// Every kind of bad record lands in the quarantine, stored raw with an error
// that names the problem, and the stream moves on: the good snapshot
// produced right after it in the same partition is applied.
func TestBadRecordsAreQuarantinedRawAndTheStreamMovesOn(t *testing.T) {
	t.Parallel()
	huge := snap("huge", 1, fmt.Sprintf(`{"blob":%q}`, strings.Repeat("x", 1<<20)))
	cases := []struct {
		name  string
		key   []byte
		value []byte
		// want are substrings of the stored error.
		want []string
	}{
		{"malformed JSON", []byte("bad-json"), []byte(`{"job_id":"bad-json","version":1,`), []string{"value", "malformed JSON"}},
		{"not an object", []byte("bad-array"), []byte(`["bad-array",1,"snapshot"]`), []string{"value", "not a JSON object"}},
		{"missing job_id", []byte("bad-no-id"), []byte(`{"version":1,"kind":"snapshot","state":{}}`), []string{"job_id", "required"}},
		{"missing job_id without key", nil, []byte(`{"version":1,"kind":"snapshot","state":{}}`), []string{"job_id", "required"}},
		{"empty job_id", nil, []byte(`{"job_id":"","version":1,"kind":"snapshot","state":{}}`), []string{"job_id", "must not be empty"}},
		{"missing version", []byte("bad-no-version"), []byte(`{"job_id":"bad-no-version","kind":"snapshot","state":{}}`), []string{"version", "required"}},
		{"missing kind", []byte("bad-no-kind"), []byte(`{"job_id":"bad-no-kind","version":1,"state":{}}`), []string{"kind", "required"}},
		{"version 0", []byte("bad-v0"), []byte(snap("bad-v0", 0, `{}`)), []string{"version", "at least 1", "got 0"}},
		{"negative version", []byte("bad-vneg"), []byte(snap("bad-vneg", -3, `{}`)), []string{"version", "at least 1", "got -3"}},
		{"version above 2^63-1", []byte("bad-vbig"),
			[]byte(`{"job_id":"bad-vbig","version":9223372036854775808,"kind":"snapshot","state":{}}`),
			[]string{"version", "9223372036854775808", "out of range"}},
		{"string version", []byte("bad-vstr"), []byte(`{"job_id":"bad-vstr","version":"3","kind":"snapshot","state":{}}`),
			[]string{"version", "must be a JSON integer", "string"}},
		{"fractional version", []byte("bad-vfrac"), []byte(`{"job_id":"bad-vfrac","version":1.5,"kind":"snapshot","state":{}}`),
			[]string{"version", "must be an integer"}},
		{"key and job_id differ", []byte("job-a"), []byte(snap("job-b", 1, `{}`)), []string{"key", `"job-a"`, `"job-b"`}},
		{"unknown kind", []byte("bad-kind"), []byte(`{"job_id":"bad-kind","version":1,"kind":"patch","state":{}}`),
			[]string{"kind", `unknown kind "patch"`}},
		{"snapshot without state", []byte("bad-nostate"), []byte(`{"job_id":"bad-nostate","version":1,"kind":"snapshot"}`),
			[]string{"state", "required for a snapshot"}},
		{"snapshot with null state", []byte("bad-nullstate"), []byte(`{"job_id":"bad-nullstate","version":1,"kind":"snapshot","state":null}`),
			[]string{"state", "required for a snapshot"}},
		{"snapshot state not an object", []byte("bad-statearr"), []byte(`{"job_id":"bad-statearr","version":1,"kind":"snapshot","state":[1]}`),
			[]string{"state", "must be a JSON object"}},
		{"delta without ops", []byte("bad-noops"), []byte(`{"job_id":"bad-noops","version":1,"kind":"delta"}`), []string{"ops"}},
		{"NUL escape", []byte("bad-nul"), []byte(snap("bad-nul", 1, `{"s":"a\u0000b"}`)), []string{"state", `\u0000`}},
		{"value over 1 MiB", []byte("huge"), []byte(huge), []string{"value", strconv.Itoa(len(huge)) + " bytes", "1 MiB"}},
		{"transaction control record bytes", []byte{0, 0, 0, 0}, []byte{0, 0, 0, 0, 0, 0}, []string{"value", "not a JSON object"}},
		{"tombstone (null value)", []byte("bad-tombstone"), nil, []string{"value", "empty", "tombstone"}},
		{"empty value", []byte("bad-empty"), []byte{}, []string{"value", "empty"}},
		{"JSON null", []byte("bad-null"), []byte(`null`), []string{"value", "null value"}},
	}

	// The 1 MiB record must reach the projector: the topic accepts
	// records up to 4 MiB. Everything goes to partition 1, so the stored
	// partition is not a zero value by chance.
	const part = 1
	r := newRigTopicConfig(t, 2, kafka.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: strconv.Itoa(4 << 20)})
	var recs []rec
	for i, c := range cases {
		good := fmt.Sprintf("good-after-%02d", i)
		recs = append(recs,
			rec{part, string(c.key), c.value},
			rec{part, good, snap(good, 1, stateOf(good, 1))})
	}
	offsets := r.produce(recs...)

	run := r.start(r.config(func(c *Config) { c.BatchSize = 7 }))
	r.caughtUp(30*time.Second, run)

	q, total, err := r.store.Quarantine(context.Background(), 100)
	require.NoError(t, err)
	require.Equal(t, len(cases), total)
	byOffset := map[int64]int{}
	for i, row := range q {
		_, dup := byOffset[row.Offset]
		require.False(t, dup, "offset %d quarantined twice", row.Offset)
		byOffset[row.Offset] = i
	}
	rows := r.rows()
	require.Len(t, rows, len(cases), "only the good records have rows")

	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			off := offsets[2*i]
			j, ok := byOffset[off]
			require.True(t, ok, "offset %d is not in the quarantine", off)
			row := q[j]
			require.Equal(t, r.topic, row.Topic)
			require.Equal(t, part, row.Partition)
			require.Equal(t, off, row.Offset)
			require.True(t, bytes.Equal(c.key, row.Key), "key stored raw: got %q", row.Key)
			require.True(t, bytes.Equal(c.value, row.Value), "value stored raw: got %d bytes %.80q", len(row.Value), row.Value)
			for _, w := range c.want {
				require.Contains(t, row.Error, w)
			}

			goodOff := offsets[2*i+1]
			require.Equal(t, off+1, goodOff)
			require.NotContains(t, byOffset, goodOff)
			good := fmt.Sprintf("good-after-%02d", i)
			require.Contains(t, rows, good, "the good snapshot after the bad record is applied")
			require.Equal(t, int64(1), rows[good].Version)
			require.JSONEq(t, stateOf(good, 1), string(rows[good].State))
		})
	}

	cs := run.p.Status().Counters
	require.Equal(t, int64(len(recs)), cs.Consumed, "%+v", cs)
	require.Equal(t, int64(len(cases)), cs.Quarantined, "%+v", cs)
	require.Equal(t, int64(len(cases)), cs.Applied, "%+v", cs)
	r.requirePositionsAtEnd()
}

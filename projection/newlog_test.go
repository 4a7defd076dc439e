package projection

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A topic deleted and recreated while the projector was stopped has a new
// log whose offsets start again at 0. The stored positions were read from
// the old log: the projector used to wait until the new log grew past
// them and then go on from there, and every record of the new log below
// them was never read, without a word. Now the claim compares the log with
// the last record read, reads the new log from its start, logs it and
// counts it; and the new log's bad records are quarantined beside the old
// log's at the same offsets.
func TestARecreatedTopicIsReadFromItsStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		newLog int // records per partition in the new log (the old one had 30)
	}{
		{"shorter than the stored position", 10},
		{"grown past the stored position", 45},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, 2)
			ctx := context.Background()
			produceLog := func(prefix string, perPartition int) {
				var recs []rec
				for p := range 2 {
					for i := range perPartition {
						job := fmt.Sprintf("%s-%d-%d", prefix, p, i)
						v := snap(job, 1, `{}`)
						if p == 0 && i == 5 {
							v = `{"job_id":"` + prefix + `-bad","version":"one"}`
						}
						recs = append(recs, rec{partition: p, key: job, value: v})
					}
				}
				r.produce(recs...)
			}
			produceLog("old", 30)
			first := r.start(r.config())
			r.caughtUp(30*time.Second, first)
			first.halt(t)
			require.Equal(t, int64(30), r.positions()[0].NextOffset)

			require.NoError(t, r.kafka.DeleteTopic(ctx, r.topic))
			require.NoError(t, r.kafka.CreateTopic(ctx, r.topic, 2))
			produceLog("new", tc.newLog)

			second := r.start(r.config())
			r.caughtUp(30*time.Second, second)
			rows := r.rows()
			for p := range 2 {
				for i := range tc.newLog {
					if p == 0 && i == 5 {
						continue
					}
					job := fmt.Sprintf("new-%d-%d", p, i)
					require.Contains(t, rows, job, "a record of the new log was skipped")
				}
			}
			require.Equal(t, int64(2), second.p.Status().Counters.NewLogs, "each partition's new log is counted")
			pos := r.positions()
			require.Equal(t, int64(tc.newLog), pos[0].NextOffset)
			require.Equal(t, int64(tc.newLog), pos[1].NextOffset)

			q, n, err := r.store.Quarantine(ctx, 10)
			require.NoError(t, err)
			require.Equal(t, 2, n, "the new log's bad record at the old one's offset is quarantined too")
			topics := map[string]int64{}
			for _, row := range q {
				topics[row.Topic] = row.Offset
			}
			require.Equal(t, map[string]int64{r.topic: 5, r.topic + "~log1": 5}, topics)
			var msgs []string
			for _, row := range q {
				msgs = append(msgs, row.Error)
			}
			require.False(t, strings.Contains(strings.Join(msgs, " "), "not a JSON object"))
		})
	}
}

// A log that ends before the stored position but still holds the record
// last read was truncated (an unclean leader election), not replaced:
// reading goes on from its end, and it is not counted as a new log. A
// position past the end with no record to compare (stored by an earlier
// version) is taken for a new log.
func TestATruncatedLogGoesOnFromItsEnd(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2)
	ctx := context.Background()
	var recs []rec
	for p := range 2 {
		for i := range 20 {
			job := fmt.Sprintf("j-%d-%d", p, i)
			recs = append(recs, rec{partition: p, key: job, value: snap(job, 1, `{}`)})
		}
	}
	r.produce(recs...)
	first := r.start(r.config())
	r.caughtUp(30*time.Second, first)
	first.halt(t)
	// Partition 0 as if its log lost its last 5 records after they were
	// read; partition 1 as if stored by a version that kept no mark.
	_, err := r.store.Pool().Exec(ctx, `UPDATE `+r.store.Schema()+`.projector_partitions SET next_offset = 25 WHERE partition = 0`)
	require.NoError(t, err)
	_, err = r.store.Pool().Exec(ctx, `UPDATE `+r.store.Schema()+`.projector_partitions SET next_offset = 25, last_offset = NULL, last_hash = NULL WHERE partition = 1`)
	require.NoError(t, err)

	second := r.start(r.config())
	r.caughtUp(30*time.Second, second)
	require.Equal(t, int64(1), second.p.Status().Counters.NewLogs, "only the partition with nothing to compare is taken for a new log")
	require.Equal(t, int64(0), second.p.Status().Counters.Consumed-20, "partition 1 was read again from its start, partition 0 not at all")
}

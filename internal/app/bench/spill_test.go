package bench

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/event"
	"github.com/projector/projector/internal/app/jobgen"
)

// TestSpillReadsBackEveryEvent: the baselines read back, in order, every
// event spilled as the stream was produced: its partition, job, version, and the
// state of a snapshot or the ops of a delta; and a second reader reads
// them all again.
func TestSpillReadsBackEveryEvent(t *testing.T) {
	t.Parallel()
	s := jobgen.Generate(jobgen.Config{Seed: 5, Jobs: 300, StateBytes: 5000, DuplicateRate: 0.2, LateRate: 0.2})
	sp, err := newSpill()
	require.NoError(t, err)
	defer sp.close()
	var (
		want  [][]any
		parts []int
	)
	for _, r := range s.Records {
		ev, err := event.Decode(r.Key, r.Value)
		require.NoError(t, err)
		require.NoError(t, sp.add(r.Partition, ev))
		body := string(ev.RawOps)
		if ev.Kind == event.Snapshot {
			body = string(ev.State)
		}
		want = append(want, []any{ev.JobID, ev.Version, body})
		parts = append(parts, r.Partition)
	}
	require.NoError(t, sp.done())
	require.Equal(t, len(s.Records), sp.n)
	for range 2 {
		rows := sp.rows()
		var (
			got      [][]any
			gotParts []int
		)
		for rows.Next() {
			v, err := rows.Values()
			require.NoError(t, err)
			got = append(got, v)
			gotParts = append(gotParts, rows.partition)
		}
		require.NoError(t, rows.Err())
		require.Equal(t, want, got)
		require.Equal(t, parts, gotParts)
	}
}

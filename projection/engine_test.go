package projection

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSeedStoryLateSnapshotIsStale(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	r.produce(
		rec{0, "job-42", snap("job-42", 1, `{"status":"running"}`)},
		rec{0, "job-42", snap("job-42", 2, `{"status":"completed"}`)},
	)
	run := r.start(r.config())
	r.caughtUp(20*time.Second, run)
	r.produce(rec{0, "job-42", snap("job-42", 1, `{"status":"running"}`)})
	r.caughtUp(20*time.Second, run)

	rows := r.rows()
	require.Equal(t, int64(2), rows["job-42"].Version)
	require.JSONEq(t, `{"status":"completed"}`, string(rows["job-42"].State))
	c := run.p.Status().Counters
	require.Equal(t, int64(2), c.Applied, "%+v", c)
	require.Equal(t, int64(1), c.Stale, "the late v1 is counted stale: %+v", c)
}

// A thousand jobs, each with 3-6 snapshot versions produced in scrambled
// order over four partitions: every row ends at its job's highest version
// with that version's state, and every record is counted once, applied or
// stale.
func TestScrambledSnapshotsEndAtEachJobsHighestVersion(t *testing.T) {
	t.Parallel()
	const parts = 4
	r := newRig(t, parts)
	rng := rand.New(rand.NewPCG(20260918, 1))
	s := newStream(parts)
	for _, job := range jobIDs("job", 1000) {
		s.snapshots(job, versions(1, 3+rng.Int64N(4))...)
	}
	s.scramble(rng)
	produced := int64(s.flush(r))

	run := r.start(r.config(func(c *Config) { c.BatchSize = 200 }))
	r.caughtUp(30*time.Second, run)

	r.requireModel(s)
	r.requirePositionsAtEnd()
	c := run.p.Status().Counters
	require.Equal(t, produced, c.Consumed, "%+v", c)
	require.Equal(t, produced, c.Applied+c.Stale, "every record applied or stale: %+v", c)
	require.GreaterOrEqual(t, c.Applied, int64(len(s.want)), "%+v", c)
	require.Positive(t, c.Stale, "scrambled versions leave stale records: %+v", c)
	require.Zero(t, c.Conflicts+c.Quarantined+c.Duplicates+c.Held+c.Fenced, "%+v", c)
}

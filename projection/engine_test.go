package projection

import (
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
	r.caughtUp(20 * time.Second)
	r.produce(rec{0, "job-42", snap("job-42", 1, `{"status":"running"}`)})
	r.caughtUp(20 * time.Second)

	rows := r.rows()
	require.Equal(t, int64(2), rows["job-42"].Version)
	require.JSONEq(t, `{"status":"completed"}`, string(rows["job-42"].State))
	c := run.p.Status().Counters
	require.Equal(t, int64(2), c.Applied, "%+v", c)
	require.Equal(t, int64(1), c.Stale, "the late v1 is counted stale: %+v", c)
}

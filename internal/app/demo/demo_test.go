package demo_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/app/demo"
	"github.com/projector/projector/internal/app/jobgen"
	"github.com/projector/projector/internal/testkit/pgtest"
)

func TestDemoVerifiesEveryJobAndShowsEveryFault(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo runs the whole engine; skipped under -short")
	}
	var out bytes.Buffer
	sum, err := demo.Run(context.Background(), demo.Config{
		Seed: 3, Jobs: 300, DatabaseURL: pgtest.URL(), Timeout: 2 * time.Minute, Out: &out,
	})
	require.NoError(t, err, out.String())
	t.Log(out.String())
	require.True(t, sum.OK(), "mismatches: %v", sum.Mismatches)
	require.Equal(t, 300, sum.Verified)
	require.Contains(t, out.String(), "verified: 300/300 jobs match")
	require.Contains(t, out.String(), "read your own write: ", "a client waits for its own write")

	f := sum.Faults
	for name, n := range map[string]int{"late": f.Late, "duplicate": f.Duplicate, "missing": f.Missing, "misrouted": f.Misrouted, "bad": f.Bad,
		"deleted": f.Deleted, "recreated": f.Recreated} {
		require.Positive(t, n, "the stream has %s events", name)
	}
	c := sum.Counters
	require.Equal(t, int64(sum.Records), c.Consumed, "every record consumed exactly once")
	require.Equal(t, int64(f.Bad), c.Quarantined, "every bad record quarantined")
	require.Positive(t, c.Duplicates, "duplicate deliveries dropped")
	require.Positive(t, c.Deleted, "deletes applied")
	require.Positive(t, c.Held, "deltas held behind gaps")
	require.Positive(t, c.ClosedByWait+c.ClosedByReread+c.ClosedBySnapshot, "gaps closed")
	require.Positive(t, c.ClosedBySnapshot, "missing deltas healed by the authority")
	require.Zero(t, c.HeldJobs, "no gap left held")
}

func TestSeedMakesTheSameStream(t *testing.T) {
	t.Parallel()
	cfg := jobgen.Config{Seed: 42, Jobs: 200, LateRate: 0.1, DuplicateRate: 0.1, MissingRate: 0.05, MisrouteRate: 0.05, BadRate: 0.05}
	a, b := jobgen.Generate(cfg), jobgen.Generate(cfg)
	require.Equal(t, a.Records, b.Records)
	require.Equal(t, a.Truth, b.Truth)
	require.Equal(t, a.Faults, b.Faults)
	cfg.Seed = 43
	require.NotEqual(t, a.Records, jobgen.Generate(cfg).Records, "another seed, another stream")
}

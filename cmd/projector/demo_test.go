package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
)

// demoSchemas counts the demo's schemas, to show the demo drops its own.
func demoSchemas(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	rows, err := pgtest.Pool(t).Query(ctx, `SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'projector_demo_%'`)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// TestDemo runs the whole story on one machine against the test
// PostgreSQL: it verifies every job, exits 0, and drops its schema.
func TestDemo(t *testing.T) {
	t.Parallel()
	r := runBin(t, 2*time.Minute, dbEnv(), "demo", "--jobs", "100", "--seed", "5")
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "verified: 100/100 jobs match", "%s", r)
	require.Contains(t, r.stdout, "seed 5", "%s", r)
	for _, counter := range []string{"records consumed", "applied", "quarantined", "gaps closed by snapshot"} {
		require.Contains(t, r.stdout, counter, "%s", r)
	}
	m := regexp.MustCompile(`schema (projector_demo_\w+)`).FindStringSubmatch(r.stdout)
	require.NotNil(t, m, "the demo names its schema\n%s", r)
	require.NotContains(t, demoSchemas(t), m[1], "the demo drops its schema without --keep")
}

// TestDemoSameSeedSameStream: the seed fixes the stream, so its summary's
// counts repeat.
func TestDemoSameSeedSameStream(t *testing.T) {
	t.Parallel()
	first := func(r result) string {
		require.Equal(t, 0, r.code, "%s", r)
		return lines(r.stdout)[0] // "projector demo: N jobs, M events (... faults), P partitions, seed S"
	}
	a := first(runBin(t, 2*time.Minute, dbEnv(), "demo", "--jobs", "50", "--seed", "11", "--partitions", "3"))
	b := first(runBin(t, 2*time.Minute, dbEnv("PROJECTOR_JOBS=50", "PROJECTOR_SEED=11", "PROJECTOR_PARTITIONS=3"), "demo"))
	require.Equal(t, a, b, "the same seed (by flag or by variable) gives the same stream")
	require.True(t, strings.HasPrefix(a, "projector demo: 50 jobs"), a)
}

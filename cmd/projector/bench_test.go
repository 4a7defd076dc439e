package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBenchTable runs a small benchmark of snapshots: every writer is
// reported in a table with its ratio to raw COPY, the projector's line says
// its read model was checked, and memory is reported apart from the broker.
func TestBenchTable(t *testing.T) {
	t.Parallel()
	r := runBin(t, 3*time.Minute, dbEnv(), "bench", "--events", "1000", "--jobs", "200", "--naive-sample", "20")
	require.Equal(t, 0, r.code, "%s", r)
	require.Regexp(t, `(?m)^WRITER\s+EVENTS\s+SECONDS\s+EVENTS/S\s+x RAW COPY\s+NOTE$`, r.stdout, "%s", r)
	for _, row := range []string{
		`raw COPY \(no versions, no key: the ceiling\)\s+\d+\s+[\d.]+\s+\d+\s+1\.00`,
		`keyed upserts, a row per job per batch \(no Kafka, no version rules: the keyed ceiling\)\s+\d+\s+[\d.]+\s+\d+\s+[\d.]+`,
		`naive: group Reader, an upsert and a commit per event\s+20\s`,
		`pgx.Batch of single upserts, 1000 per tx\s+\d+\s`,
		`projector \(Kafka to PostgreSQL, end to end\)\s+\d+\s+[\d.]+\s+\d+\s+[\d.]+\s+.*checked exact`,
	} {
		require.Regexp(t, `(?m)^`+row, r.stdout, "%s", r)
	}
	require.Regexp(t, `(?m)^projector: [\d.]+x raw COPY, [\d.]+x the keyed ceiling, [\d.]+x the naive consumer; peak heap [\d.]+ MiB \(live [\d.]+ MiB\), peak RSS [\d.]+ MiB \(projector: child process.*; broker: child process`, r.stdout, "%s", r)
}

// TestBenchJSON runs every part of the benchmark once, small, and checks
// the JSON object the docs name: the top-level figures, the writers, and
// with --preload, --rebuild and --live their own.
func TestBenchJSON(t *testing.T) {
	t.Parallel()
	r := runBin(t, 4*time.Minute, dbEnv(), "bench", "--json", "--mix", "deltas", "--events", "3000", "--jobs", "300",
		"--partitions", "3", "--state-bytes", "1000", "--naive-sample", "30", "--preload", "2000", "--rebuild", "--batches-in-flight", "2",
		"--live", "--rate", "400", "--duration", "2s")
	require.Equal(t, 0, r.code, "%s", r)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got), "stdout is one JSON object: %s", r)
	require.Equal(t, "deltas", got["mix"])
	require.Equal(t, "clustered", got["shape"], "the default shape")
	require.Equal(t, 2.0, got["batches_in_flight"], "the report names the bound asked for")
	require.Contains(t, got["projector"], "child process", "the projector's memory is measured in a process of its own")
	for _, k := range []string{"events", "projector_events_per_second", "projector_ratio_to_copy", "projector_ratio_to_naive",
		"projector_ratio_to_keyed", "peak_heap_bytes", "peak_live_heap_bytes", "peak_rss_bytes", "distinct_jobs_per_batch", "growth_ratio", "empty_table_events_per_second", "rebuild_seconds",
		"rebuild_ratio_to_copy", "rebuild_peak_rss_bytes", "rebuild_cpu_seconds", "latency_p50_ms", "latency_p99_ms", "latency_max_ms"} {
		v, ok := got[k].(float64)
		require.True(t, ok, "%s is a number: %s", k, r.stdout)
		require.Greater(t, v, 0.0, "%s", k)
	}
	require.LessOrEqual(t, got["latency_p50_ms"], got["latency_p99_ms"])
	require.LessOrEqual(t, got["latency_p99_ms"], got["latency_max_ms"])
	require.Greater(t, got["mean_state_bytes"], 900.0, "--state-bytes pads the states")
	writers, ok := got["writers"].([]any)
	require.True(t, ok, "writers is an array")
	var names []string
	for _, w := range writers {
		m := w.(map[string]any)
		for _, k := range []string{"events_per_second", "ratio_to_copy", "seconds", "events"} {
			require.IsType(t, 0.0, m[k], "writer %v: %s", m["name"], k)
		}
		names = append(names, m["name"].(string))
	}
	require.Equal(t, []string{
		"raw COPY (no versions, no key: the ceiling)",
		"keyed upserts, a row per job per batch (no Kafka, no version rules: the keyed ceiling)",
		"naive: group Reader, an upsert and a commit per event",
		"projector (Kafka to PostgreSQL, end to end)",
		"projector, 2000 rows already in the table",
		"projector rebuild (its own process, start to swap)",
	}, names)
}

// TestBenchShortStreamSpreadsOverFewerJobs: without --jobs, a stream
// shorter than the default's 200,000 events spreads over a quarter as
// many jobs instead of being refused; --jobs given too large still is.
// The run is of the spread shape, which the report names, and profiles of
// the projector's process are written where asked.
func TestBenchShortStreamSpreadsOverFewerJobs(t *testing.T) {
	t.Parallel()
	alloc := filepath.Join(t.TempDir(), "alloc.pprof")
	r := runBin(t, 3*time.Minute, dbEnv(), "bench", "--json", "--mix", "mixed", "--shape", "spread", "--events", "2000",
		"--naive-sample", "20", "--batch-size", "100", "--alloc-profile", alloc)
	require.Equal(t, 0, r.code, "%s", r)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got), "stdout is one JSON object: %s", r)
	require.Equal(t, 500.0, got["jobs"], "a quarter of --events 2000")
	require.Equal(t, "spread", got["shape"])
	require.Equal(t, 100.0, got["batch_size"])
	require.Greater(t, got["distinct_jobs_per_batch"], 50.0, "a batch of 100 of the spread shape meets many jobs: %s", r.stdout)
	info, err := os.Stat(alloc)
	require.NoError(t, err)
	require.Positive(t, info.Size(), "the projector's process wrote its profile")

	r = runBin(t, time.Minute, dbEnv(), "bench", "--events", "2000", "--shape", "round")
	require.Equal(t, 2, r.code, "%s", r)
	require.Contains(t, r.stderr, `--shape "round": must be one of clustered, spread`)

	r = runBin(t, time.Minute, dbEnv(), "bench", "--events", "2000", "--jobs", "1000")
	require.Equal(t, 2, r.code, "%s", r)
	require.Contains(t, r.stderr, "--jobs 1000: must be from 1 to a third of --events")
}

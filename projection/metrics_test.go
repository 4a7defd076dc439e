package projection

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// scrape reads /metrics from the projector's handler into series -> value,
// series written as in the exposition format (name{labels}).
func scrape(t *testing.T, p *Projector) map[string]float64 {
	t.Helper()
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		require.Positive(t, i, "metric line %q", line)
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, "metric line %q", line)
		out[line[:i]] = v
	}
	require.NoError(t, sc.Err())
	return out
}

func requireMetrics(t *testing.T, got map[string]float64, want map[string]float64) {
	t.Helper()
	for series, v := range want {
		have, ok := got[series]
		require.True(t, ok, "/metrics has no %s", series)
		require.Equal(t, v, have, "%s", series)
	}
}

// TestMetricsRecordOutcomes: after a stream with every record outcome and
// a gap closed by waiting, /metrics counts each exactly, and carries the
// partition gauges, the histograms, the build info and the Go and process
// collectors.
func TestMetricsRecordOutcomes(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	run := r.start(r.config(func(c *Config) { c.GapWait, c.GapWaitOff = 30*time.Second, false; c.NoReread = true }))

	r.produce(
		rec{0, "a", snap("a", 1, `{"n":1}`)},
		rec{0, "a", snap("a", 2, `{"n":2}`)},
		rec{0, "b", snap("b", 1, `{"n":0}`)},
		rec{0, "b", dlt("b", 2, `[{"op":"increment","path":"/n","by":1}]`)},
		rec{0, "c", snap("c", 1, `{"owner":"first"}`)},
		rec{0, "d", snap("d", 1, `{"n":0}`)},
		rec{0, "d", dlt("d", 3, `[{"op":"increment","path":"/n","by":3}]`)},
		rec{0, "x", "not json"},
	)
	r.caughtUp(20*time.Second, run)
	r.eventually(10*time.Second, "d is held", func() (bool, string) {
		c := run.p.Status().Counters
		return c.HeldJobs == 1, fmt.Sprintf("%+v", c)
	})
	held := scrape(t, run.p)
	requireMetrics(t, held, map[string]float64{
		"projector_held_jobs":         1,
		"projector_gaps_opened_total": 1,
	})
	require.Positive(t, held["projector_oldest_held_seconds"], "a job is held")

	r.produce(
		rec{0, "a", snap("a", 1, `{"n":1}`)},                                // stale
		rec{0, "b", dlt("b", 2, `[{"op":"increment","path":"/n","by":1}]`)}, // duplicate
		rec{0, "c", snap("c", 1, `{"owner":"second"}`)},                     // conflict
		rec{0, "d", dlt("d", 2, `[{"op":"increment","path":"/n","by":2}]`)}, // closes d's gap
	)
	r.caughtUp(20*time.Second, run)
	r.produce(rec{0, "a", del("a", 3)}) // deleted
	r.caughtUp(20*time.Second, run)
	r.eventually(10*time.Second, "d's gap is closed", func() (bool, string) {
		c := run.p.Status().Counters
		return c.HeldJobs == 0 && c.ClosedByWait == 1, fmt.Sprintf("%+v", c)
	})

	m := scrape(t, run.p)
	requireMetrics(t, m, map[string]float64{
		// a1 a2 b1 b2 c1 d1, then d2 and the released d3
		`projector_records_total{outcome="applied"}`:      8,
		`projector_records_total{outcome="stale"}`:        1,
		`projector_records_total{outcome="duplicate"}`:    1,
		`projector_records_total{outcome="conflict"}`:     1,
		`projector_records_total{outcome="held"}`:         1,
		`projector_records_total{outcome="quarantined"}`:  1,
		`projector_records_total{outcome="deleted"}`:      1,
		"projector_records_consumed_total":                13,
		"projector_gaps_opened_total":                     1,
		`projector_gaps_closed_total{by="wait"}`:          1,
		`projector_gaps_closed_total{by="reread"}`:        0,
		`projector_gaps_closed_total{by="snapshot"}`:      0,
		"projector_held_jobs":                             0,
		"projector_oldest_held_seconds":                   0,
		`projector_partition_lag{partition="0"}`:          0,
		`projector_partition_position{partition="0"}`:     13,
		`projector_authority_requests_total{result="ok"}`: 0,
		"projector_database_errors_total":                 0,
		"projector_fenced_total":                          0,
		"projector_ready":                                 1,
		fmt.Sprintf(`projector_info{group="%s-group",schema="%s",table="jobs",topic="%s"}`, r.topic, r.store.Schema(), r.topic): 1,
	})
	require.Positive(t, m[`projector_partition_epoch{partition="0"}`])
	require.Positive(t, m["projector_batch_duration_seconds_count"])
	require.Equal(t, m["projector_batches_total"], m["projector_batch_duration_seconds_count"])
	require.Equal(t, 13.0, m["projector_batch_records_sum"], "every record is in one committed batch")
	require.Positive(t, m["go_goroutines"])
	require.Positive(t, m["process_resident_memory_bytes"])
	var build string
	for series, v := range m {
		if strings.HasPrefix(series, "projector_build_info{") {
			build = series
			require.Equal(t, 1.0, v)
		}
	}
	require.Contains(t, build, `goversion="go`)
	require.Contains(t, build, `version="`)
	require.Contains(t, build, `revision="`)

	// The counters /status serves are the same numbers.
	c := run.p.Status().Counters
	require.Equal(t, float64(c.Applied), m[`projector_records_total{outcome="applied"}`])
	require.Equal(t, float64(c.Consumed), m["projector_records_consumed_total"])
}

// TestMetricsGapsClosedByRereadAndSnapshot: one gap closed by the
// authority, another by re-reading the store after another writer moved the
// row; the authority's answers are counted by result.
func TestMetricsGapsClosedByRereadAndSnapshot(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2)
	auth := &authority{snaps: map[string][]byte{"s": []byte(snap("s", 3, `{"n":30}`))}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /jobs/{id}", auth.serve)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	run := r.start(r.config(func(c *Config) {
		c.SnapshotURL = srv.URL
		c.SnapshotMaxElapsed = scenarioSnapshotMaxElapsed
		c.SnapshotTimeout = scenarioSnapshotTimeout
	}))
	r.produce(
		rec{0, "s", snap("s", 1, `{"n":1}`)},
		rec{0, "s", dlt("s", 3, `[{"op":"increment","path":"/n","by":3}]`)},
		rec{0, "r", snap("r", 1, `{"n":1}`)},
		rec{0, "r", dlt("r", 3, `[{"op":"increment","path":"/n","by":3}]`)},
	)
	r.eventually(20*time.Second, "s closed by the authority, r asked for in vain", func() (bool, string) {
		c := run.p.Status().Counters
		return c.ClosedBySnapshot == 1 && c.AuthorityNotFound >= 1, fmt.Sprintf("%+v", c)
	})
	// Another writer (partition 1's worker) moves r's row to v2.
	r.produce(rec{1, "r", snap("r", 2, `{"n":3}`)})
	r.eventually(20*time.Second, "r closed by re-read", func() (bool, string) {
		c := run.p.Status().Counters
		return c.ClosedByReread == 1 && c.HeldJobs == 0, fmt.Sprintf("%+v", c)
	})
	r.caughtUp(20*time.Second, run)

	m := scrape(t, run.p)
	c := run.p.Status().Counters
	requireMetrics(t, m, map[string]float64{
		"projector_gaps_opened_total":                            2,
		`projector_gaps_closed_total{by="wait"}`:                 0,
		`projector_gaps_closed_total{by="reread"}`:               1,
		`projector_gaps_closed_total{by="snapshot"}`:             1,
		`projector_authority_requests_total{result="ok"}`:        1,
		`projector_authority_requests_total{result="not_found"}`: float64(c.AuthorityNotFound),
		`projector_authority_requests_total{result="error"}`:     0,
		`projector_records_total{outcome="held"}`:                2,
		"projector_held_jobs":                                    0,
	})
	require.Positive(t, m[`projector_authority_requests_total{result="not_found"}`])
	rows := r.rows()
	require.Equal(t, int64(3), rows["s"].Version)
	require.Equal(t, int64(3), rows["r"].Version)
	require.JSONEq(t, `{"n":6}`, string(rows["r"].State))
}

// TestMetricsRegistryPerProjector: two projectors in one process each serve
// their own numbers.
func TestMetricsRegistryPerProjector(t *testing.T) {
	t.Parallel()
	r1, r2 := newRig(t, 1), newRig(t, 1)
	a, b := r1.start(r1.config()), r2.start(r2.config())
	r1.produce(rec{0, "a", snap("a", 1, `{}`)}, rec{0, "b", snap("b", 1, `{}`)})
	r2.produce(rec{0, "a", snap("a", 1, `{}`)})
	r1.caughtUp(20*time.Second, a)
	r2.caughtUp(20*time.Second, b)
	require.Equal(t, 2.0, scrape(t, a.p)[`projector_records_total{outcome="applied"}`])
	require.Equal(t, 1.0, scrape(t, b.p)[`projector_records_total{outcome="applied"}`])
}

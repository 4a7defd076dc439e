package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/store"
)

// rowOf reads one job's row, or ok=false while it is missing.
func (s *story) rowOf(job string) (store.Job, bool) {
	s.t.Helper()
	ctx, cancel := s.ctx()
	defer cancel()
	rows, err := s.st.LoadJobs(ctx, []string{job})
	if err != nil {
		return store.Job{}, false // the table may not exist yet
	}
	j, ok := rows[job]
	return j, ok
}

// waitRow waits until job's row is at version with state.
func (s *story) waitRow(within time.Duration, job string, version int64, state string, procs ...*proc) {
	s.t.Helper()
	eventually(s.t, within, fmt.Sprintf("%s at v%d", job, version), func() (bool, string) {
		for _, p := range procs {
			p.requireAlive()
		}
		j, ok := s.rowOf(job)
		if !ok || j.Version != version {
			return false, fmt.Sprintf("row %+v (present %v)", j, ok)
		}
		var got, want any
		_ = json.Unmarshal(j.State, &got)
		_ = json.Unmarshal([]byte(state), &want)
		wb, _ := json.Marshal(want)
		gb, _ := json.Marshal(got)
		return string(wb) == string(gb), fmt.Sprintf("v%d %s", j.Version, j.State)
	})
}

// TestRunGapPolicy drives the gap flags end to end: with --gap-wait 0 and
// --reread=false a held delta goes straight to the trusted snapshot
// authority (--snapshot-url); a job the authority does not know stays
// held, visible in /status and `projector status`, until its missing
// delta is produced.
func TestRunGapPolicy(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	authority := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if r.URL.Path != "/jobs/gap-snap" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(snapshotValue("gap-snap", 3, map[string]any{"status": "running", "processed": 30}))
	}))
	t.Cleanup(authority.Close)

	s := newStory(t, 2)
	s.produce(
		rec(0, "gap-snap", snapshotValue("gap-snap", 1, map[string]any{"status": "running", "processed": 0})),
		// v2 never comes: the authority's v3 closes the gap, v3 held here is covered, v4 applies on top.
		rec(0, "gap-snap", deltaValue("gap-snap", 3, map[string]any{"op": "increment", "path": "/processed", "by": 3})),
		rec(0, "gap-snap", deltaValue("gap-snap", 4, map[string]any{"op": "increment", "path": "/processed", "by": 4})),
		rec(1, "stuck", snapshotValue("stuck", 1, map[string]any{"processed": 0})),
		rec(1, "stuck", deltaValue("stuck", 3, map[string]any{"op": "increment", "path": "/processed", "by": 3})),
	)

	p := startBin(t, "run", dbEnv(), s.runArgs("g-gap", "inst-gap",
		"--gap-wait", "0", "--reread=false", "--snapshot-url", authority.URL, "--gap-retry-max", "1s")...)
	addr := p.httpAddr(15 * time.Second)

	s.waitRow(joinWithin, "gap-snap", 4, `{"status":"running","processed":34}`, p)
	s.caughtUp(joinWithin, p)
	s.waitRow(time.Second, "stuck", 1, `{"processed":0}`, p)

	// The live view: one job held, on partition 1, missing v2, after a
	// snapshot attempt the authority answered 404.
	eventually(t, joinWithin, "/status shows stuck held after a snapshot attempt", func() (bool, string) {
		p.requireAlive()
		code, body, err := get(addr, "/status")
		if err != nil || code != http.StatusOK {
			return false, fmt.Sprintf("%d %v", code, err)
		}
		var st struct {
			Partitions []struct {
				Partition int `json:"partition"`
				Held      []struct {
					JobID     string  `json:"job_id"`
					Version   int64   `json:"version"`
					Missing   []int64 `json:"missing"`
					LastStep  string  `json:"last_step"`
					LastError string  `json:"last_error"`
				} `json:"held"`
			} `json:"partitions"`
			Counters struct {
				HeldJobs         int64 `json:"held_jobs"`
				ClosedBySnapshot int64 `json:"gaps_closed_by_snapshot"`
			} `json:"counters"`
		}
		if err := json.Unmarshal(body, &st); err != nil {
			return false, err.Error()
		}
		for _, ps := range st.Partitions {
			for _, h := range ps.Held {
				if ps.Partition == 1 && h.JobID == "stuck" && h.Version == 1 && fmt.Sprint(h.Missing) == "[2]" &&
					h.LastStep == "snapshot" && strings.Contains(h.LastError, "404") &&
					st.Counters.HeldJobs == 1 && st.Counters.ClosedBySnapshot == 1 {
					return true, ""
				}
			}
		}
		return false, string(body)
	})
	require.Positive(t, requests.Load())

	// The stored view, from `projector status`.
	r := runBin(t, 30*time.Second, dbEnv(), "status", "--schema", s.schema, "--json")
	st := parseStatus(t, r)
	require.Equal(t, 1, *st.HeldJobs, "%s", r)
	require.Len(t, st.Held, 1)
	var held store.HeldSummary
	require.NoError(t, json.Unmarshal(st.Held[0], &held))
	require.Equal(t, "stuck", held.JobID)
	require.Equal(t, 1, held.Partition)
	require.Equal(t, []int64{3}, held.Versions)
	text := runBin(t, 30*time.Second, dbEnv(), "status", "--schema", s.schema)
	require.Contains(t, text.stdout, "held jobs: 1")
	require.Regexp(t, `(?m)^stuck\s+\S+/1\s+1\s+\[2\]\s+\[3\]`, text.stdout)

	// The missing delta arrives: v2 applies and the held v3 follows.
	s.produce(rec(1, "stuck", deltaValue("stuck", 2, map[string]any{"op": "increment", "path": "/processed", "by": 2})))
	s.waitRow(joinWithin, "stuck", 3, `{"processed":5}`, p)
	s.caughtUp(joinWithin, p)
	p.stop(stopWithin)

	st = parseStatus(t, runBin(t, 30*time.Second, dbEnv(), "status", "--schema", s.schema, "--json"))
	require.Zero(t, *st.HeldJobs)
	require.Empty(t, st.Held)
}

// TestRunUnreachableKafka: with PostgreSQL fine but no broker answering,
// run keeps retrying: alive (/healthz 200), not ready (/readyz 503), and
// SIGINT still exits 0.
func TestRunUnreachableKafka(t *testing.T) {
	t.Parallel()
	s := newStory(t, 1)
	args := s.runArgs("g-nokafka", "inst-nokafka")
	for i, a := range args {
		if a == "--brokers" {
			args[i+1] = "127.0.0.1:9" // the discard port: nothing listens
		}
	}
	p := startBin(t, "run", dbEnv(), args...)
	addr := p.httpAddr(15 * time.Second)
	eventually(t, 15*time.Second, "the join failure is logged", func() (bool, string) {
		p.requireAlive()
		return strings.Contains(p.logs.String(), "Kafka is failing; retrying"), ""
	})
	code, _, err := get(addr, "/healthz")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	code, body, err := get(addr, "/readyz")
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, code, "%s", body)
	st, err := fetchStatus(addr)
	require.NoError(t, err)
	require.False(t, st.Ready)
	require.Empty(t, st.Partitions)
	p.stopWith(os.Interrupt, stopWithin)
}

// TestRunStartLatest: a partition never projected starts at its end with
// --start latest; records before it are skipped, records after projected.
func TestRunStartLatest(t *testing.T) {
	t.Parallel()
	s := newStory(t, 1)
	s.produce(rec(0, "old", snapshotValue("old", 1, map[string]any{})), rec(0, "old", snapshotValue("old", 2, map[string]any{})))

	p := startBin(t, "run", dbEnv(), s.runArgs("g-latest", "inst-latest", "--start", "latest")...)
	addr := p.httpAddr(15 * time.Second)
	eventually(t, joinWithin, "partition 0 claimed", func() (bool, string) {
		p.requireAlive()
		st, err := fetchStatus(addr)
		if err != nil {
			return false, err.Error()
		}
		return len(st.Partitions) == 1, fmt.Sprintf("%+v", st.Partitions)
	})
	// When the reader resolves "latest" is not observable from outside:
	// produce a new version of a probe job until one is projected.
	var v int64
	eventually(t, joinWithin, "a record produced after the start is projected", func() (bool, string) {
		p.requireAlive()
		if j, ok := s.rowOf("probe"); ok {
			return true, fmt.Sprintf("probe at v%d", j.Version)
		}
		v++
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err := s.kafka.Produce(ctx, s.topic, rec(0, "probe", snapshotValue("probe", v, map[string]any{"v": v})))
		require.NoError(t, err)
		return false, fmt.Sprintf("produced probe v%d", v)
	})
	s.waitRow(joinWithin, "probe", v, fmt.Sprintf(`{"v":%d}`, v), p)
	s.caughtUp(joinWithin, p)
	_, ok := s.rowOf("old")
	require.False(t, ok, "records before the start are skipped")
	p.stop(stopWithin)
}

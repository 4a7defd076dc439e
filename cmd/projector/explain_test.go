package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
)

// explainJSON is `projector explain --json`, as docs/guide/gaps.md lists it.
type explainJSON struct {
	JobID     string `json:"job_id"`
	Version   *int64 `json:"version"`
	Deleted   bool   `json:"deleted"`
	Tombstone *struct {
		Version int64  `json:"version"`
		EventID string `json:"event_id"`
	} `json:"tombstone"`
	State   json.RawMessage `json:"state"`
	Updated *time.Time      `json:"updated"`
	Held    []struct {
		Version    *int64    `json:"version"`
		Partition  int       `json:"partition"`
		Offset     int64     `json:"offset"`
		HeldSince  time.Time `json:"held_since"`
		WaitingFor []int64   `json:"waiting_for"`
		Attempts   int       `json:"attempts"`
		LastStep   string    `json:"last_step"`
		LastError  string    `json:"last_error"`
	} `json:"held"`
	WaitingFor []int64 `json:"waiting_for"`
	Gaps       []struct {
		Opened   time.Time `json:"opened"`
		Closed   time.Time `json:"closed"`
		Step     string    `json:"step"`
		From     int64     `json:"from_version"`
		To       int64     `json:"to_version"`
		Held     []int64   `json:"held_versions"`
		Attempts int       `json:"attempts"`
	} `json:"gaps"`
}

func (s *story) explain(job string) explainJSON {
	s.t.Helper()
	r := runBin(s.t, 30*time.Second, dbEnv(), "explain", "--json", "--schema", s.schema, "--", job)
	require.Equal(s.t, 0, r.code, "%s", r)
	var ex explainJSON
	require.NoError(s.t, json.Unmarshal([]byte(r.stdout), &ex), "%s", r)
	require.Equal(s.t, job, ex.JobID)
	require.NotNil(s.t, ex.Version, "version is always there")
	return ex
}

// TestExplain follows two gaps with `projector explain`: one the authority
// closes, one that stays held after failed snapshot attempts (shown with
// its attempts, last step and error, also after a restart) until its
// missing delta arrives; then the gap log keeps to --gap-log-max-rows.
func TestExplain(t *testing.T) {
	t.Parallel()
	authority := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/jobs/gap-snap" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(snapshotValue("gap-snap", 3, map[string]any{"status": "running", "processed": 30}))
	}))
	t.Cleanup(authority.Close)

	s := newStory(t, 2)
	const evil = "ctl\x1b[2J\x07"
	s.produce(
		rec(0, "gap-snap", snapshotValue("gap-snap", 1, map[string]any{"status": "running", "processed": 0})),
		rec(0, "gap-snap", deltaValue("gap-snap", 3, map[string]any{"op": "increment", "path": "/processed", "by": 3})),
		rec(1, "stuck", snapshotValue("stuck", 1, map[string]any{"processed": 0})),
		rec(1, "stuck", deltaValue("stuck", 3, map[string]any{"op": "increment", "path": "/processed", "by": 3})),
		rec(1, "stuck", deltaValue("stuck", 5, map[string]any{"op": "increment", "path": "/processed", "by": 5})),
		rec(0, evil, snapshotValue(evil, 1, map[string]any{"processed": 0})),
		rec(1, "gone", snapshotValue("gone", 1, map[string]any{"processed": 0})),
		rec(1, "gone", []byte(`{"job_id":"gone","version":2,"kind":"delete","event_id":"evt-gone-2"}`)),
		rec(1, "gone-held", snapshotValue("gone-held", 1, map[string]any{"processed": 0})),
		rec(1, "gone-held", []byte(`{"job_id":"gone-held","version":3,"kind":"delete"}`)),
		rec(1, "gone-held", deltaValue("gone-held", 5, map[string]any{"op": "increment", "path": "/processed", "by": 5})),
	)
	args := s.runArgs("g-explain", "inst-explain", "--gap-wait", "0", "--reread=false",
		"--snapshot-url", authority.URL, "--gap-retry-max", "1s", "--http-addr", "off")
	p := startBin(t, "run", dbEnv(), args...)
	s.waitRow(joinWithin, "gap-snap", 3, `{"status":"running","processed":30}`, p)
	s.caughtUp(joinWithin, p)

	ex := s.explain("gap-snap")
	require.Equal(t, int64(3), *ex.Version)
	require.NotNil(t, ex.Updated)
	require.JSONEq(t, `{"status":"running","processed":30}`, string(ex.State))
	require.Empty(t, ex.Held)
	require.Len(t, ex.Gaps, 1, "%+v", ex)
	g := ex.Gaps[0]
	require.Equal(t, "snapshot", g.Step)
	require.Equal(t, int64(1), g.From)
	require.Equal(t, int64(3), g.To)
	require.Equal(t, []int64{3}, g.Held)
	require.False(t, g.Closed.Before(g.Opened))

	// stuck waits for v2 (and v4 below v5); the authority answers 404.
	var stuck explainJSON
	eventually(t, joinWithin, "explain shows stuck's failed attempts", func() (bool, string) {
		p.requireAlive()
		stuck = s.explain("stuck")
		return len(stuck.Held) == 2 && stuck.Held[0].Attempts >= 2, stuck.String()
	})
	require.Equal(t, int64(1), *stuck.Version)
	require.Equal(t, []int64{2, 4}, stuck.WaitingFor)
	require.Equal(t, int64(3), *stuck.Held[0].Version)
	require.Equal(t, []int64{2}, stuck.Held[0].WaitingFor)
	require.Equal(t, int64(5), *stuck.Held[1].Version)
	require.Equal(t, []int64{2, 4}, stuck.Held[1].WaitingFor)
	for _, h := range stuck.Held {
		require.Equal(t, 1, h.Partition)
		require.Equal(t, "snapshot", h.LastStep)
		require.Contains(t, h.LastError, "404")
		require.False(t, h.HeldSince.IsZero())
	}
	text := runBin(t, 30*time.Second, dbEnv(), "explain", "stuck", "--schema", s.schema)
	require.Equal(t, 0, text.code, "%s", text)
	require.Contains(t, text.stdout, "held deltas: 2, waiting for versions 2,4")
	require.Regexp(t, `(?m)^\s+3\s+\S+/1@1\s+\S+\s+2\s+\d+\s+snapshot\s`, text.stdout)

	// The attempts are stored: a restarted projector still shows them.
	p.stop(stopWithin)
	attempts := stuck.Held[0].Attempts
	require.GreaterOrEqual(t, s.explain("stuck").Held[0].Attempts, attempts)

	// Control characters in a job id are escaped in text, kept in JSON.
	text = runBin(t, 30*time.Second, dbEnv(), "explain", "--schema", s.schema, evil)
	require.Equal(t, 0, text.code, "%s", text)
	require.NotContains(t, text.stdout, "\x1b")
	require.NotContains(t, text.stdout, "\x07")
	require.Contains(t, text.stdout, `ctl\x1b[2J\a`)
	require.Equal(t, int64(1), *s.explain(evil).Version)

	// A deleted job shows its tombstone.
	gone := s.explain("gone")
	require.True(t, gone.Deleted)
	require.Equal(t, int64(2), *gone.Version)
	require.NotNil(t, gone.Tombstone)
	require.Equal(t, "evt-gone-2", gone.Tombstone.EventID)
	require.Nil(t, gone.Updated, "no row")
	text = runBin(t, 30*time.Second, dbEnv(), "explain", "--schema", s.schema, "gone")
	require.Equal(t, 0, text.code, "%s", text)
	require.Regexp(t, `(?m)^\s+deleted\s+at version 2, `, text.stdout)
	require.Regexp(t, `(?m)^\s+written from\s+\S+/1@4, event evt-gone-2$`, text.stdout)

	// A deleted job with a delta held above it says what can release it:
	// v4 is missing, and only a snapshot above the delete can supply it.
	var goneHeld explainJSON
	eventually(t, joinWithin, "explain shows gone-held's held delta", func() (bool, string) {
		goneHeld = s.explain("gone-held")
		return len(goneHeld.Held) == 1, goneHeld.String()
	})
	require.True(t, goneHeld.Deleted)
	require.Equal(t, int64(3), *goneHeld.Version)
	require.Equal(t, []int64{4}, goneHeld.WaitingFor)
	text = runBin(t, 30*time.Second, dbEnv(), "explain", "--schema", s.schema, "gone-held")
	require.Equal(t, 0, text.code, "%s", text)
	require.Contains(t, text.stdout, "held deltas: 1, waiting for versions 4")
	require.Contains(t, text.stdout, "the job is deleted at version 3: the held deltas wait for a snapshot above version 3")

	// A job that is neither in the read model nor held: exit 1, saying so.
	r := runBin(t, 30*time.Second, dbEnv(), "explain", "--schema", s.schema, "nobody")
	require.Equal(t, 1, r.code, "%s", r)
	require.Contains(t, r.stderr, `job "nobody" is neither in `+s.schema+`.jobs nor held nor deleted`)

	// The missing deltas arrive: the gap closes by waiting.
	p = startBin(t, "run", dbEnv(), args...)
	s.produce(
		rec(1, "stuck", deltaValue("stuck", 2, map[string]any{"op": "increment", "path": "/processed", "by": 2})),
		rec(1, "stuck", deltaValue("stuck", 4, map[string]any{"op": "increment", "path": "/processed", "by": 4})),
	)
	s.waitRow(joinWithin, "stuck", 5, `{"processed":14}`, p)
	s.caughtUp(joinWithin, p)
	p.stop(stopWithin)
	require.Len(t, s.explain("gap-snap").Gaps, 1)

	// A projector with --gap-log-max-rows 1 prunes the log in the
	// background (first when it starts): stuck's newer row stays.
	p = startBin(t, "run", dbEnv(), append(args, "--gap-log-max-rows", "1")...)
	eventually(t, joinWithin, "the gap log keeps one row: stuck's", func() (bool, string) {
		p.requireAlive()
		stuck = s.explain("stuck")
		snap := s.explain("gap-snap")
		return len(stuck.Gaps) == 1 && len(snap.Gaps) == 0, stuck.String() + " / " + snap.String()
	})
	p.stop(stopWithin)
	require.Empty(t, stuck.Held)
	g = stuck.Gaps[0]
	require.Equal(t, "wait", g.Step)
	require.Equal(t, int64(1), g.From)
	require.Equal(t, int64(5), g.To)
	require.Equal(t, []int64{3, 5}, g.Held)
	require.GreaterOrEqual(t, g.Attempts, attempts, "the attempts the gap took")
}

func (e explainJSON) String() string {
	b, _ := json.Marshal(e)
	return string(b)
}

// TestExplainUsage: bad arguments exit 2; a projection that does not exist
// exits 1 and is not created.
func TestExplainUsage(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"explain"}, 2, "want one job id"},
		{[]string{"explain", "a", "b"}, 2, "want one job id"},
		{[]string{"explain", "--gaps", "-1", "a"}, 2, "--gaps -1"},
		{[]string{"explain", "job-1", "--schema", schema}, 1, "no projection " + schema + ".jobs"},
	} {
		r := runBin(t, 30*time.Second, dbEnv(), tc.args...)
		require.Equal(t, tc.code, r.code, "%v\n%s", tc.args, r)
		require.Contains(t, r.stderr, tc.want, "%v", tc.args)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var tables int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&tables))
	require.Zero(t, tables, "explain creates nothing")
}

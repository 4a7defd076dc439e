package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
)

// verifyJSON is `projector verify --json`, as docs/guide/verify.md lists it.
type verifyJSON struct {
	Checked int `json:"checked"`
	Drifts  []struct {
		JobID            string `json:"job_id"`
		Kind             string `json:"kind"`
		RowVersion       int64  `json:"row_version"`
		AuthorityVersion int64  `json:"authority_version"`
		Repaired         bool   `json:"repaired"`
	} `json:"drifts"`
	Counts    map[string]int `json:"counts"`
	Repaired  int            `json:"repaired"`
	Remaining int            `json:"remaining"`
	Unknown   []string       `json:"unknown_to_authority"`
	Failed    []struct {
		JobID string `json:"job_id"`
	} `json:"failed"`
}

func (v verifyJSON) kinds() map[string]string {
	out := map[string]string{}
	for _, d := range v.Drifts {
		out[d.JobID] = d.Kind
	}
	return out
}

// TestVerify plants one drift of each kind against an authority and finds
// them with --job, --all and --sample; --repair heals all but ahead, and
// an audit trigger shows no version ever went down.
func TestVerify(t *testing.T) {
	t.Parallel()
	truth := map[string]struct {
		v     int64
		state map[string]any
	}{
		"ok":       {2, map[string]any{"status": "running"}},
		"missing":  {2, map[string]any{"status": "running"}},
		"behind":   {3, map[string]any{"status": "completed"}},
		"ahead":    {4, map[string]any{"status": "running"}},
		"differs":  {2, map[string]any{"status": "completed"}},
		"held-new": {1, map[string]any{"status": "queued"}},
	}
	truth["revived"] = struct {
		v     int64
		state map[string]any
	}{4, map[string]any{"status": "again"}}
	gone := map[string]int64{"gone-job": 3, "deleted-both": 3}
	authority := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for id, v := range gone {
			if r.URL.Path == "/jobs/"+id {
				w.WriteHeader(http.StatusGone)
				_, _ = fmt.Fprintf(w, `{"version": %d}`, v)
				return
			}
		}
		for id, tr := range truth {
			if r.URL.Path == "/jobs/"+id {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write(snapshotValue(id, tr.v, tr.state))
				return
			}
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(authority.Close)

	s := newStory(t, 1)
	s.migrate()
	for _, row := range []struct {
		id    string
		v     int64
		state string
	}{
		{"ok", 2, `{"status":"running"}`},
		{"behind", 1, `{"status":"running"}`},
		{"ahead", 5, `{"status":"running","extra":1}`},
		{"differs", 2, `{"status":"failed"}`},
		{"stranger", 1, `{}`},
		{"gone-job", 2, `{"status":"running"}`},
	} {
		s.exec(`INSERT INTO `+s.table("jobs")+` (job_id, version, state) VALUES ($1, $2, $3::jsonb)`, row.id, row.v, row.state)
	}
	s.exec(`INSERT INTO ` + s.table("projector_held") + ` (projection, job_id, version, topic, partition, "offset", ops)
		VALUES ('jobs', 'held-new', 3, 't', 0, 7, '[]')`)
	for id, v := range map[string]int64{"revived": 2, "deleted-both": 3} {
		s.exec(`INSERT INTO `+s.table("projector_tombstones")+` (projection, job_id, version) VALUES ('jobs', $1, $2)`, id, v)
	}
	s.audit()

	verifyRun := func(args ...string) (verifyJSON, result) {
		t.Helper()
		r := runBin(t, 60*time.Second, dbEnv(), append([]string{"verify", "--json", "--schema", s.schema,
			"--snapshot-url", authority.URL, "--rate", "200"}, args...)...)
		var v verifyJSON
		if r.code != 2 {
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &v), "%s", r)
		}
		return v, r
	}

	v, r := verifyRun("--job", "ok,missing", "--job", "behind", "--job", "ahead", "differs", "nobody")
	require.Equal(t, 3, r.code, "drift remains: exit 3\n%s", r)
	require.Equal(t, 6, v.Checked)
	require.Equal(t, map[string]string{"missing": "missing", "behind": "behind", "ahead": "ahead", "differs": "differs"}, v.kinds())
	require.Equal(t, map[string]int{"missing": 1, "behind": 1, "ahead": 1, "differs": 1}, v.Counts)
	require.Equal(t, []string{"nobody"}, v.Unknown)
	require.Equal(t, 4, v.Remaining)
	require.Zero(t, v.Repaired)

	v, r = verifyRun("--all")
	require.Equal(t, 3, r.code, "%s", r)
	require.Equal(t, 9, v.Checked, "every row, every tombstone and the job held without a row")
	require.Equal(t, map[string]string{"behind": "behind", "ahead": "ahead", "differs": "differs", "held-new": "missing",
		"gone-job": "behind", "revived": "behind"}, v.kinds(), "deleted-both agrees")
	require.Equal(t, []string{"stranger"}, v.Unknown)

	v, r = verifyRun("--sample", "2")
	require.Contains(t, []int{0, 3}, r.code, "%s", r)
	require.Equal(t, 2, v.Checked)

	text := runBin(t, 60*time.Second, dbEnv(), "verify", "--schema", s.schema, "--snapshot-url", authority.URL, "--job", "ahead,behind")
	require.Equal(t, 3, text.code, "%s", text)
	require.Contains(t, text.stdout, "drifts: 2 (missing 0, behind 1, ahead 1, differs 0)")
	require.Regexp(t, `(?m)^ahead\s+ahead\s+5\s+4\s+no \(ahead is never touched\)`, text.stdout)

	_, r = verifyRun("--all", "--job", "missing", "--repair")
	require.Equal(t, 2, r.code, "one of --all, --sample, --job\n%s", r)

	v, r = verifyRun("--job", "ok,missing,behind,ahead,differs,held-new,gone-job,revived,deleted-both", "--repair")
	require.Equal(t, 3, r.code, "ahead remains: exit 3\n%s", r)
	require.Equal(t, 6, v.Repaired)
	require.Equal(t, 1, v.Remaining)
	for _, d := range v.Drifts {
		require.Equal(t, d.Kind != "ahead", d.Repaired, "%s", d.JobID)
	}
	for id, tr := range truth {
		if id == "ahead" {
			continue
		}
		want, _ := json.Marshal(tr.state)
		s.waitRow(time.Second, id, tr.v, string(want))
	}
	s.waitRow(time.Second, "ahead", 5, `{"status":"running","extra":1}`)
	gj, _ := s.rowOf("gone-job")
	require.True(t, gj.Deleted, "the authority's delete removed gone-job's row: %+v", gj)
	ctx0, cancel0 := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel0()
	tombs := map[string]int64{}
	rows, err := pgtest.Pool(t).Query(ctx0, `SELECT job_id, version FROM `+s.table("projector_tombstones"))
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var v int64
		require.NoError(t, rows.Scan(&id, &v))
		tombs[id] = v
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]int64{"gone-job": 3, "deleted-both": 3}, tombs, "revived lost its tombstone, gone-job got one")

	// Nothing went down; the equal-version overwrite was differs' alone.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var down, equal int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FILTER (WHERE new_version < old_version),
		count(*) FILTER (WHERE new_version = old_version) FROM `+s.table("audit")).Scan(&down, &equal))
	require.Zero(t, down, "no version ever went down")
	require.Equal(t, 1, equal)
	require.Equal(t, 0, s.writes("ahead"))

	// The repairs are in the gap log.
	ex := s.explain("behind")
	require.Len(t, ex.Gaps, 1)
	require.Equal(t, "verify", ex.Gaps[0].Step)
	require.Equal(t, int64(1), ex.Gaps[0].From)
	require.Equal(t, int64(3), ex.Gaps[0].To)

	// Healed: only ahead is left.
	v, r = verifyRun("--all")
	require.Equal(t, 3, r.code, "%s", r)
	require.Equal(t, map[string]string{"ahead": "ahead"}, v.kinds())
	v, r = verifyRun("--job", "ok,missing,behind,differs,held-new,gone-job,revived,deleted-both")
	require.Equal(t, 0, r.code, "no drift remains: exit 0\n%s", r)
	require.Empty(t, v.Drifts)
	require.Equal(t, 8, v.Checked)
}

// TestVerifyUsage: bad flags exit 2 naming what to fix.
func TestVerifyUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"verify", "--all"}, "--snapshot-url is required"},
		{[]string{"verify", "--snapshot-url", "http://a:1"}, "exactly one of --all, --sample N or --job"},
		{[]string{"verify", "--snapshot-url", "http://a:1", "--all", "--sample", "3"}, "exactly one of"},
		{[]string{"verify", "--snapshot-url", "http://a:1", "--all", "--rate", "0"}, "--rate 0"},
		{[]string{"verify", "--snapshot-url", "http://a:1", "--all", "--rate", "2000000000"}, "--rate 2000000000"},
		{[]string{"verify", "--snapshot-url", "ftp://a", "--all"}, "--snapshot-url"},
		{[]string{"verify", "--snapshot-url", "http://a:1", "--all", "job-1"}, "without --job"},
	} {
		r := runBin(t, 30*time.Second, dbEnv(), tc.args...)
		require.Equal(t, 2, r.code, "%v\n%s", tc.args, r)
		require.Contains(t, r.stderr, tc.want, fmt.Sprint(tc.args))
	}
}

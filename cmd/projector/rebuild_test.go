package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/pgtest"
)

// tablesLike lists the schema's tables whose names match the LIKE pattern.
func (s *story) tablesLike(pattern string) []string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.t.Context(), 10*time.Second)
	defer cancel()
	rows, err := pgtest.Pool(s.t).Query(ctx, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = $1 AND table_name LIKE $2 ORDER BY table_name`, s.schema, pattern)
	require.NoError(s.t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		require.NoError(s.t, rows.Scan(&n))
		out = append(out, n)
	}
	require.NoError(s.t, rows.Err())
	return out
}

// TestRebuild: after a run built the model and stopped, rows damaged by
// hand are restored from the log by `projector rebuild`, which swaps the
// shadow in, leaves no shadow behind and keeps positions and quarantine;
// with --keep-old the previous model stays as a table of its own.
func TestRebuild(t *testing.T) {
	t.Parallel()
	s := newStory(t, 3)
	s.fullStory()
	s.runToEnd("g-rebuild")

	jobs := s.table("jobs")
	require.EqualValues(t, 1, s.exec(`UPDATE `+jobs+` SET state = '{"corrupt":true}' WHERE job_id = 'job-42'`))
	require.EqualValues(t, 1, s.exec(`UPDATE `+jobs+` SET version = 99 WHERE job_id = 'task-3'`))
	require.EqualValues(t, 1, s.exec(`DELETE FROM `+jobs+` WHERE job_id = 'task-4'`))
	s.exec(`INSERT INTO ` + jobs + ` (job_id, version, state, updated_at) VALUES ('phantom', 1, '{}', now())`)

	args := []string{"rebuild", "--brokers", s.brokers(), "--topic", s.topic, "--schema", s.schema, "--held-wait", "1s", "--log-level", "warn"}
	r := runBin(t, 90*time.Second, dbEnv(), args...)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "swapped:", "%s", r)
	require.NotContains(t, r.stdout, "kept as", "%s", r)

	s.requireModel()
	s.requirePositionsAtEnd()
	require.Equal(t, int(s.quarantined), s.quarantineCount(), "the rebuilt quarantine replaces the old one")
	require.Empty(t, s.tablesLike("jobs_rebuild"), "no shadow table left")
	require.Empty(t, s.tablesLike("jobs_before_%"), "the old model is dropped without --keep-old")

	// Again with --keep-old: the damaged model survives under its own name.
	require.EqualValues(t, 1, s.exec(`UPDATE `+jobs+` SET state = '{"corrupt":true}' WHERE job_id = 'job-42'`))
	r = runBin(t, 90*time.Second, dbEnv(), append(args, "--keep-old")...)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "swapped:", "%s", r)
	require.Contains(t, r.stdout, "the previous read model is kept as "+s.schema+".jobs_before_", "%s", r)

	s.requireModel()
	s.requirePositionsAtEnd()
	require.Empty(t, s.tablesLike("jobs_rebuild"))
	kept := s.tablesLike("jobs_before_%")
	require.Len(t, kept, 1)
	var state string
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT state::text FROM `+s.table(kept[0])+` WHERE job_id = 'job-42'`).Scan(&state))
	require.JSONEq(t, `{"corrupt":true}`, state, "the kept table is the model from before the rebuild")

	// A run started after the rebuild continues from the rebuilt positions.
	s.produce(rec(0, "job-42", snapshotValue("job-42", 3, map[string]any{"status": "archived"})))
	s.want["job-42"] = wantRow{3, map[string]any{"status": "archived"}}
	s.runToEnd("g-rebuild")
}

// TestRebuildWhileRunning: the swap fences a `projector run` still working
// the old model; it claims again, continues from the rebuilt positions and
// projects what comes next into the rebuilt table.
func TestRebuildWhileRunning(t *testing.T) {
	t.Parallel()
	s := newStory(t, 3)
	s.fullStory()
	p := startBin(t, "run", dbEnv(), s.runArgs("g-live", "inst-live")...)
	addr := p.httpAddr(15 * time.Second)
	s.caughtUp(joinWithin, p)
	require.EqualValues(t, 1, s.exec(`UPDATE `+s.table("jobs")+` SET state = '{"corrupt":true}' WHERE job_id = 'job-42'`))

	r := runBin(t, 90*time.Second, dbEnv(), "rebuild", "--brokers", s.brokers(), "--topic", s.topic, "--schema", s.schema, "--held-wait", "1s", "--log-level", "warn")
	require.Equal(t, 0, r.code, "%s", r)
	s.requireModel()
	s.requirePositionsAtEnd()

	// The live instance keeps going on the rebuilt table.
	s.jobs("after", 12, 1, 5)
	s.caughtUp(joinWithin, p)
	s.requireModel()
	ctx, cancel := s.ctx()
	defer cancel()
	pos, err := s.st.Positions(ctx)
	require.NoError(t, err)
	for _, ps := range pos {
		require.Equal(t, "inst-live", ps.Owner, "partition %d claimed again by the live instance", ps.Partition)
	}
	st, err := fetchStatus(addr)
	require.NoError(t, err)
	require.Zero(t, st.Counters.Conflicts, "%+v", st.Counters)
	p.stop(stopWithin)
	s.requirePositionsAtEnd()
	s.requireModel()
}

// TestRebuildNameLimits: rebuild accepts every --table that run accepts
// (up to 40 bytes), so the swap must work for all of them, whatever names PostgreSQL gave their primary keys, and
// --keep-old must be repeatable, even twice within one second.
func TestRebuildNameLimits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		table   string
		keepOld bool
		times   int
	}{
		{"40-byte table", "t" + strings.Repeat("x", 39), false, 1},
		{"40-byte table --keep-old", "t" + strings.Repeat("x", 39), true, 1},
		{"--keep-old twice", "jobs", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStory(t, 1)
			s.seedStory(false)
			args := []string{"rebuild", "--brokers", s.brokers(), "--topic", s.topic, "--schema", s.schema,
				"--table", tc.table, "--held-wait", "0s", "--log-level", "warn"}
			if tc.keepOld {
				args = append(args, "--keep-old")
			}
			for range tc.times {
				r := runBin(t, 60*time.Second, dbEnv(), args...)
				require.Equal(t, 0, r.code, "%s", r)
			}
		})
	}
}

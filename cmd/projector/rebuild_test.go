package main

import (
	"context"
	"encoding/json"
	"github.com/projector/projector/store"
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
	require.Empty(t, s.tablesLike("projector_rebuild_%"), "no shadow table left")
	require.Empty(t, s.tablesLike("jobs_before_%"), "the old model is dropped without --keep-old")

	// Again with --keep-old: the damaged model survives under its own name.
	require.EqualValues(t, 1, s.exec(`UPDATE `+jobs+` SET state = '{"corrupt":true}' WHERE job_id = 'job-42'`))
	r = runBin(t, 90*time.Second, dbEnv(), append(args, "--keep-old")...)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "swapped:", "%s", r)
	require.Contains(t, r.stdout, "the previous read model is kept as "+s.schema+".jobs_before_", "%s", r)

	s.requireModel()
	s.requirePositionsAtEnd()
	require.Empty(t, s.tablesLike("projector_rebuild_%"))
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

// TestRebuildNameLimits: rebuild accepts any --table up to the 40 bytes
// every command allows, whatever names PostgreSQL gave the primary keys,
// and --keep-old is repeatable, even twice within one second. A table whose
// shadow name (projector_rebuild_<table>) could not exist is bad usage.
func TestRebuildNameLimits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		table   string
		keepOld bool
		times   int
		code    int
	}{
		{"40-byte table", "t" + strings.Repeat("x", 39), false, 1, 0},
		{"40-byte table --keep-old", "t" + strings.Repeat("x", 39), true, 1, 0},
		{"--keep-old twice", "jobs", true, 2, 0},
		{"46-byte table", "t" + strings.Repeat("x", 45), false, 1, 2},
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
				require.Equal(t, tc.code, r.code, "%s", r)
			}
		})
	}
}

// projectionDump is everything stored of the projection named table in the
// story's schema: its rows and its rows in the positions, held, quarantine
// and migrations tables, as text.
func (s *story) projectionDump(table string) string {
	s.t.Helper()
	ctx, cancel := s.ctx()
	defer cancel()
	var b strings.Builder
	dump := func(what, sql string, args ...any) {
		var text *string
		require.NoError(s.t, pgtest.Pool(s.t).QueryRow(ctx, `SELECT string_agg(t::text, E'\n' ORDER BY t::text) FROM (`+sql+`) t`, args...).Scan(&text), sql)
		b.WriteString("-- " + what + "\n")
		if text != nil {
			b.WriteString(*text + "\n")
		}
	}
	dump("rows", `SELECT * FROM `+s.table(table))
	for _, t := range []string{"projector_partitions", "projector_held", "projector_quarantine", "projector_migrations"} {
		dump(t, `SELECT * FROM `+s.table(t)+` WHERE projection = $1`, table)
	}
	return b.String()
}

// TestRebuildLeavesOtherProjectionsAlone: a projection named jobs_rebuild
// (a legal table name) keeps its rows, positions, held deltas and
// quarantine through `projector rebuild --table jobs`, whether the topic
// exists or not.
func TestRebuildLeavesOtherProjectionsAlone(t *testing.T) {
	t.Parallel()
	s := newStory(t, 2)
	s.fullStory()

	other, err := store.New(pgtest.Pool(t), store.Config{Schema: s.schema, Table: "jobs_rebuild"})
	require.NoError(t, err)
	ctx, cancel := s.ctx()
	defer cancel()
	require.NoError(t, other.Migrate(ctx))
	c, err := other.Claim(ctx, s.topic, 0, "other")
	require.NoError(t, err)
	_, err = other.Apply(ctx, &store.Batch{Topic: s.topic, Partition: 0, Epoch: c.Epoch, NextOffset: 7,
		Snapshots: []store.Write{{JobID: "kept-1", Version: 2, State: json.RawMessage(`{"mine":true}`)}},
		Hold:      []store.Held{{JobID: "kept-2", Version: 3, Partition: 0, Offset: 5, Ops: json.RawMessage(`[]`)}},
		Bad:       []store.Bad{{Partition: 0, Offset: 6, Err: "not json"}}})
	require.NoError(t, err)
	before := s.projectionDump("jobs_rebuild")
	require.Contains(t, before, "kept-1")
	require.Contains(t, before, "kept-2")
	require.Contains(t, before, "not json")

	base := []string{"rebuild", "--brokers", s.brokers(), "--schema", s.schema, "--table", "jobs", "--held-wait", "1s", "--log-level", "warn"}
	r := runBin(t, 90*time.Second, dbEnv(), append(base, "--topic", "no-such-topic")...)
	require.Equal(t, 1, r.code, "%s", r)
	require.Equal(t, before, s.projectionDump("jobs_rebuild"), "a rebuild that fails on its topic changed another projection")
	require.Empty(t, s.tablesLike("projector_rebuild_%"), "a rebuild that fails on its topic creates nothing")

	r = runBin(t, 90*time.Second, dbEnv(), append(base, "--topic", s.topic)...)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "swapped:", "%s", r)
	s.requireModel()
	require.Equal(t, before, s.projectionDump("jobs_rebuild"), "a rebuild of jobs changed the projection jobs_rebuild")
}

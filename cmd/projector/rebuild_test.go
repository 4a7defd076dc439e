package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
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

// TestRebuildHelpSaysWhatDiffersFromRun: what the rebuild sets unlike
// 'projector run' is in its --help: its batch size and its memory limit,
// with what to do where memory is tight.
func TestRebuildHelpSaysWhatDiffersFromRun(t *testing.T) {
	t.Parallel()
	r := runBin(t, 10*time.Second, baseEnv(), "rebuild", "--help")
	require.Equal(t, 0, r.code, "%s", r)
	help := strings.Join(strings.Fields(r.stdout), " ")
	require.Regexp(t, `--batch-size int \[PROJECTOR_BATCH_SIZE\] [^\[]*\(default 10000\)`, help)
	require.NotContains(t, help, "GOGC", "the rebuild leaves the collector's target as the environment sets it")
	require.Contains(t, help, "Where memory is tight, set --memory-limit (the batches in flight then fit in it), or lower --batch-size or --batches-in-flight")
	require.Contains(t, help, "auto sets no limit where no container limit is found", "its memory default differs from run's")
}

// TestRebuild: after a run built the model and stopped, rows damaged by
// hand are restored from the log by `projector rebuild`, which swaps the
// shadow in, leaves no shadow behind and keeps positions and quarantine;
// with --keep-old the previous model stays as a table of its own inside
// the reserved prefix.
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
	require.Equal(t, int(s.quarantined), s.quarantineCount(), "the quarantine is merged: one row per record")
	require.Empty(t, s.tablesLike("projector_rebuild_%"), "no shadow table left")
	require.Empty(t, s.tablesLike("projector_old_jobs_%"), "the old model is dropped without --keep-old")
	// The rebuild replayed the deletes, and their tombstones moved with the
	// rebuilt model: late records below them stay out.
	var liveTombs, shadowTombs int64
	require.NoError(t, pgtest.Pool(t).QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE projection = 'jobs'),
		count(*) FILTER (WHERE projection <> 'jobs') FROM `+s.table("projector_tombstones")).Scan(&liveTombs, &shadowTombs))
	require.Equal(t, s.deleted, liveTombs, "every deleted job's tombstone is the live projection's")
	require.Zero(t, shadowTombs, "no tombstone is left under the shadow's name")

	// Again with --keep-old: the damaged model survives under its own name.
	require.EqualValues(t, 1, s.exec(`UPDATE `+jobs+` SET state = '{"corrupt":true}' WHERE job_id = 'job-42'`))
	r = runBin(t, 90*time.Second, dbEnv(), append(args, "--keep-old")...)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "swapped:", "%s", r)
	require.Contains(t, r.stdout, "the previous read model is kept as "+s.schema+".projector_old_jobs_1", "%s", r)

	s.requireModel()
	s.requirePositionsAtEnd()
	require.Empty(t, s.tablesLike("projector_rebuild_%"))
	kept := s.tablesLike("projector_old_jobs_%")
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

// rebuildArgs are the arguments of a `projector rebuild` of the story's
// topic into its schema.
func (s *story) rebuildArgs(extra ...string) []string {
	return append([]string{"rebuild", "--brokers", s.brokers(), "--topic", s.topic, "--schema", s.schema,
		"--held-wait", "1s", "--log-level", "warn"}, extra...)
}

// queryString runs a query returning one text value.
func (s *story) queryString(sql string, args ...any) string {
	s.t.Helper()
	ctx, cancel := s.ctx()
	defer cancel()
	var out *string
	require.NoError(s.t, pgtest.Pool(s.t).QueryRow(ctx, sql, args...).Scan(&out), sql)
	if out == nil {
		return ""
	}
	return *out
}

// TestRebuildKeepsWhatUsersAttached: a view, an index, a grant, a
// row-level security policy, a trigger, a comment and a column users added
// to jobs are all in place after a rebuild, the view shows the rebuilt
// rows, and readers querying the table and the view in a loop through the
// swap never get an error.
func TestRebuildKeepsWhatUsersAttached(t *testing.T) {
	t.Parallel()
	s := newStory(t, 3)
	s.fullStory()
	s.runToEnd("g-attached")

	jobs, view := s.table("jobs"), s.table("jobs_api")
	role := "reader_" + s.schema
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		_, _ = pgtest.Pool(t).Exec(ctx, `DROP OWNED BY `+role)
		_, _ = pgtest.Pool(t).Exec(ctx, `DROP ROLE IF EXISTS `+role)
	})
	for _, sql := range []string{
		`CREATE VIEW ` + view + ` AS SELECT job_id, version, state->>'status' AS status FROM ` + jobs,
		`CREATE INDEX jobs_by_status ON ` + jobs + ` ((state->>'status'))`,
		`CREATE ROLE ` + role,
		`GRANT USAGE ON SCHEMA ` + s.schema + ` TO ` + role,
		`GRANT SELECT ON ` + jobs + `, ` + view + ` TO ` + role,
		`ALTER TABLE ` + jobs + ` ENABLE ROW LEVEL SECURITY`,
		`CREATE POLICY only_completed ON ` + jobs + ` FOR SELECT TO ` + role + ` USING (state->>'status' = 'completed')`,
		`CREATE TABLE ` + s.table("audit") + ` (job_id text, version bigint)`,
		`CREATE FUNCTION ` + s.schema + `.audit() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN INSERT INTO ` + s.table("audit") + ` VALUES (NEW.job_id, NEW.version); RETURN NEW; END $$`,
		`CREATE TRIGGER jobs_audit AFTER INSERT OR UPDATE ON ` + jobs + ` FOR EACH ROW EXECUTE FUNCTION ` + s.schema + `.audit()`,
		`COMMENT ON TABLE ` + jobs + ` IS 'the jobs, as the log says'`,
		`ALTER TABLE ` + jobs + ` ADD COLUMN note text`,
		`UPDATE ` + jobs + ` SET note = 'keep me' WHERE job_id = 'task-1'`,
		// Damage the model: the rebuild must repair it through the view too.
		`UPDATE ` + jobs + ` SET state = '{"status":"corrupt"}' WHERE job_id = 'job-42'`,
		`DELETE FROM ` + jobs + ` WHERE job_id = 'task-4'`,
		`INSERT INTO ` + jobs + ` (job_id, version, state) VALUES ('phantom', 1, '{}')`,
		`TRUNCATE ` + s.table("audit"),
	} {
		s.exec(sql)
	}
	require.Equal(t, "corrupt", s.queryString(`SELECT status FROM `+view+` WHERE job_id = 'job-42'`))

	// Readers in a loop, from before the rebuild starts until it has ended.
	ctx, stopReaders := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var reads, readErrs atomic.Int64
	var firstErr atomic.Value
	for _, q := range []string{
		`SELECT count(*) FROM ` + view + ` WHERE status IS NOT NULL`,
		`SELECT count(*) FROM ` + jobs + ` WHERE version >= 1`,
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				var n int64
				err := pgtest.Pool(t).QueryRow(ctx, q).Scan(&n)
				switch {
				case err == nil:
					reads.Add(1)
				case ctx.Err() == nil:
					readErrs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	r := runBin(t, 90*time.Second, dbEnv(), s.rebuildArgs()...)
	afterSwap := reads.Load()
	eventually(t, 10*time.Second, "readers read after the swap", func() (bool, string) {
		return reads.Load() > afterSwap+10, fmt.Sprintf("%d reads", reads.Load())
	})
	stopReaders()
	wg.Wait()
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "swapped:", "%s", r)
	require.Zero(t, readErrs.Load(), "readers got errors through the swap, the first: %v", firstErr.Load())
	t.Logf("%d reads through the rebuild, none failed", reads.Load())

	s.requireModel()
	require.Equal(t, "completed", s.queryString(`SELECT status FROM `+view+` WHERE job_id = 'job-42'`), "the view reads the rebuilt rows")
	require.Equal(t, "0", s.queryString(`SELECT count(*)::text FROM `+view+` WHERE job_id = 'phantom'`))
	require.NotEmpty(t, s.queryString(`SELECT status FROM `+view+` WHERE job_id = 'task-4'`))
	require.Equal(t, "jobs_by_status", s.queryString(`SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 AND tablename = 'jobs' AND indexname = 'jobs_by_status'`, s.schema))
	require.Equal(t, "true", s.queryString(`SELECT has_table_privilege($1, $2, 'SELECT')::text`, role, jobs))
	require.Equal(t, "true", s.queryString(`SELECT relrowsecurity::text FROM pg_class WHERE oid = to_regclass($1)`, jobs))
	require.Equal(t, "only_completed", s.queryString(`SELECT policyname::text FROM pg_policies WHERE schemaname = $1 AND tablename = 'jobs'`, s.schema))
	require.Equal(t, "jobs_audit", s.queryString(`SELECT tgname::text FROM pg_trigger WHERE tgrelid = to_regclass($1) AND NOT tgisinternal`, jobs))
	require.Equal(t, "the jobs, as the log says", s.queryString(`SELECT obj_description(to_regclass($1), 'pg_class')`, jobs))
	require.Equal(t, "keep me", s.queryString(`SELECT note FROM `+jobs+` WHERE job_id = 'task-1'`), "a column users added keeps its values")
	// The trigger saw exactly the rows the rebuild changed: job-42 and task-4.
	require.Equal(t, "job-42,task-4", s.queryString(`SELECT string_agg(job_id, ',' ORDER BY job_id) FROM `+s.table("audit")))

	// The policy still applies to the role, through the rebuilt rows.
	ctx2, cancel := s.ctx()
	defer cancel()
	tx, err := pgtest.Pool(t).Begin(ctx2)
	require.NoError(t, err)
	defer tx.Rollback(ctx2)
	_, err = tx.Exec(ctx2, `SET LOCAL ROLE `+role)
	require.NoError(t, err)
	var visible, running int64
	require.NoError(t, tx.QueryRow(ctx2, `SELECT count(*), count(*) FILTER (WHERE state->>'status' <> 'completed') FROM `+jobs).Scan(&visible, &running))
	require.Positive(t, visible)
	require.Zero(t, running, "the policy hides jobs that are not completed from the role")
}

// TestRebuildRefusesWhatItCannotKeep: what a swap could not keep or write
// through is refused before anything is read or created, naming it, and
// the live model is left as it was.
func TestRebuildRefusesWhatItCannotKeep(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, sql, want string
	}{
		{"rule", `CREATE RULE no_deletes AS ON DELETE TO {{jobs}} DO INSTEAD NOTHING`, "rule no_deletes"},
		{"NOT NULL column", `ALTER TABLE {{jobs}} ADD COLUMN owner_team text NOT NULL DEFAULT 'x'; ALTER TABLE {{jobs}} ALTER COLUMN owner_team DROP DEFAULT`, "column owner_team is NOT NULL without a default"},
		{"column type", `DROP VIEW IF EXISTS nothing; ALTER TABLE {{jobs}} ALTER COLUMN state TYPE json`, "column state is json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStory(t, 1)
			s.seedStory(false)
			s.runToEnd("g-refuse")
			s.exec(strings.ReplaceAll(tc.sql, "{{jobs}}", s.table("jobs")))
			before := s.projectionDump("jobs")
			r := runBin(t, 60*time.Second, dbEnv(), s.rebuildArgs()...)
			require.Equal(t, 1, r.code, "%s", r)
			require.Contains(t, r.stderr, "nothing was changed", "%s", r)
			require.Contains(t, r.stderr, tc.want, "%s", r)
			require.Empty(t, s.tablesLike("projector_rebuild_%"), "nothing is created")
			require.Equal(t, before, s.projectionDump("jobs"))
		})
	}
}

// shadowRead is how many records the story's shadow of jobs has stored
// positions for.
func (s *story) shadowRead() int64 {
	s.t.Helper()
	ctx, cancel := s.ctx()
	defer cancel()
	var n int64
	require.NoError(s.t, pgtest.Pool(s.t).QueryRow(ctx, `SELECT coalesce(sum(greatest(next_offset, 0)), 0) FROM `+
		s.table("projector_partitions")+` WHERE projection = 'projector_rebuild_jobs'`).Scan(&n))
	return n
}

var (
	readCount  = regexp.MustCompile(`this run: (\d+) records read`)
	resumeLine = regexp.MustCompile(`resuming the rebuild of \S+ from the shadow's stored positions: (\d+) of (\d+) records already read`)
)

func atoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err)
	return n
}

// TestRebuildResumesAfterKill: a rebuild killed with SIGKILL half way
// leaves the live model as it was; the next run says it resumes, reads
// only what the first did not store (fewer records than the log holds) and
// ends exact. --restart starts over and says so.
func TestRebuildResumesAfterKill(t *testing.T) {
	t.Parallel()
	s := newStory(t, 3)
	s.jobs("task", 600, 1, 5)
	s.runToEnd("g-resume")
	require.EqualValues(t, 1, s.exec(`UPDATE `+s.table("jobs")+` SET state = '{"corrupt":true}' WHERE job_id = 'task-42'`))
	before := s.projectionDump("jobs")
	total := s.produced

	first := startBin(t, "rebuild 1", dbEnv(), s.rebuildArgs("--batch-size", "20", "--batch-linger", "1ms")...)
	eventually(t, joinWithin, "the first rebuild stores a part of the log", func() (bool, string) {
		first.requireAlive()
		n := s.shadowRead()
		return n >= total/4, fmt.Sprintf("%d of %d records stored", n, total)
	})
	require.NoError(t, first.cmd.Process.Kill())
	<-first.done
	stored := s.shadowRead()
	require.Less(t, stored, total, "killed half way, not at the end")
	require.Equal(t, before, s.projectionDump("jobs"), "a killed rebuild leaves the live model as it was")

	// A batch the kill cut off in its COMMIT may still land, so the
	// count to check against is the one the next run finds.
	r := runBin(t, 90*time.Second, dbEnv(), s.rebuildArgs()...)
	require.Equal(t, 0, r.code, "%s", r)
	resumed := resumeLine.FindStringSubmatch(r.stdout)
	require.NotNil(t, resumed, "the second run says it resumes\n%s", r)
	from := atoi(t, resumed[1])
	require.Equal(t, total, atoi(t, resumed[2]))
	require.GreaterOrEqual(t, from, stored)
	require.Less(t, from, total)
	m := readCount.FindStringSubmatch(r.stdout)
	require.NotNil(t, m, "%s", r)
	require.Equal(t, total-from, atoi(t, m[1]), "the resumed run reads only what the first did not store")
	t.Logf("killed after %d of %d records were stored; the next run:\n%s", stored, total, r.stdout)
	s.requireModel()
	s.requirePositionsAtEnd()
	require.Empty(t, s.tablesLike("projector_rebuild_%"))

	// Killed again, then --restart: it starts over and reads everything.
	require.EqualValues(t, 1, s.exec(`UPDATE `+s.table("jobs")+` SET state = '{"corrupt":true}' WHERE job_id = 'task-42'`))
	second := startBin(t, "rebuild 2", dbEnv(), s.rebuildArgs("--batch-size", "20", "--batch-linger", "1ms")...)
	eventually(t, joinWithin, "the second rebuild stores a part of the log", func() (bool, string) {
		second.requireAlive()
		n := s.shadowRead()
		return n >= total/4, fmt.Sprintf("%d of %d records stored", n, total)
	})
	require.NoError(t, second.cmd.Process.Kill())
	<-second.done
	r = runBin(t, 90*time.Second, dbEnv(), s.rebuildArgs("--restart")...)
	require.Equal(t, 0, r.code, "%s", r)
	require.Regexp(t, `starting over \(--restart discarded \d+ records read earlier\)`, r.stdout, "%s", r)
	require.Contains(t, r.stdout, fmt.Sprintf("this run: %d records read", total), "%s", r)
	s.requireModel()
	s.requirePositionsAtEnd()
}

// TestRebuildDryRun: --dry-run builds the shadow, reports each kind of
// drift with its job ids, and swaps nothing; the rebuild after it continues
// from the shadow and swaps.
func TestRebuildDryRun(t *testing.T) {
	t.Parallel()
	s := newStory(t, 2)
	s.fullStory()
	s.runToEnd("g-dry")
	jobs := s.table("jobs")
	s.exec(`UPDATE ` + jobs + ` SET state = '{"corrupt":true}' WHERE job_id = 'job-42'`)
	s.exec(`UPDATE ` + jobs + ` SET version = 99 WHERE job_id = 'task-3'`)
	s.exec(`UPDATE ` + jobs + ` SET version = 2 WHERE job_id = 'task-5'`)
	s.exec(`DELETE FROM ` + jobs + ` WHERE job_id = 'task-4'`)
	s.exec(`INSERT INTO ` + jobs + ` (job_id, version, state) VALUES ('phantom', 1, '{}')`)
	before := s.projectionDump("jobs")

	r := runBin(t, 90*time.Second, dbEnv(), s.rebuildArgs("--dry-run")...)
	require.Equal(t, 0, r.code, "%s", r)
	for _, want := range []string{
		"differs from the rebuilt one in 5 jobs",
		`missing  1  "task-4"`, `behind   1  "task-5"`, `ahead    1  "task-3"`, `differs  1  "job-42"`, `extra    1  "phantom"`,
		"not swapped (--dry-run)",
	} {
		require.Contains(t, r.stdout, want, "%s", r)
	}
	require.Equal(t, before, s.projectionDump("jobs"), "a dry run changes nothing live")
	require.Equal(t, []string{"projector_rebuild_jobs"}, s.tablesLike("projector_rebuild_%"))

	r = runBin(t, 90*time.Second, dbEnv(), s.rebuildArgs()...)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "resuming the rebuild", "%s", r)
	require.Contains(t, r.stdout, "this run: 0 records read", "%s", r)
	require.Contains(t, r.stdout, "rows changed: 3 updated, 1 inserted, 1 deleted", "%s", r)
	s.requireModel()
	s.requirePositionsAtEnd()
}

// TestRebuildsOfTwoTablesAtOnce: each table's rebuild has its own default
// consumer group, so two at once on one topic both get every partition and
// both finish.
func TestRebuildsOfTwoTablesAtOnce(t *testing.T) {
	t.Parallel()
	s := newStory(t, 3)
	s.jobs("task", 30, 1, 5)
	var wg sync.WaitGroup
	results := make([]result, 2)
	for i, table := range []string{"jobs", "jobs_copy"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runBin(t, 90*time.Second, dbEnv(), s.rebuildArgs("--table", table)...)
		}()
	}
	wg.Wait()
	for _, r := range results {
		require.Equal(t, 0, r.code, "%s", r)
		require.Contains(t, r.stdout, "swapped:", "%s", r)
	}
	s.requireModel()
	require.Equal(t, s.queryString(`SELECT string_agg(job_id || ':' || version || ':' || state::text, ',' ORDER BY job_id) FROM `+s.table("jobs")),
		s.queryString(`SELECT string_agg(job_id || ':' || version || ':' || state::text, ',' ORDER BY job_id) FROM `+s.table("jobs_copy")))
}

// TestBenchSwap: `projector bench --swap-rows` measures a swap while
// readers query through a view: none fails and none waits on a lock.
func TestBenchSwap(t *testing.T) {
	t.Parallel()
	r := runBin(t, 90*time.Second, dbEnv(), "bench", "--database-url", pgtest.URL(), "--swap-rows", "2000", "--swap-differ-percent", "10")
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "200 rows updated, 0 inserted, 0 deleted", "%s", r)
	require.Regexp(t, `readers during the swap: (\d+ reads, .*|no reads); 0 errors`, r.stdout)
	require.Regexp(t, `readers waiting on a lock during the swap: 0 in \d+ samples`, r.stdout)
}

// TestRebuildKeepsAUsersCheck: a CHECK a user put on jobs holds in the
// replay too: the record that breaks it is quarantined there as it was
// live, the swap succeeds and the quarantine keeps one row for it.
func TestRebuildKeepsAUsersCheck(t *testing.T) {
	t.Parallel()
	s := newStory(t, 2)
	s.fullStory()
	ctx, cancel := s.ctx()
	defer cancel()
	require.NoError(t, s.st.Migrate(ctx))
	s.exec(`ALTER TABLE ` + s.table("jobs") + ` ADD CONSTRAINT no_banned CHECK (state->>'status' IS DISTINCT FROM 'banned')`)
	s.produce(rec(1, "job-banned", snapshotValue("job-banned", 1, map[string]any{"status": "banned"})))
	s.quarantined++
	s.runToEnd("g-check")

	r := runBin(t, 90*time.Second, dbEnv(), s.rebuildArgs()...)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "the shadow checks rows as "+s.schema+".jobs does: no_banned", "%s", r)
	require.Contains(t, r.stdout, "swapped:", "%s", r)
	s.requireModel()
	s.requirePositionsAtEnd()
	require.Equal(t, int(s.quarantined), s.quarantineCount(), "one quarantine row per record")
	require.Contains(t, s.queryString(`SELECT error FROM `+s.table("projector_quarantine")+` WHERE key = 'job-banned'`), "no_banned")
}

// TestRebuildSwapPausesLiveWritesQuietly: while a swap runs longer than a
// batch would wait, a `projector run` whose records arrive says it waits
// for the rebuild's swap, does not report PostgreSQL as failing, nor a
// stall past --stall-timeout, and once
// the swap commits claims again and projects the records that arrived
// meanwhile.
func TestRebuildSwapPausesLiveWritesQuietly(t *testing.T) {
	t.Parallel()
	s := newStory(t, 2)
	s.jobs("before", 10, 1, 3)
	// A stall bound shorter than the swap: a pause for a swap is no stall.
	p := startBin(t, "run", dbEnv(), s.runArgs("g-live", "inst-live", "--log-level", "info",
		"--statement-timeout", "1s", "--stall-timeout", "3s")...)
	s.caughtUp(joinWithin, p)

	// A user's statement trigger makes the swap's update slow.
	s.exec(`CREATE FUNCTION ` + s.table("slow_swap") + `() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF current_setting('application_name') = 'projector rebuild swap' THEN PERFORM pg_sleep(10); END IF; RETURN NULL; END $$`)
	s.exec(`CREATE TRIGGER slow_swap BEFORE UPDATE ON ` + s.table("jobs") + ` FOR EACH STATEMENT EXECUTE FUNCTION ` + s.table("slow_swap") + `()`)

	r := startBin(t, "rebuild", dbEnv(), "rebuild", "--brokers", s.brokers(), "--topic", s.topic, "--schema", s.schema, "--held-wait", "1s", "--log-level", "warn")
	eventually(t, 60*time.Second, "the swap is in the slow trigger, holding the partitions", func() (bool, string) {
		var n int
		ctx, cancel := s.ctx()
		defer cancel()
		err := pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'projector rebuild swap' AND wait_event = 'PgSleep'`).Scan(&n)
		return err == nil && n > 0, fmt.Sprint(n, err)
	})
	s.jobs("during", 10, 1, 2)
	eventually(t, 60*time.Second, "the rebuild exits", func() (bool, string) { return r.exited(), "" })
	require.Equal(t, 0, r.code, "%s\n%s", r.out.String(), r.logs.String())
	require.Contains(t, r.out.String(), "swapped:")

	s.caughtUp(joinWithin, p)
	s.requireModel()
	p.requireAlive()
	require.False(t, p.logged("partition stalled", nil), "a swap is not a stall: %s", p.logs.String())
	require.True(t, p.logged("waiting for a rebuild's swap into the read model", map[string]string{"table": s.schema + ".jobs"}), "%s", p.logs.String())
	require.False(t, p.logged("PostgreSQL is failing", nil), "a swap is not an outage: %s", p.logs.String())
	require.False(t, p.logged("claim waits for the previous owner", nil), "a swap is not a stuck owner: %s", p.logs.String())
	require.False(t, p.logged("partition worker stopped", map[string]string{"level": "ERROR"}), "a fence after a swap is no error: %s", p.logs.String())
	p.stop(stopWithin)
}

// TestRebuildRefusesASecondRebuildOfTheTable: two rebuilds of one table
// would share its shadow, each resetting or swapping what the other
// writes; while one runs, another exits 1 having changed nothing, and once
// it ended, the next one runs.
func TestRebuildRefusesASecondRebuildOfTheTable(t *testing.T) {
	t.Parallel()
	s := newStory(t, 1)
	s.jobs("j", 3, 1, 2)
	ctx, cancel := s.ctx()
	defer cancel()
	release, err := s.st.LockRebuild(ctx) // as a rebuild in progress does
	require.NoError(t, err)
	args := []string{"rebuild", "--brokers", s.brokers(), "--topic", s.topic, "--schema", s.schema, "--held-wait", "1s", "--group", "other-group"}
	r := runBin(t, 60*time.Second, dbEnv(), args...)
	require.Equal(t, 1, r.code, "%s", r)
	require.Contains(t, r.stderr, "another rebuild of "+s.schema+".jobs is running", "%s", r)
	require.Contains(t, r.stderr, "nothing was changed", "%s", r)
	require.Empty(t, s.tablesLike("projector_rebuild_%"), "no shadow created")

	release()
	r = runBin(t, 60*time.Second, dbEnv(), args...)
	require.Equal(t, 0, r.code, "%s", r)
	s.requireModel()
}

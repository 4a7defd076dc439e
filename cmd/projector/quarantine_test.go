package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
)

// quarantineRow is every column of one quarantine row, to compare the
// table before and after a replay.
type quarantineRow struct {
	ID                int64
	Partition         int
	Offset            int64
	Key, Value, Error string
	Time              time.Time
}

func (s *story) quarantineRows() []quarantineRow {
	s.t.Helper()
	ctx, cancel := s.ctx()
	defer cancel()
	rows, err := pgtest.Pool(s.t).Query(ctx, `SELECT id, partition, "offset", coalesce(convert_from(key, 'UTF8'), ''),
		coalesce(encode(value, 'escape'), ''), error, "time" FROM `+s.table("projector_quarantine")+` ORDER BY id`)
	require.NoError(s.t, err)
	defer rows.Close()
	var out []quarantineRow
	for rows.Next() {
		var q quarantineRow
		require.NoError(s.t, rows.Scan(&q.ID, &q.Partition, &q.Offset, &q.Key, &q.Value, &q.Error, &q.Time))
		out = append(out, q)
	}
	require.NoError(s.t, rows.Err())
	return out
}

// audit records every write to the story's jobs table, with the version
// before and after, through a trigger.
func (s *story) audit() {
	s.t.Helper()
	s.exec(`CREATE TABLE ` + s.table("audit") + ` (job_id text, old_version bigint, new_version bigint, state jsonb)`)
	s.exec(`CREATE FUNCTION ` + s.table("audit_jobs") + `() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO ` + s.table("audit") + ` VALUES (NEW.job_id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.version END, NEW.version, NEW.state);
			RETURN NEW;
		END $$`)
	s.exec(`CREATE TRIGGER audit_jobs AFTER INSERT OR UPDATE ON ` + s.table("jobs") + ` FOR EACH ROW EXECUTE FUNCTION ` + s.table("audit_jobs") + `()`)
}

// writes counts the audited writes of job.
func (s *story) writes(job string) int {
	s.t.Helper()
	ctx, cancel := s.ctx()
	defer cancel()
	var n int
	require.NoError(s.t, pgtest.Pool(s.t).QueryRow(ctx, `SELECT count(*) FROM `+s.table("audit")+` WHERE job_id = $1`, job).Scan(&n))
	return n
}

// migrate creates the story's tables as `projector run` would, so a test
// can put its own constraints and triggers on them first.
func (s *story) migrate() {
	s.t.Helper()
	ctx, cancel := s.ctx()
	defer cancel()
	require.NoError(s.t, s.st.Migrate(ctx))
}

type listedRecord struct {
	ID        int64     `json:"id"`
	Topic     string    `json:"topic"`
	Partition *int      `json:"partition"`
	Offset    *int64    `json:"offset"`
	Key       *string   `json:"key"`
	Error     string    `json:"error"`
	Time      time.Time `json:"time"`
}

func (s *story) quarantineList(args ...string) []listedRecord {
	s.t.Helper()
	r := runBin(s.t, 30*time.Second, dbEnv(), append([]string{"quarantine", "list", "--json", "--schema", s.schema}, args...)...)
	require.Equal(s.t, 0, r.code, "%s", r)
	var out []listedRecord
	require.NoError(s.t, json.Unmarshal([]byte(r.stdout), &out), "%s", r)
	return out
}

// TestQuarantineUserConstraintAndReplay is issue 9's replay story: a CHECK
// constraint a user added to jobs refuses one record of a batch, which is
// quarantined alone while the rest lands; replaying it while the constraint
// holds changes nothing; once the user drops the constraint, a replay
// applies it exactly once, and replaying what is still bad leaves the same
// rows. A `projector run` keeps running throughout.
func TestQuarantineUserConstraintAndReplay(t *testing.T) {
	t.Parallel()
	s := newStory(t, 1)
	s.migrate()
	s.audit()
	s.exec(`ALTER TABLE ` + s.table("jobs") + ` ADD CONSTRAINT no_bad_status CHECK (state->>'status' IS DISTINCT FROM 'bad')`)

	s.produce(
		rec(0, "good-1", snapshotValue("good-1", 1, map[string]any{"status": "running"})),
		rec(0, "bad-1", snapshotValue("bad-1", 1, map[string]any{"status": "bad"})),
		rec(0, "good-2", snapshotValue("good-2", 1, map[string]any{"status": "running"})),
		rec(0, "good-1", deltaValue("good-1", 2, map[string]any{"op": "set", "path": "/status", "value": "done"})),
		rec(0, "good-2", snapshotValue("good-2", 2, map[string]any{"status": "done"})),
		rec(0, "good-2", deltaValue("good-2", 3, map[string]any{"op": "set", "path": "/status", "value": "bad"})),
		rec(0, "garbage", []byte("not json\x1b[31m")),
	)
	s.want["good-1"] = wantRow{2, map[string]any{"status": "done"}}
	s.want["good-2"] = wantRow{2, map[string]any{"status": "done"}}
	s.quarantined = 3

	run := startBin(t, "run", dbEnv(), s.runArgs("g-replay", "inst-replay", "--http-addr", "off")...)
	s.caughtUp(joinWithin, run)
	s.requireModel()
	before := s.quarantineRows()
	require.Len(t, before, 3, "bad-1, good-2 v3 and the garbage are quarantined alone; the rest landed")
	for _, q := range before[:2] {
		require.Contains(t, q.Error, `violates check constraint "no_bad_status"`)
		require.Contains(t, q.Error, "SQLSTATE 23514")
	}

	listed := s.quarantineList()
	require.Len(t, listed, 3)
	for _, l := range listed {
		require.NotZero(t, l.ID)
		require.Equal(t, s.topic, l.Topic)
		require.NotNil(t, l.Partition)
		require.NotNil(t, l.Offset)
		require.NotNil(t, l.Key)
		require.NotEmpty(t, l.Error)
		require.False(t, l.Time.IsZero())
	}
	require.Equal(t, before[2].ID, listed[0].ID, "newest first")
	require.Equal(t, "garbage", *listed[0].Key)
	require.Len(t, s.quarantineList("--limit", "1"), 1)
	require.Empty(t, s.quarantineList("--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)))

	text := runBin(t, 30*time.Second, dbEnv(), "quarantine", "list", "--schema", s.schema)
	require.Equal(t, 0, text.code, "%s", text)
	require.NotContains(t, text.stdout, "\x1b", "control characters from records are escaped")
	show := runBin(t, 30*time.Second, dbEnv(), "quarantine", "show", fmt.Sprint(before[2].ID), "--schema", s.schema)
	require.Equal(t, 0, show.code, "%s", show)
	require.Contains(t, show.stdout, `not json\x1b[31m`, "the value, escaped")

	// Still refused: nothing changes, not even the reasons.
	r := runBin(t, 30*time.Second, dbEnv(), "quarantine", "replay", "--all", "--schema", s.schema)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "replayed 3 quarantined records: 0 applied", "%s", r)
	require.Contains(t, r.stdout, "3 still refused", "%s", r)
	require.Equal(t, before, s.quarantineRows(), "replaying still-bad records leaves exactly the same rows")
	require.Equal(t, 0, s.writes("bad-1"))

	s.exec(`ALTER TABLE ` + s.table("jobs") + ` DROP CONSTRAINT no_bad_status`)
	r = runBin(t, 30*time.Second, dbEnv(), "quarantine", "replay", fmt.Sprint(before[0].ID), "--schema", s.schema)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "replayed 1 quarantined records: 1 applied", "%s", r)
	s.want["bad-1"] = wantRow{1, map[string]any{"status": "bad"}}
	s.requireModel()

	r = runBin(t, 30*time.Second, dbEnv(), "quarantine", "replay", "--all", "--json", "--schema", s.schema)
	require.Equal(t, 0, r.code, "%s", r)
	var rep struct {
		Replayed int `json:"replayed"`
		Applied  int `json:"applied"`
		Refused  int `json:"refused"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), "%s", r)
	require.Equal(t, 2, rep.Replayed)
	require.Equal(t, 1, rep.Applied, "good-2 v3")
	require.Equal(t, 1, rep.Refused, "the garbage")
	s.want["good-2"] = wantRow{3, map[string]any{"status": "bad"}}
	s.requireModel()
	after := s.quarantineRows()
	require.Equal(t, before[2:], after, "only the garbage stays, as it was")

	// Replaying again changes nothing: each record applied exactly once.
	r = runBin(t, 30*time.Second, dbEnv(), "quarantine", "replay", "--all", "--schema", s.schema)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "replayed 1 quarantined records: 0 applied", "%s", r)
	require.Equal(t, after, s.quarantineRows())
	require.Equal(t, 1, s.writes("bad-1"), "bad-1 written once")
	require.Equal(t, 3, s.writes("good-2"), "good-2 written at v1, v2, v3")

	// The live projection went on undisturbed: a new record still lands.
	s.produce(rec(0, "good-1", deltaValue("good-1", 3, map[string]any{"op": "set", "path": "/status", "value": "archived"})))
	s.want["good-1"] = wantRow{3, map[string]any{"status": "archived"}}
	s.caughtUp(joinWithin, run)
	s.requireModel()
	run.stop(stopWithin)

	// Purge.
	r = runBin(t, 30*time.Second, dbEnv(), "quarantine", "purge", "--all", "--schema", s.schema)
	require.Equal(t, 0, r.code, "%s", r)
	require.Equal(t, "purged 1 quarantined records\n", r.stdout)
	require.Empty(t, s.quarantineRows())
}

// TestQuarantineUsage: bad arguments exit 2 saying what to fix; a projection
// that does not exist exits 1 saying so, and nothing is created.
func TestQuarantineUsage(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"quarantine"}, 2, "Commands:"},
		{[]string{"quarantine", "frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"quarantine", "replay"}, 2, "give quarantined record ids or --all"},
		{[]string{"quarantine", "replay", "1", "--all"}, 2, "not both"},
		{[]string{"quarantine", "replay", "x1"}, 2, `"x1" is not a quarantined record id`},
		{[]string{"quarantine", "purge"}, 2, "give --before TIME or --all"},
		{[]string{"quarantine", "purge", "--before", "yesterday"}, 2, "want a time such as"},
		{[]string{"quarantine", "list", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"quarantine", "show"}, 2, "want one quarantined record id"},
		{[]string{"quarantine", "list", "--schema", schema}, 1, "no projection " + schema + ".jobs"},
		{[]string{"quarantine", "show", "7", "--schema", schema}, 1, "no projection"},
		{[]string{"quarantine", "replay", "--all", "--schema", schema}, 1, "no projection"},
	} {
		r := runBin(t, 30*time.Second, dbEnv(), tc.args...)
		require.Equal(t, tc.code, r.code, "%v\n%s", tc.args, r)
		require.Contains(t, r.stderr, tc.want, "%v", tc.args)
	}
	for _, sub := range []string{"list", "show", "replay", "purge"} {
		r := runBin(t, 10*time.Second, baseEnv(), "quarantine", sub, "--help")
		require.Equal(t, 0, r.code, "%s", r)
		require.Contains(t, r.stdout, "projector quarantine "+sub+" [flags]")
		require.Equal(t, "DATABASE_URL", helpFlags(r.stdout)["database-url"], "%s", r.stdout)
		h := runBin(t, 10*time.Second, baseEnv(), "help", "quarantine", sub)
		require.Equal(t, r.stdout, h.stdout)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var tables int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&tables))
	require.Zero(t, tables, "read-only commands create nothing")
}

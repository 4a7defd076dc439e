package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
)

// Teams migrate as the tables' owner in a deploy step and run the daemon
// with DML rights only: `projector migrate` creates the tables and brings
// them up to date, and `run` projects with a role that may not create or
// alter anything; tables that are behind make it exit 1 saying what to run.
func TestRunNeedsOnlyDMLOnACurrentSchema(t *testing.T) {
	t.Parallel()
	s := newStory(t, 2)
	// Quarantined records, deletes, stale and duplicate records: every
	// kind of write run makes, sequences included.
	s.fullStory()

	mig := []string{"migrate", "--schema", s.schema}
	res := runBin(t, 30*time.Second, dbEnv(), mig...)
	require.Equal(t, 0, res.code, res.String())
	require.Contains(t, res.stdout, s.schema+".jobs migrated: 001_init, ")
	require.Contains(t, res.stdout, "009_log_identity")
	res = runBin(t, 30*time.Second, dbEnv(), mig...)
	require.Equal(t, 0, res.code, res.String())
	require.Contains(t, res.stdout, "up to date")

	roleName, dmlURL := pgtest.DMLRole(t, s.schema)
	dml := baseEnv("DATABASE_URL=" + dmlURL)
	// Without the sequences' grant: run says what to grant, at start,
	// instead of retrying its first quarantine write for ever.
	_, err := pgtest.Pool(t).Exec(context.Background(), `REVOKE USAGE, SELECT ON ALL SEQUENCES IN SCHEMA `+pgx.Identifier{s.schema}.Sanitize()+` FROM `+pgx.Identifier{roleName}.Sanitize())
	require.NoError(t, err)
	res = runBin(t, 30*time.Second, dml, s.runArgs("g-dml", "inst-dml", "--http-addr", "off")...)
	require.Equal(t, 1, res.code, res.String())
	require.Contains(t, res.stderr, "projector_quarantine_id_seq: USAGE")
	require.Contains(t, res.stderr, "GRANT USAGE, SELECT ON SEQUENCE")
	_, err = pgtest.Pool(t).Exec(context.Background(), `GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA `+pgx.Identifier{s.schema}.Sanitize()+` TO `+pgx.Identifier{roleName}.Sanitize())
	require.NoError(t, err)

	p := startBin(t, "run as DML", dml, s.runArgs("g-dml", "inst-dml", "--http-addr", "off")...)
	s.caughtUp(joinWithin, p)
	p.stop(stopWithin)
	s.requireModel()
	require.Equal(t, int(s.quarantined), s.quarantineCount())
	require.Positive(t, s.quarantineCount())
	// Operator commands that write, as the same role.
	res = runBin(t, 30*time.Second, dml, "quarantine", "replay", "--all", "--schema", s.schema)
	require.Equal(t, 0, res.code, res.String())
	res = runBin(t, 30*time.Second, dml, "reset-positions", "--brokers", s.brokers(), "--topic", s.topic, "--schema", s.schema, "--to", "latest")
	require.Equal(t, 0, res.code, res.String())

	// The tables fall behind (as if this version added a migration).
	_, err = pgtest.Pool(t).Exec(context.Background(), `DELETE FROM `+pgx.Identifier{s.schema, "projector_migrations"}.Sanitize()+
		` WHERE name = 'migrations/009_log_identity.sql'`)
	require.NoError(t, err)
	res = runBin(t, 30*time.Second, dml, s.runArgs("g-dml", "inst-dml", "--http-addr", "off")...)
	require.Equal(t, 1, res.code, res.String())
	require.Contains(t, res.stderr, "migrations not run: 009_log_identity")
	require.Contains(t, res.stderr, "run `projector migrate --schema "+s.schema+" --table jobs` as the tables' owner")

	res = runBin(t, 30*time.Second, dbEnv(), mig...)
	require.Equal(t, 0, res.code, res.String())
	require.Contains(t, res.stdout, "migrated: 009_log_identity")
	s.jobs("extra", 20, 1, 1)
	p = startBin(t, "run as DML again", dml, s.runArgs("g-dml", "inst-dml", "--http-addr", "off")...)
	s.caughtUp(joinWithin, p)
	p.stop(stopWithin)
	s.requireModel()
}

package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// A role with DML rights only that starts while the tables' owner
// migrates them waits for the migration, then finds nothing left to do:
// it must not run DDL of its own (it would fail, and report the tables as
// behind although they are current by then).
func TestEnsureCurrentDuringAMigrationByTheOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner := pgtest.Store(t)
	schema := owner.Schema()
	pool := pgtest.Pool(t)
	s := pgx.Identifier{schema}.Sanitize()
	role, dmlURL := pgtest.DMLRole(t, schema)
	dml, err := store.Open(ctx, dmlURL, store.Config{Schema: schema})
	require.NoError(t, err)
	defer dml.Close()

	// The owner's migration: holds the lock, then records the last one.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('projector.migrate:' || $1, 0))`, schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `DELETE FROM `+s+`.projector_migrations WHERE name = 'migrations/009_log_identity.sql'`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO `+s+`.projector_migrations (projection, name) VALUES ('jobs', 'migrations/009_log_identity.sql')`)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- dml.EnsureCurrent(ctx) }()
	// The DML role's migration waits for the lock.
	require.Eventually(t, func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND wait_event_type = 'Lock'`, role).Scan(&n)
		return n > 0
	}, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	select {
	case err := <-done:
		require.NoError(t, err, "the tables are current once the owner's migration committed")
	case <-time.After(30 * time.Second):
		t.Fatal("EnsureCurrent did not return")
	}
}

// A role granted DML rights before migration 011 added the leases table
// (no default privileges) is told at start what to grant on it: every
// batch reads the table (is a waiter's lease live?), so without SELECT
// each would fail. Granted, it projects, and announces for a lease.
func TestARoleWithoutRightsOnTheLeasesIsToldWhatToGrant(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	owner := pgtest.Store(t)
	leases := pgx.Identifier{owner.Schema(), "projector_wait_leases"}.Sanitize()
	role, dmlURL := pgtest.DMLRole(t, owner.Schema())
	_, err := pgtest.Pool(t).Exec(ctx, `REVOKE ALL ON `+leases+` FROM `+pgx.Identifier{role}.Sanitize())
	require.NoError(t, err)
	dml, err := store.Open(ctx, dmlURL, store.Config{Schema: owner.Schema()})
	require.NoError(t, err)
	defer dml.Close()

	var perr *store.PrivilegeError
	require.ErrorAs(t, dml.EnsureCurrent(ctx), &perr)
	require.Equal(t, []string{"projector_wait_leases: SELECT, INSERT, UPDATE, DELETE"}, perr.Missing)
	require.Equal(t, []string{"GRANT SELECT, INSERT, UPDATE, DELETE ON " + leases + " TO " + pgx.Identifier{role}.Sanitize() + ";"}, perr.Grants)

	_, err = pgtest.Pool(t).Exec(ctx, perr.Grants[0])
	require.NoError(t, err)
	require.NoError(t, dml.EnsureCurrent(ctx))
	l, err := owner.Listen(ctx)
	require.NoError(t, err)
	defer l.Close(context.Background())
	require.NoError(t, dml.HoldWaitLease(ctx, "dml", time.Minute))
	c, err := dml.Claim(ctx, "t", 0, "dml")
	require.NoError(t, err)
	_, err = dml.Apply(ctx, &store.Batch{Topic: "t", Partition: 0, Epoch: c.Epoch, NextOffset: 1,
		Snapshots: []store.Write{{JobID: "x", Version: 1, State: json.RawMessage(`{}`)}}})
	require.NoError(t, err)
	_, err = l.Next(ctx)
	require.NoError(t, err, "the batch is announced for the lease")
}

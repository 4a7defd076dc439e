package store_test

import (
	"context"
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

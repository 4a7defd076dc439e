package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// TestStatusReadOnly: status on a schema or table that does not exist
// exits 1 saying so and creates nothing; on a real projection it runs in
// read-only transactions, so it needs no DDL rights and migrates nothing.
func TestStatusReadOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schemaExists := func(name string) bool {
		var ok bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, name).Scan(&ok))
		return ok
	}

	missing := "no_such_schema_" + strings.ToLower(strings.ReplaceAll(time.Now().Format("150405.000000"), ".", ""))
	res := runBin(t, 30*time.Second, dbEnv(), "status", "--schema", missing)
	require.Equal(t, exitFailure, res.code, "%s", res)
	require.Contains(t, res.stderr, "no projection "+missing+".jobs")
	require.Contains(t, res.stderr, "does not exist")
	require.False(t, schemaExists(missing), "status created the schema it was asked about")

	schema := pgtest.Schema(t)
	res = runBin(t, 30*time.Second, dbEnv(), "status", "--schema", schema, "--table", "orders")
	require.Equal(t, exitFailure, res.code, "%s", res)
	require.Contains(t, res.stderr, "no projection "+schema+".orders")
	var tables int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&tables))
	require.Zero(t, tables, "status created tables")

	// A migrated projection reads fine; the migrations table is untouched.
	st, err := store.New(pool, store.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, st.Migrate(ctx))
	var before int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".projector_migrations`).Scan(&before))
	_, err = pool.Exec(ctx, `DELETE FROM "`+schema+`".projector_migrations WHERE name = (SELECT max(name) FROM "`+schema+`".projector_migrations)`)
	require.NoError(t, err)
	res = runBin(t, 30*time.Second, dbEnv(), "status", "--schema", schema)
	require.Equal(t, exitOK, res.code, "%s", res)
	var after int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".projector_migrations`).Scan(&after))
	require.Equal(t, before-1, after, "status ran a migration")
}

// TestStatusEscapesRecordText: a job id, key and error carrying terminal
// escapes and newlines reach the terminal escaped: no control character in
// the output but the layout's own newlines, no forged line.
func TestStatusEscapesRecordText(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	st, err := store.New(pool, store.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, st.Migrate(ctx))
	evil := "job\x1b[2J\nFORGED line\u202e\x07"
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".projector_held (projection, job_id, version, topic, partition, "offset", ops)
		VALUES ('jobs', $1, 3, 't', 0, 7, '[]')`, evil)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".projector_quarantine (projection, topic, partition, "offset", key, value, error)
		VALUES ('jobs', 't', 0, 8, $1, 'x', $2)`, []byte(evil), "bad record: "+evil)
	require.NoError(t, err)

	res := runBin(t, 30*time.Second, dbEnv(), "status", "--schema", schema)
	require.Equal(t, exitOK, res.code, "%s", res)
	for _, r := range res.stdout {
		if r != '\n' && (r < 0x20 || r == 0x7f || r == '\u202e') {
			t.Fatalf("status printed control character %U:\n%s", r, res.stdout)
		}
	}
	for _, line := range strings.Split(res.stdout, "\n") {
		require.False(t, strings.HasPrefix(line, "FORGED"), "a record forged an output line:\n%s", res.stdout)
	}
	require.Contains(t, res.stdout, `job\x1b[2J\nFORGED line\u202e\a`)

	js := runBin(t, 30*time.Second, dbEnv(), "status", "--schema", schema, "--json")
	require.Equal(t, exitOK, js.code, "%s", js)
	require.NotContains(t, js.stdout, "\x1b", "JSON escapes control characters")
}

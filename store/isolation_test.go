package store_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// TestBatchTransactionsPinReadCommitted: on connections whose default
// isolation is SERIALIZABLE, a batch still runs under READ COMMITTED, the
// isolation the fence is argued under. A trigger records the isolation
// each write to the read model ran under.
func TestBatchTransactionsPinReadCommitted(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := store.New(pool, store.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))

	var def string
	require.NoError(t, pool.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&def))
	require.Equal(t, "serializable", def, "the test's connections must default to serializable")

	q := pgx.Identifier{schema}.Sanitize()
	_, err = pool.Exec(ctx, `CREATE TABLE `+q+`.isolation_seen (level text);
		CREATE FUNCTION `+q+`.note_isolation() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO `+q+`.isolation_seen VALUES (current_setting('transaction_isolation')); RETURN NEW; END $$;
		CREATE TRIGGER note_isolation AFTER INSERT OR UPDATE ON `+s.JobsTable()+`
			FOR EACH ROW EXECUTE FUNCTION `+q+`.note_isolation()`)
	require.NoError(t, err)

	c, err := s.Claim(ctx, "t", 0, "me")
	require.NoError(t, err)
	_, err = s.Apply(ctx, &store.Batch{Topic: "t", Epoch: c.Epoch, NextOffset: 1,
		Snapshots: []store.Write{{JobID: "a", Version: 1, State: json.RawMessage(`{}`)}}})
	require.NoError(t, err)
	var seen []string
	rows, err := pool.Query(ctx, `SELECT level FROM `+q+`.isolation_seen`)
	require.NoError(t, err)
	seen, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"read committed"}, seen)
}

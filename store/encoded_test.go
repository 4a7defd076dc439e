package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// The batch's statements encode their parameters into a buffer kept from
// one statement to the next: what PostgreSQL receives is what tx.Query
// would have sent, arrays, scalars and NULL alike, and a statement after a
// larger one sees nothing of it.
func TestEncodedParametersArriveAsTxQuerySendsThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	const q = `SELECT i.id, i.v, i.s::jsonb::text, $4::int, $5::text, $6::text IS NULL
		FROM unnest($1::text[], $2::bigint[], $3::text[]) WITH ORDINALITY AS i(id, v, s, n) ORDER BY i.n`
	type row struct {
		id    string
		v     int64
		s     string
		part  int32
		topic string
		null  bool
	}
	read := func(rows pgx.Rows, err error) []row {
		t.Helper()
		require.NoError(t, err)
		var out []row
		var r row
		_, err = pgx.ForEachRow(rows, []any{&r.id, &r.v, &r.s, &r.part, &r.topic, &r.null}, func() error {
			out = append(out, r)
			return nil
		})
		require.NoError(t, err)
		return out
	}
	big := `{"x":"` + strings.Repeat("é", 40000) + `"}`
	for _, c := range []struct {
		ids    []string
		vers   []int64
		states []string
	}{
		{[]string{"a", "job-β", ""}, []int64{1, -7, 1 << 62}, []string{`{"n":1}`, big, `{}`}},
		{[]string{"z"}, []int64{3}, []string{`{"k":[1,2]}`}}, // after a larger one
		{nil, nil, nil},
	} {
		args := []any{c.ids, c.vers, c.states, int32(5), "job-events", nil}
		want := read(tx.Query(ctx, q, args...))
		got := read(store.QueryEncoded(ctx, tx, q, args...))
		require.Equal(t, want, got)
		require.Len(t, got, len(c.ids))
		for i := range got {
			require.Equal(t, c.ids[i], got[i].id)
			require.Equal(t, c.vers[i], got[i].v)
			require.True(t, got[i].null)
		}
	}
	_, err = store.QueryEncoded(ctx, tx, `SELECT $1::text`, "a", "b")
	require.ErrorContains(t, err, "of 1 parameters given 2")
}

// An empty value first in a new buffer is an empty value, not NULL (the
// encoders tell NULL by a nil result).
func TestAnEmptyFirstParameterIsNotNull(t *testing.T) {
	ctx := context.Background()
	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	store.DrainParamBufs()
	var isNull bool
	var n int
	_, err = pgx.ForEachRow(must(store.QueryEncoded(ctx, tx, `SELECT $1::text IS NULL, cardinality($2::text[])`, "", []string{})), []any{&isNull, &n}, func() error { return nil })
	require.NoError(t, err)
	require.False(t, isNull, "an empty string arrived as NULL")
	require.Zero(t, n)
}

// A statement the server no longer has prepared (DISCARD ALL, a pooler's
// new server connection) fails once, and its connection, whose other
// prepared statements are gone too, is closed so the pool opens another;
// the next attempt goes through.
func TestAStatementTheServerForgotClosesItsConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	const q = `SELECT count(*) FROM unnest($1::text[])`
	count := func(conn *pgxpool.Conn) (int64, error) {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		rows, err := store.QueryEncoded(ctx, tx, q, []string{"a", "b"})
		if err != nil {
			return 0, err
		}
		return pgx.CollectOneRow(rows, pgx.RowTo[int64])
	}
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	n, err := count(conn)
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	_, err = conn.Exec(ctx, `DEALLOCATE ALL`) // the server forgets; pgx does not know
	require.NoError(t, err)
	_, err = count(conn)
	require.ErrorContains(t, err, "26000", "the forgotten statement fails once")
	require.True(t, conn.Conn().IsClosed(), "and its connection is closed")
	conn.Conn().Close(ctx) // whatever the assertion said: never handed to another test
	conn.Release()

	conn, err = pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	n, err = count(conn)
	require.NoError(t, err, "the next attempt goes through")
	require.Equal(t, int64(2), n)
}

// A statement whose result changed type (a column added to the table it
// selects from) fails once with 0A000 and is prepared again on the next
// attempt, on the same connection.
func TestAStatementWhoseResultChangedIsPreparedAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	table := pgx.Identifier{schema, "t"}.Sanitize()
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id int)`)
	require.NoError(t, err)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	q := `SELECT * FROM ` + table + ` WHERE id = ANY($1::int[])`
	read := func() error {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		rows, err := store.QueryEncoded(ctx, tx, q, []int32{1})
		if err != nil {
			return err
		}
		_, err = pgx.CollectRows(rows, pgx.RowToMap)
		return err
	}
	require.NoError(t, read())
	_, err = pool.Exec(ctx, `ALTER TABLE `+table+` ADD COLUMN more text`)
	require.NoError(t, err)
	require.ErrorContains(t, read(), "0A000", "the cached plan's result changed type")
	require.False(t, conn.Conn().IsClosed())
	require.NoError(t, read(), "prepared again on the next attempt")
}

func must(rows pgx.Rows, err error) pgx.Rows {
	if err != nil {
		panic(err)
	}
	return rows
}

package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
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

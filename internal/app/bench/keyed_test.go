package bench

import (
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/event"
	"github.com/projector/projector/internal/app/jobgen"
	"github.com/projector/projector/internal/testkit/pgtest"
)

// TestKeyedCeilingWritesARowPerJobAtItsLastVersion: the keyed ceiling
// leaves one row per job of the stream, at the highest version any of its
// events had, holding that event's body (a delta's ops as they came); a
// job met twice in one batch is one row of it, at its later version.
func TestKeyedCeilingWritesARowPerJobAtItsLastVersion(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	s := jobgen.Generate(jobgen.Config{Seed: 9, Jobs: 120, Partitions: 3, DuplicateRate: 0.2, LateRate: 0.2})
	sp, err := newSpill()
	require.NoError(t, err)
	defer sp.close()
	type last struct {
		version int64
		body    string
	}
	want := map[string]last{}
	perPartition := map[int]int{}
	for _, r := range s.Records {
		ev, err := event.Decode(r.Key, r.Value)
		require.NoError(t, err)
		require.NoError(t, sp.add(r.Partition, ev))
		perPartition[r.Partition]++
		body := string(ev.RawOps)
		if ev.Kind == event.Snapshot {
			body = string(ev.State)
		}
		if l, ok := want[ev.JobID]; !ok || ev.Version > l.version {
			want[ev.JobID] = last{ev.Version, body}
		}
	}
	require.NoError(t, sp.done())
	require.Len(t, perPartition, 3, "the stream has records in every partition")

	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	schema := "keyed_test_" + hex.EncodeToString(rnd[:])
	_, err = pool.Exec(ctx, `CREATE SCHEMA `+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`) })
	tbl, err := table(ctx, pool, schema, "keyed")
	require.NoError(t, err)
	_, err = keyedInto(ctx, pool, tbl, sp, 3, 7)
	require.NoError(t, err)

	rows, err := pool.Query(ctx, `SELECT job_id, version, state::text FROM `+tbl)
	require.NoError(t, err)
	got := map[string]last{}
	for rows.Next() {
		var id, state string
		var v int64
		require.NoError(t, rows.Scan(&id, &v, &state))
		got[id] = last{v, state}
	}
	require.NoError(t, rows.Err())
	require.Len(t, got, len(want), "a row per job")
	for id, w := range want {
		g := got[id]
		require.Equal(t, w.version, g.version, "job %s", id)
		require.JSONEq(t, w.body, g.body, "job %s", id)
	}

	// A job met twice in a batch is one row of it, at its later version,
	// whatever order the two came in.
	b := &keyedBatch{at: map[string]int{}}
	b.add("a", 1, `{"x":1}`)
	b.add("b", 1, `{}`)
	b.add("a", 3, `{"x":3}`)
	b.add("a", 2, `{"x":2}`)
	require.Equal(t, 4, b.n)
	require.Equal(t, []string{"a", "b"}, b.ids)
	require.Equal(t, []int64{3, 1}, b.vers)
	require.Equal(t, []string{`{"x":3}`, `{}`}, b.states)
}

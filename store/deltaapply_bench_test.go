package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/internal/testkit/pgtest"
)

// BenchmarkSpreadDeltas measures the two ways a batch of deltas for jobs
// not in memory can reach their rows, the spread shape's common case
// (each delta the next version of a job the projector has not seen for a
// while):
//
//   - read, apply, write (what the projector does): one read of the
//     batch's rows, the ops applied in Go by delta.Apply, and the
//     conditional update of [store.Store.Apply], the states crossing the
//     wire twice;
//   - applied in SQL: one conditional update that ships only the ops and
//     has PostgreSQL apply them, by a PL/pgSQL loop over the ops
//     (jsonb_set, #-, numeric arithmetic), or, the cheapest SQL can be, by
//     an expression written for this stream's two ops.
//
// Each batch is applied to three copies of one table, one per way, in
// turn (the order rotating), so the machine's load falls on all alike; each
// reports its median time per batch. At the end the three tables must
// hold the same rows, or the benchmark fails: the ways are compared only
// where they agree.
//
//	go test -run XXX -bench SpreadDeltas -benchtime 20x ./store/
func BenchmarkSpreadDeltas(b *testing.B) {
	for _, n := range []int{500, 5000} {
		b.Run(fmt.Sprintf("rows=200000/batch=%d", n), func(b *testing.B) { benchSpreadDeltas(b, 200_000, n) })
	}
}

func benchSpreadDeltas(b *testing.B, rows, n int) {
	ctx := context.Background()
	s := pgtest.Store(b)
	pool := s.Pool()
	inGo := s.JobsTable()
	schema := strings.Split(inGo, ".")[0]
	inSQL, inline := schema+".jobs_sql", schema+".jobs_inline"
	setup := []string{
		`INSERT INTO ` + inGo + ` (job_id, version, state, updated_at, source_topic, source_partition, source_offset)
			SELECT 'job-' || g, 1, jsonb_build_object('status', 'running', 'job_type', 'crawl', 'processed_articles', g % 1000,
				'created_at', '2026-01-01T00:00:00Z', 'progress', jsonb_build_object('stage', 'stage-1')), now(), 't', 0, g
			FROM generate_series(1, ` + fmt.Sprint(rows) + `) AS g`,
		// LIKE copies no storage parameters: the jobs table's fillfactor
		// (migration 007) is given again, so all three update alike.
		`CREATE TABLE ` + inSQL + ` (LIKE ` + inGo + ` INCLUDING ALL) WITH (fillfactor = 70)`,
		`CREATE TABLE ` + inline + ` (LIKE ` + inGo + ` INCLUDING ALL) WITH (fillfactor = 70)`,
		`INSERT INTO ` + inSQL + ` SELECT * FROM ` + inGo,
		`INSERT INTO ` + inline + ` SELECT * FROM ` + inGo,
		`VACUUM ANALYZE ` + inGo, `VACUUM ANALYZE ` + inSQL, `VACUUM ANALYZE ` + inline,
		// The ops of delta.Apply, for the paths this stream uses: no "~"
		// escapes, and parents that exist (jsonb_set creates no missing
		// parent, where delta.Apply does).
		`CREATE FUNCTION ` + schema + `.apply_ops(state jsonb, ops jsonb) RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $f$
		DECLARE op jsonb; p text[];
		BEGIN
			FOR op IN SELECT * FROM jsonb_array_elements(ops) LOOP
				p := string_to_array(substr(op->>'path', 2), '/');
				CASE op->>'op'
				WHEN 'set' THEN state := jsonb_set(state, p, op->'value', true);
				WHEN 'remove' THEN state := state #- p;
				WHEN 'increment' THEN state := jsonb_set(state, p, to_jsonb(coalesce((state #>> p)::numeric, 0) + (op->>'by')::numeric), true);
				END CASE;
			END LOOP;
			RETURN state;
		END $f$`,
	}
	for _, q := range setup {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	version := make([]int64, rows+1)
	for i := range version {
		version[i] = 1
	}
	type batch struct {
		ids    []string
		vers   []int64
		ops    []string
		parsed [][]delta.Op // as the projector holds them, parsed when decoded
		by     []int64
		stages []string
	}
	next := func() batch {
		var bt batch
		seen := map[int]bool{}
		for len(bt.ids) < n {
			j := 1 + rng.IntN(rows)
			if seen[j] {
				continue
			}
			seen[j] = true
			version[j]++
			by, stage := int64(1+rng.IntN(20)), fmt.Sprintf("stage-%d", version[j])
			bt.ids = append(bt.ids, fmt.Sprintf("job-%d", j))
			bt.vers = append(bt.vers, version[j])
			bt.by = append(bt.by, by)
			bt.stages = append(bt.stages, stage)
			bt.ops = append(bt.ops, fmt.Sprintf(`[{"op":"increment","path":"/processed_articles","by":%d},{"op":"set","path":"/progress/stage","value":%q}]`, by, stage))
			ops, err := delta.ParseOps(json.RawMessage(bt.ops[len(bt.ops)-1]))
			if err != nil {
				b.Fatal(err)
			}
			bt.parsed = append(bt.parsed, ops)
		}
		return bt
	}
	updated := func(want int) func(pgconn.CommandTag, error) error {
		return func(tag pgconn.CommandTag, err error) error {
			if err == nil && int(tag.RowsAffected()) != want {
				err = fmt.Errorf("%d rows updated, want %d", tag.RowsAffected(), want)
			}
			return err
		}
	}
	viaGo := func(tx pgx.Tx, bt batch) error {
		rows, err := tx.Query(ctx, `SELECT job_id, version, state::text FROM `+inGo+` WHERE job_id = ANY($1::text[])`, bt.ids)
		if err != nil {
			return err
		}
		stored := make(map[string]string, len(bt.ids))
		var id, state string
		var v int64
		if _, err := pgx.ForEachRow(rows, []any{&id, &v, &state}, func() error { stored[id] = state; return nil }); err != nil {
			return err
		}
		states, expect := make([]string, len(bt.ids)), make([]int64, len(bt.ids))
		for i, id := range bt.ids {
			out, err := delta.ApplyJSON(json.RawMessage(stored[id]), bt.parsed[i])
			if err != nil {
				return err
			}
			states[i], expect[i] = string(out), bt.vers[i]-1
		}
		return updated(len(bt.ids))(tx.Exec(ctx, `UPDATE `+inGo+` AS t SET version = i.version, state = i.state::jsonb, updated_at = now(),
				last_ops = i.ops::jsonb
			FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[]) AS i(job_id, version, state, expect, ops)
			WHERE t.job_id = i.job_id AND t.version = i.expect`, bt.ids, bt.vers, states, expect, bt.ops))
	}
	viaSQL := func(tx pgx.Tx, bt batch) error {
		return updated(len(bt.ids))(tx.Exec(ctx, `UPDATE `+inSQL+` AS t SET version = i.version, state = `+schema+`.apply_ops(t.state, i.ops::jsonb),
				updated_at = now(), last_ops = i.ops::jsonb
			FROM unnest($1::text[], $2::bigint[], $3::text[]) AS i(job_id, version, ops)
			WHERE t.job_id = i.job_id AND t.version = i.version - 1`, bt.ids, bt.vers, bt.ops))
	}
	viaInline := func(tx pgx.Tx, bt batch) error {
		return updated(len(bt.ids))(tx.Exec(ctx, `UPDATE `+inline+` AS t SET version = i.version,
				state = jsonb_set(jsonb_set(t.state, '{processed_articles}', to_jsonb(coalesce((t.state->>'processed_articles')::numeric, 0) + i.by)),
					'{progress,stage}', to_jsonb(i.stage)),
				updated_at = now(), last_ops = i.ops::jsonb
			FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[]) AS i(job_id, version, ops, by, stage)
			WHERE t.job_id = i.job_id AND t.version = i.version - 1`, bt.ids, bt.vers, bt.ops, bt.by, bt.stages))
	}
	ways := []func(pgx.Tx, batch) error{viaGo, viaSQL, viaInline}
	times := make([][]time.Duration, len(ways))
	round := func(k int, timed bool) {
		bt := next()
		for r := range ways {
			w := (k + r) % len(ways)
			start := time.Now()
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ways[w](tx, bt) }); err != nil {
				b.Fatal(err)
			}
			if timed {
				times[w] = append(times[w], time.Since(start))
			}
		}
	}
	for k := range 3 {
		round(k, false)
	}
	b.ResetTimer()
	for k := 0; k < b.N; k++ {
		round(k, true)
	}
	b.StopTimer()
	for _, other := range []string{inSQL, inline} {
		var differ int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+inGo+` AS a FULL JOIN `+other+` AS o USING (job_id)
			WHERE a.version IS DISTINCT FROM o.version OR a.state IS DISTINCT FROM o.state`).Scan(&differ); err != nil {
			b.Fatal(err)
		}
		if differ != 0 {
			b.Fatalf("%s: %d rows differ from the rows the ops applied in Go made", other, differ)
		}
	}
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	b.ReportMetric(median(times[0]), "go-ms/batch")
	b.ReportMetric(median(times[1]), "plpgsql-ms/batch")
	b.ReportMetric(median(times[2]), "inline-ms/batch")
	b.ReportMetric(median(times[1])/median(times[0]), "plpgsql/go")
	b.ReportMetric(median(times[2])/median(times[0]), "inline/go")
}

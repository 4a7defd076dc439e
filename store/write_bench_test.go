package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projector/projector/internal/testkit/pgtest"
)

// BenchmarkSnapshotWrite compares two ways of sending a batch of snapshots
// to PostgreSQL in the batch transaction: the arrays of unnest (what
// [store.Store.Apply] does) and a binary COPY into a temporary staging
// table followed by the same set-based merge. Both run the same merge
// (tombstone check, conditional upsert, the versions before returned),
// after the same fence, alternately, so the machine's load falls on both
// alike; each reports its median time per batch.
//
//	go test -run XXX -bench SnapshotWrite -benchtime 40x ./store/
func BenchmarkSnapshotWrite(b *testing.B) {
	for _, n := range []int{500, 5000} {
		for _, stateBytes := range []int{200, 2000} {
			b.Run(fmt.Sprintf("rows=%d/state=%dB", n, stateBytes), func(b *testing.B) { benchSnapshotWrite(b, n, stateBytes) })
		}
	}
}

func benchSnapshotWrite(b *testing.B, n, stateBytes int) {
	ctx := context.Background()
	s := pgtest.Store(b)
	pool := s.Pool()
	schema := strings.Split(s.JobsTable(), ".")[0]
	tombs := schema + ".projector_tombstones"
	if _, err := s.Claim(ctx, "t", 0, "bench"); err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const jobs = 50_000
	version := make([]int64, jobs)
	pad := strings.Repeat("x", max(stateBytes-60, 0))
	batch := func() (ids []string, vers []int64, states []string, offs []int64, evs []string) {
		seen := map[int]bool{}
		for len(ids) < n {
			j := rng.IntN(jobs)
			if seen[j] {
				continue
			}
			seen[j] = true
			version[j]++
			ids = append(ids, fmt.Sprintf("job-%05d", j))
			vers = append(vers, version[j])
			states = append(states, fmt.Sprintf(`{"status":"running","processed":%d,"payload":"%s"}`, version[j], pad))
			offs = append(offs, int64(len(ids)))
			evs = append(evs, fmt.Sprintf("evt-%d-%d", j, version[j]))
		}
		return
	}
	merge := func(source, ids string) string {
		return `WITH old AS (
				SELECT job_id, version FROM ` + s.JobsTable() + ` WHERE job_id ` + ids + `
			), tomb AS (
				SELECT job_id, version FROM ` + tombs + ` WHERE projection = 'jobs' AND job_id ` + ids + `
			), ins AS (
				INSERT INTO ` + s.JobsTable() + ` AS t
				(job_id, version, state, updated_at, source_topic, source_partition, source_offset, event_id)
				SELECT i.job_id, i.version, i.state::jsonb, now(), 't', 0, i.off, NULLIF(i.event_id, '')
				FROM ` + source + ` AS i(job_id, version, state, off, event_id)
				WHERE NOT EXISTS (SELECT 1 FROM tomb WHERE tomb.job_id = i.job_id AND tomb.version >= i.version)
				ON CONFLICT (job_id) DO UPDATE SET
					version = excluded.version, state = excluded.state, updated_at = excluded.updated_at,
					source_topic = excluded.source_topic, source_partition = excluded.source_partition,
					source_offset = excluded.source_offset, event_id = excluded.event_id, last_ops = NULL
				WHERE t.version < excluded.version
				RETURNING t.job_id, t.version
			)
			SELECT ins.job_id, coalesce(old.version, tomb.version, 0) FROM ins
			LEFT JOIN old ON old.job_id = ins.job_id LEFT JOIN tomb ON tomb.job_id = ins.job_id`
	}
	unnestSrc := `unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[])`
	fence := `UPDATE ` + schema + `.projector_partitions SET next_offset = next_offset + 1 WHERE projection = 'jobs' AND topic = 't' AND partition = 0`
	count := func(rows pgx.Rows, err error) error {
		if err != nil {
			return err
		}
		var id string
		var before int64
		_, err = pgx.ForEachRow(rows, []any{&id, &before}, func() error { return nil })
		return err
	}
	viaUnnest := func(tx pgx.Tx) error {
		ids, vers, states, offs, evs := batch()
		return count(tx.Query(ctx, merge(unnestSrc, `= ANY($1::text[])`), ids, vers, states, offs, evs))
	}
	viaCopy := func(tx pgx.Tx) error {
		ids, vers, states, offs, evs := batch()
		if _, err := tx.Exec(ctx, `CREATE TEMP TABLE IF NOT EXISTS projector_stage
			(job_id text, version bigint, state text, off bigint, event_id text) ON COMMIT DELETE ROWS`); err != nil {
			return err
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"projector_stage"}, []string{"job_id", "version", "state", "off", "event_id"},
			pgx.CopyFromSlice(len(ids), func(i int) ([]any, error) {
				return []any{ids[i], vers[i], states[i], offs[i], evs[i]}, nil
			})); err != nil {
			return err
		}
		return count(tx.Query(ctx, merge("projector_stage", `IN (SELECT job_id FROM projector_stage)`)))
	}
	var tUnnest, tCopy []time.Duration
	run := func(f func(pgx.Tx) error) time.Duration {
		start := time.Now()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, fence); err != nil {
				return err
			}
			return f(tx)
		})
		if err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	// Warm both (the table grows to its working size, the temp table exists).
	for range 3 {
		run(viaUnnest)
		run(viaCopy)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tUnnest = append(tUnnest, run(viaUnnest))
		tCopy = append(tCopy, run(viaCopy))
	}
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	b.ReportMetric(median(tUnnest), "unnest-ms/batch")
	b.ReportMetric(median(tCopy), "copy-ms/batch")
	b.ReportMetric(median(tCopy)/median(tUnnest), "copy/unnest")
}

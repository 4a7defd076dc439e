package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector/projector/store"
)

// SwapConfig shapes a measurement of a rebuild's swap.
type SwapConfig struct {
	DatabaseURL string
	// Rows in the live table and in the shadow.
	Rows int
	// DifferPercent of the shadow's rows differ from the live ones.
	DifferPercent int
	KeepOld       bool
	// Readers look up random jobs through a view over the table, without
	// pause, before, during and after the swap.
	Readers int
	Out     io.Writer
}

// SwapResult is what one swap measurement saw.
type SwapResult struct {
	Swap               time.Duration
	Swapped            store.SwapResult
	Before, During     []time.Duration // reader latencies, sorted
	ReadErrors         int64
	LockWaits, Samples int64 // readers seen waiting on a lock, in samples of pg_stat_activity
}

// Swap fills a live table and a shadow with cfg.Rows rows, a view and an
// index over the live one, then times [store.Store.Swap] while readers
// query through the view and a sampler watches for readers waiting on a
// lock. It works in a schema of its own and drops it at the end.
func Swap(ctx context.Context, cfg SwapConfig) (SwapResult, error) {
	var res SwapResult
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return res, fmt.Errorf("bench: connect: %w", err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema := "projector_bench_swap_" + hex.EncodeToString(b)
	defer pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
	live, err := store.New(pool, store.Config{Schema: schema, Table: "jobs"})
	if err != nil {
		return res, err
	}
	if err := live.Migrate(ctx); err != nil {
		return res, err
	}
	shadow, err := live.Shadow()
	if err != nil {
		return res, err
	}
	if err := shadow.Reset(ctx); err != nil {
		return res, err
	}
	if err := shadow.Migrate(ctx); err != nil {
		return res, err
	}
	jobs, sh := pgx.Identifier{schema, "jobs"}.Sanitize(), shadow.JobsTable()
	view := pgx.Identifier{schema, "jobs_api"}.Sanitize()
	start := time.Now()
	for _, sql := range []string{
		`INSERT INTO ` + jobs + ` (job_id, version, state, source_topic, source_partition, source_offset, event_id)
			SELECT 'job-' || i, 5, jsonb_build_object('status', 'completed', 'processed', i, 'owner', 'team-' || (i % 50)),
				'job-events', i % 12, i, 'evt-' || i
			FROM generate_series(1, ` + strconv.Itoa(cfg.Rows) + `) i`,
		`INSERT INTO ` + sh + ` SELECT * FROM ` + jobs,
		`UPDATE ` + sh + ` SET version = 6, state = state || '{"status":"archived"}'
			WHERE (substr(job_id, 5)::bigint % 100) < ` + strconv.Itoa(cfg.DifferPercent),
		`CREATE VIEW ` + view + ` AS SELECT job_id, version, state->>'status' AS status FROM ` + jobs,
		`CREATE INDEX jobs_by_owner ON ` + jobs + ` ((state->>'owner'))`,
		`VACUUM ANALYZE ` + jobs, `VACUUM ANALYZE ` + sh,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return res, fmt.Errorf("bench: swap set-up: %w", err)
		}
	}
	for p := range 12 {
		if _, err := live.Claim(ctx, "job-events", p, "live"); err != nil {
			return res, err
		}
		if _, err := shadow.Claim(ctx, "job-events", p, "rebuild"); err != nil {
			return res, err
		}
	}
	fmt.Fprintf(cfg.Out, "swap: %d rows, %d%% of them differ, set up in %s\n", cfg.Rows, cfg.DifferPercent, time.Since(start).Round(time.Millisecond))

	var swapping, stop atomic.Bool
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range cfg.Readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				id := "job-" + strconv.Itoa(1+mrand.IntN(cfg.Rows))
				t := time.Now()
				var v int64
				var status string
				err := pool.QueryRow(ctx, `SELECT version, status FROM `+view+` WHERE job_id = $1`, id).Scan(&v, &status)
				d := time.Since(t)
				mu.Lock()
				if err != nil {
					res.ReadErrors++
				}
				if swapping.Load() {
					res.During = append(res.During, d)
				} else if res.Swap == 0 {
					res.Before = append(res.Before, d)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for !stop.Load() {
			<-tick.C
			if !swapping.Load() {
				continue
			}
			var n int64
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE '%jobs_api%' AND pid <> pg_backend_pid()`).Scan(&n); err == nil {
				mu.Lock()
				res.Samples++
				res.LockWaits += n
				mu.Unlock()
			}
		}
	}()
	// The readers' latency before the swap is the baseline.
	time.Sleep(2 * time.Second)
	swapping.Store(true)
	t := time.Now()
	swapped, err := live.Swap(ctx, shadow, cfg.KeepOld)
	took := time.Since(t)
	swapping.Store(false)
	mu.Lock()
	res.Swap, res.Swapped = took, swapped
	mu.Unlock()
	stop.Store(true)
	wg.Wait()
	if err != nil {
		return res, err
	}
	slices.Sort(res.Before)
	slices.Sort(res.During)
	fmt.Fprintf(cfg.Out, "swap took %s (writers of the projection wait this long): %d rows updated, %d inserted, %d deleted%s\n",
		res.Swap.Round(time.Millisecond), swapped.Updated, swapped.Inserted, swapped.Deleted, keptNote(swapped))
	fmt.Fprintf(cfg.Out, "readers before the swap: %s\n", latencies(res.Before))
	fmt.Fprintf(cfg.Out, "readers during the swap: %s; %d errors\n", latencies(res.During), res.ReadErrors)
	fmt.Fprintf(cfg.Out, "readers waiting on a lock during the swap: %d in %d samples of pg_stat_activity\n", res.LockWaits, res.Samples)
	return res, nil
}

func keptNote(r store.SwapResult) string {
	if r.OldTable == "" {
		return ""
	}
	return ", old rows kept as " + r.OldTable
}

func latencies(xs []time.Duration) string {
	if len(xs) == 0 {
		return "no reads"
	}
	return fmt.Sprintf("%d reads, p50 %s, p99 %s, max %s", len(xs), xs[len(xs)/2].Round(time.Microsecond),
		xs[len(xs)*99/100].Round(time.Microsecond), xs[len(xs)-1].Round(time.Microsecond))
}

package store_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// TestSwapWritesOnlyTheRowsThatDiffer: the swap compares every column but
// updated_at, NULL against a value included, and writes only the rows
// that differ: a row the rebuild found equal keeps its updated_at. It
// holds whether PostgreSQL compares with parallel workers (the planner
// told that even these small tables repay them) or in one process.
func TestSwapWritesOnlyTheRowsThatDiffer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		params map[string]string
	}{
		{"parallel workers", map[string]string{"min_parallel_table_scan_size": "0", "max_parallel_workers_per_gather": "2"}},
		{"one process", map[string]string{"max_parallel_workers_per_gather": "0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			cfg, err := pgxpool.ParseConfig(pgtest.URL())
			require.NoError(t, err)
			for k, v := range tc.params {
				cfg.ConnConfig.RuntimeParams[k] = v
			}
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			live, err := store.New(pool, store.Config{Schema: pgtest.Schema(t)})
			require.NoError(t, err)
			require.NoError(t, live.Migrate(ctx))
			shadow, err := live.Shadow()
			require.NoError(t, err)
			require.NoError(t, shadow.Reset(ctx))
			require.NoError(t, shadow.Migrate(ctx))

			const cols = `(updated_at, job_id, version, state, source_topic, source_partition, source_offset, event_id, last_ops)`
			// The live rows were written long ago, the shadow's now: a
			// row the swap writes takes the shadow's updated_at.
			old := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			row := func(id string, version int64, state string, partition any, eventID any, lastOps any) []any {
				return []any{id, version, state, "t", partition, int64(7), eventID, lastOps}
			}
			insert := func(table string, at time.Time, rows ...[]any) {
				t.Helper()
				for _, r := range rows {
					_, err := pool.Exec(ctx, `INSERT INTO `+table+` `+cols+` VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`, append([]any{at}, r...)...)
					require.NoError(t, err)
				}
			}
			insert(live.JobsTable(), old,
				row("equal", 3, `{"a":1}`, 0, "e1", `[{"op":"add"}]`),
				row("equal-nulls", 3, `{"a":1}`, nil, nil, nil),
				row("state", 3, `{"a":1}`, 0, "e1", nil),
				row("version", 3, `{"a":1}`, 0, "e1", nil),
				row("null-now-set", 3, `{"a":1}`, nil, "e1", nil),
				row("set-now-null", 3, `{"a":1}`, 0, "e1", `[]`),
				row("gone", 3, `{"a":1}`, 0, "e1", nil),
			)
			insert(shadow.JobsTable(), time.Now(),
				row("equal", 3, `{"a": 1}`, 0, "e1", `[{"op": "add"}]`),
				row("equal-nulls", 3, `{"a":1}`, nil, nil, nil),
				row("state", 3, `{"a":2}`, 0, "e1", nil),
				row("version", 4, `{"a":1}`, 0, "e1", nil),
				row("null-now-set", 3, `{"a":1}`, 1, "e1", nil),
				row("set-now-null", 3, `{"a":1}`, 0, "e1", nil),
				row("added", 1, `{"b":1}`, 0, "e2", nil),
			)

			res, err := live.Swap(ctx, shadow, false)
			require.NoError(t, err)
			require.Equal(t, int64(4), res.Updated, "state, version, null-now-set, set-now-null")
			require.Equal(t, int64(1), res.Inserted, "added")
			require.Equal(t, int64(1), res.Deleted, "gone")

			rows, err := pool.Query(ctx, `SELECT job_id, version, state::text, updated_at = $1, source_partition, last_ops::text FROM `+live.JobsTable()+` ORDER BY job_id`, old)
			require.NoError(t, err)
			type got struct {
				version   int64
				state     string
				untouched bool
				partition *int32
				lastOps   *string
			}
			m := map[string]got{}
			for rows.Next() {
				var id string
				var g got
				require.NoError(t, rows.Scan(&id, &g.version, &g.state, &g.untouched, &g.partition, &g.lastOps))
				m[id] = g
			}
			require.NoError(t, rows.Err())
			require.Len(t, m, 7)
			require.NotContains(t, m, "gone")
			require.True(t, m["equal"].untouched, "an equal row keeps its updated_at")
			require.True(t, m["equal-nulls"].untouched, "NULL equals NULL for the swap")
			for _, id := range []string{"state", "version", "null-now-set", "set-now-null"} {
				require.False(t, m[id].untouched, "%s was written", id)
			}
			require.Equal(t, `{"a": 2}`, m["state"].state)
			require.Equal(t, int64(4), m["version"].version)
			require.NotNil(t, m["null-now-set"].partition)
			require.EqualValues(t, 1, *m["null-now-set"].partition)
			require.Nil(t, m["set-now-null"].lastOps)
			require.Equal(t, `{"b": 1}`, m["added"].state)
		})
	}
}

// TestSwapComparesInParallel: with the swap's own settings, its
// comparison is planned with parallel workers (a Parallel Append of a
// parallel left join and a parallel anti join); a full join would get none
// before PostgreSQL 16. The tables are tiny, so the transaction lets any
// table go parallel, and allows workers whatever the server's default.
func TestSwapComparesInParallel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.Store(t)
	shadow, err := s.Shadow()
	require.NoError(t, err)
	require.NoError(t, shadow.Reset(ctx))
	require.NoError(t, shadow.Migrate(ctx))
	var plan string
	err = pgx.BeginTxFunc(ctx, s.Pool(), pgx.TxOptions{}, func(tx pgx.Tx) error {
		for _, set := range []string{`SET LOCAL min_parallel_table_scan_size = 0`, `SET LOCAL max_parallel_workers_per_gather = 8`} {
			if _, err := tx.Exec(ctx, set); err != nil {
				return err
			}
		}
		if err := store.SwapPlanning(ctx, tx); err != nil {
			return err
		}
		// The comparison's bounds, as it sets them: the statement only
		// reads what they are.
		if _, err := store.CompareForSwap(ctx, tx, `CREATE TEMPORARY TABLE projector_swap_diff ON COMMIT DROP AS SELECT 1`, store.WorkersLackedMemory); err != nil {
			return err
		}
		diff := store.SwapDiff(s.JobsTable(), shadow.JobsTable(), "l.version, l.state", "s.version, s.state")
		rows, err := tx.Query(ctx, `EXPLAIN (COSTS OFF) `+diff[strings.Index(diff, "SELECT"):])
		if err != nil {
			return err
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		plan = strings.Join(lines, "\n")
		return err
	})
	require.NoError(t, err)
	require.Contains(t, plan, "Workers Planned: 2", "at most two workers, whatever the server allows: %s", plan)
	for _, want := range []string{"Gather", "Parallel Append", "Parallel Hash Left Join"} {
		require.Contains(t, plan, want, "%s", plan)
	}
	require.Regexp(t, `Parallel Hash (Right )?Anti Join`, plan)
}

// TestSwapBoundsItsMemory: the comparison plans at most two workers and
// sets work_mem so that a hash stays within 768 MB across its processes,
// whatever hash_mem_multiplier and the workers the server allows; in one
// process it has the whole 768 MB.
func TestSwapBoundsItsMemory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	for _, tc := range []struct {
		serverWorkers int
		multiplier    string
		wantWorkers   int
		wantWorkMem   string
	}{
		{8, "2", 2, "128MB"},
		{1, "2", 1, "192MB"},
		{8, "1", 2, "256MB"},
		{0, "2", 0, "384MB"},
		{2, "1.5", 2, "174762kB"},
	} {
		var workers int
		var workMem string
		err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config('max_parallel_workers_per_gather', $1, true), set_config('hash_mem_multiplier', $2, true)`,
				strconv.Itoa(tc.serverWorkers), tc.multiplier); err != nil {
				return err
			}
			if _, err := store.CompareForSwap(ctx, tx, `CREATE TEMPORARY TABLE projector_swap_diff ON COMMIT DROP AS SELECT 1`, store.WorkersLackedMemory); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT current_setting('max_parallel_workers_per_gather')::int, current_setting('work_mem')`).Scan(&workers, &workMem)
		})
		require.NoError(t, err)
		require.Equal(t, tc.wantWorkers, workers, "%+v", tc)
		require.Equal(t, tc.wantWorkMem, workMem, "%+v", tc)
	}
}

// TestSwapTriesInOneProcessOnlyForSharedMemory: an error of class 53 is
// run again in one process only when it comes from PostgreSQL's dynamic
// shared memory code; temporary files, temp_file_limit and one process's
// memory would fail the same way in one process.
func TestSwapTriesInOneProcessOnlyForSharedMemory(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code, file string
		want       bool
	}{
		{"53100", "dsm_impl.c", true},
		{"53200", "dsm_impl.c", true},
		{"53200", "dsa.c", true},
		{"53100", "buffile.c", false},
		{"53400", "fd.c", false},
		{"53200", "mcxt.c", false},
		{"53200", "lock.c", false},
		{"22012", "dsm_impl.c", false},
	} {
		require.Equal(t, tc.want, store.WorkersLackedMemory(&pgconn.PgError{Code: tc.code, File: tc.file}), "%+v", tc)
	}
}

// TestSwapComparesInOneProcessWhenWorkersLackMemory: where the parallel
// comparison fails for want of the server's shared memory, it runs again
// in one process, and the swap says so; any other error fails the swap.
// The server cannot be made to run out of shared memory from a test, so
// the statement raises an error of that class while parallel workers are
// allowed, and the test of such errors passed in takes that one for one.
func TestSwapComparesInOneProcessWhenWorkersLackMemory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	fn := pgx.Identifier{schema, "no_shm"}.Sanitize()
	_, err := pool.Exec(ctx, `CREATE FUNCTION `+fn+`(code text) RETURNS int LANGUAGE plpgsql AS $$
		BEGIN
			IF current_setting('max_parallel_workers_per_gather')::int > 0 THEN
				RAISE EXCEPTION 'test: could not resize shared memory segment' USING ERRCODE = code;
			END IF;
			RETURN 1;
		END $$`)
	require.NoError(t, err)
	lacked := func(e *pgconn.PgError) bool {
		return strings.HasPrefix(e.Code, "53") && strings.HasPrefix(e.Message, "test: ")
	}
	compare := func(code string) (string, int, int, error) {
		var why string
		var n, workers int
		err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL max_parallel_workers_per_gather = 2`); err != nil {
				return err
			}
			var err error
			if why, err = store.CompareForSwap(ctx, tx, `CREATE TEMPORARY TABLE projector_swap_diff ON COMMIT DROP AS SELECT `+fn+`('`+code+`') AS one`, lacked); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM projector_swap_diff`).Scan(&n); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT current_setting('max_parallel_workers_per_gather')::int`).Scan(&workers)
		})
		return why, n, workers, err
	}
	why, n, workers, err := compare("53100")
	require.NoError(t, err)
	require.Equal(t, "test: could not resize shared memory segment", why)
	require.Equal(t, 1, n, "the comparison ran again and made its table")
	require.Zero(t, workers, "in one process for the rest of the swap")

	_, _, _, err = compare("22012")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22012", pgErr.Code, "another error is the swap's, not tried again")
}

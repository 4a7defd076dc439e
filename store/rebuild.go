package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ShadowPrefix names a projection's rebuild table: jobs →
// projector_rebuild_jobs. It lies inside the projector_ prefix that users
// may not name a table with, so a rebuild never touches another projection.
const ShadowPrefix = "projector_rebuild_"

// ShadowName is the name of the rebuild table of the projection table.
func ShadowName(table string) string { return ShadowPrefix + table }

// Shadow returns the store of s's rebuild table in the same schema, on the
// same pool, with the same bounds on its transactions.
func (s *Store) Shadow() (*Store, error) {
	name := ShadowName(s.projection)
	if len(name) > maxIdent {
		return nil, fmt.Errorf("store: table %q is too long for its rebuild table %q (PostgreSQL names have at most %d bytes)", s.projection, name, maxIdent)
	}
	return newStore(s.pool, Config{Schema: s.schema, Table: name, ClaimLockTimeout: s.claimLockTimeout,
		IdleInTransactionTimeout: s.idleTimeout, StatementTimeout: s.statementTimeout}), nil
}

// maxIdent is PostgreSQL's longest identifier, in bytes.
const maxIdent = 63

// Reset drops a rebuild's shadow table and forgets everything stored
// under its projection name (positions, held deltas, quarantine, gap log,
// migrations, and any other of the projector's tables keyed by
// projection, but its identity): a rebuild that starts over starts from
// nothing, as the same projection, so members a killed rebuild left in
// its consumer group are its own, not another projection's. It refuses
// any store but a shadow, so it can never wipe a projection.
func (s *Store) Reset(ctx context.Context) error {
	if !strings.HasPrefix(s.projection, ShadowPrefix) {
		return fmt.Errorf("store: reset %s: only a rebuild's shadow (%s<table>) may be reset", s.projection, ShadowPrefix)
	}
	return pgx.BeginTxFunc(ctx, s.pool, readCommitted, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, migrateLock, s.schema); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DROP TABLE IF EXISTS `+s.jobs); err != nil {
			return fmt.Errorf("store: reset %s: %w", s.projection, err)
		}
		rows, err := tx.Query(ctx, `SELECT c.table_name::text FROM information_schema.columns c
			JOIN information_schema.tables t USING (table_schema, table_name)
			WHERE c.table_schema = $1 AND c.column_name = 'projection' AND t.table_type = 'BASE TABLE'
				AND c.table_name LIKE 'projector\_%' AND c.table_name <> 'projector_identity' ORDER BY 1`, s.schema)
		if err != nil {
			return fmt.Errorf("store: reset %s: %w", s.projection, err)
		}
		tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("store: reset %s: %w", s.projection, err)
		}
		for _, t := range tables {
			if _, err := tx.Exec(ctx, `DELETE FROM `+pgx.Identifier{s.schema, t}.Sanitize()+` WHERE projection = $1`, s.projection); err != nil {
				return fmt.Errorf("store: reset %s: %s: %w", s.projection, t, err)
			}
		}
		return nil
	})
}

// CopyChecks puts on the shadow the CHECK constraints users added to the
// live table, so the replay quarantines the records that break them, as
// `projector run` does, instead of the swap failing at the end. A check on
// a column the shadow does not have is left out (the swap never writes
// such columns). It returns the names of the checks the shadow has from
// the live table.
func (s *Store) CopyChecks(ctx context.Context, shadow *Store) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT c.conname::text, pg_get_constraintdef(c.oid)
		FROM pg_constraint c WHERE c.conrelid = to_regclass($1) AND c.contype = 'c'
			AND NOT EXISTS (SELECT 1 FROM pg_constraint m WHERE m.conrelid = to_regclass($2) AND m.contype = 'c'
				AND pg_get_constraintdef(m.oid) = pg_get_constraintdef(c.oid) AND m.conname <> c.conname)
			AND NOT EXISTS (SELECT 1 FROM unnest(c.conkey) k JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k
				WHERE NOT EXISTS (SELECT 1 FROM pg_attribute b WHERE b.attrelid = to_regclass($2) AND b.attname = a.attname AND NOT b.attisdropped))
		ORDER BY 1`, s.jobs, shadow.jobs)
	if err != nil {
		return nil, fmt.Errorf("store: checks of %s: %w", s.projection, err)
	}
	type check struct{ name, def string }
	checks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (check, error) {
		var c check
		return c, r.Scan(&c.name, &c.def)
	})
	if err != nil {
		return nil, fmt.Errorf("store: checks of %s: %w", s.projection, err)
	}
	var names []string
	for _, c := range checks {
		var has bool
		if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = to_regclass($1) AND conname = $2)`,
			shadow.jobs, c.name).Scan(&has); err != nil {
			return nil, fmt.Errorf("store: checks of %s: %w", shadow.projection, err)
		}
		if !has {
			if _, err := s.pool.Exec(ctx, `ALTER TABLE `+shadow.jobs+` ADD CONSTRAINT `+pgx.Identifier{c.name}.Sanitize()+` `+c.def); err != nil {
				return nil, fmt.Errorf("store: check %s of %s on the shadow %s (rows it already holds may break it: start the rebuild over): %w", c.name, s.projection, shadow.projection, err)
			}
		}
		names = append(names, c.name)
	}
	return names, nil
}

// Progress is what a shadow holds of an earlier rebuild that did not swap.
type Progress struct {
	// TableExists says the shadow table is there.
	TableExists bool
	// Positions are the stored next offsets of topic's partitions that
	// were read from.
	Positions map[int]int64
	// OtherTopics are topics other than the one asked about that the
	// shadow has positions for.
	OtherTopics []string
}

// Read is how many records of the log the shadow has read: the sum of its
// stored positions.
func (p Progress) Read() int64 {
	var n int64
	for _, v := range p.Positions {
		n += v
	}
	return n
}

// Progress reads what the shadow s holds of topic from an earlier rebuild.
func (s *Store) Progress(ctx context.Context, topic string) (Progress, error) {
	p := Progress{Positions: map[int]int64{}}
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.jobs).Scan(&p.TableExists); err != nil {
		return p, fmt.Errorf("store: progress of %s: %w", s.projection, err)
	}
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.partitions).Scan(&exists); err != nil || !exists {
		return p, err
	}
	rows, err := s.pool.Query(ctx, `SELECT topic, partition, next_offset FROM `+s.partitions+`
		WHERE projection = $1 ORDER BY topic, partition`, s.projection)
	if err != nil {
		return p, fmt.Errorf("store: progress of %s: %w", s.projection, err)
	}
	defer rows.Close()
	for rows.Next() {
		var t string
		var part int
		var next int64
		if err := rows.Scan(&t, &part, &next); err != nil {
			return p, fmt.Errorf("store: progress of %s: %w", s.projection, err)
		}
		switch {
		case t != topic:
			if !slices.Contains(p.OtherTopics, t) {
				p.OtherTopics = append(p.OtherTopics, t)
			}
		case next >= 0:
			p.Positions[part] = next
		}
	}
	return p, rows.Err()
}

// column is one column of a table as the catalog describes it.
type column struct {
	name, typ           string
	notNull, hasDefault bool
	generated           bool
}

func tableColumns(ctx context.Context, q querier, table string) ([]column, error) {
	rows, err := q.Query(ctx, `SELECT attname, format_type(atttypid, atttypmod), attnotnull, atthasdef,
		attgenerated <> '' OR attidentity <> ''
		FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, table)
	if err != nil {
		return nil, fmt.Errorf("store: columns of %s: %w", table, err)
	}
	defer rows.Close()
	var out []column
	for rows.Next() {
		var c column
		if err := rows.Scan(&c.name, &c.typ, &c.notNull, &c.hasDefault, &c.generated); err != nil {
			return nil, fmt.Errorf("store: columns of %s: %w", table, err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// RebuildRefusedError lists what of the live table a rebuild could not keep
// or could not write through; nothing was changed.
type RebuildRefusedError struct {
	Table    string
	Problems []string
}

func (e *RebuildRefusedError) Error() string {
	return fmt.Sprintf("store: %s has what a rebuild cannot keep: %s", e.Table, strings.Join(e.Problems, "; "))
}

// CheckRebuild reports, as a *[RebuildRefusedError], what attached to the
// live table would keep a rebuild's swap from writing the rebuilt rows into
// it: a swap writes the live table's rows in place, so views, grants,
// policies, indexes, triggers, comments and columns users added stay, but
// rules would rewrite its writes, a column users added that is NOT NULL
// without a default refuses new rows, and forced row-level security would
// hide rows from it. It changes nothing.
func (s *Store) CheckRebuild(ctx context.Context) error {
	want, err := s.projectorColumns(ctx)
	if err != nil {
		return err
	}
	have, err := tableColumns(ctx, s.pool, s.jobs)
	if err != nil {
		return err
	}
	var problems []string
	byName := map[string]column{}
	for _, c := range have {
		byName[c.name] = c
	}
	ours := map[string]bool{}
	for _, w := range want {
		ours[w.name] = true
		switch h, ok := byName[w.name]; {
		case !ok:
			problems = append(problems, fmt.Sprintf("column %s is missing (the projection writes it)", w.name))
		case h.typ != w.typ:
			problems = append(problems, fmt.Sprintf("column %s is %s (the projection writes %s)", w.name, h.typ, w.typ))
		case h.generated:
			problems = append(problems, fmt.Sprintf("column %s is generated (the projection writes it)", w.name))
		}
	}
	for _, h := range have {
		if !ours[h.name] && h.notNull && !h.hasDefault && !h.generated {
			problems = append(problems, fmt.Sprintf("column %s is NOT NULL without a default, so the jobs a rebuild adds could not be written (give it a default or drop NOT NULL)", h.name))
		}
	}
	var kind string
	var rls, forced, owner, bypass bool
	var role string
	err = s.pool.QueryRow(ctx, `SELECT c.relkind::text, c.relrowsecurity, c.relforcerowsecurity,
		pg_has_role(c.relowner, 'USAGE'), r.rolsuper OR r.rolbypassrls, current_user
		FROM pg_class c, pg_roles r WHERE c.oid = to_regclass($1) AND r.rolname = current_user`, s.jobs).
		Scan(&kind, &rls, &forced, &owner, &bypass, &role)
	if err != nil {
		return fmt.Errorf("store: check %s for a rebuild: %w", s.jobs, err)
	}
	if kind != "r" && kind != "p" {
		problems = append(problems, fmt.Sprintf("it is not a table (relkind %s)", kind))
	}
	if rls && !bypass && (!owner || forced) {
		problems = append(problems, fmt.Sprintf("row-level security applies to %s, the role the rebuild connects as, so the swap could not see every row (connect as a role with BYPASSRLS, or ALTER TABLE ... NO FORCE ROW LEVEL SECURITY and connect as the owner)", role))
	}
	rows, err := s.pool.Query(ctx, `SELECT rulename FROM pg_rules WHERE schemaname = $1 AND tablename = $2 ORDER BY rulename`, s.schema, s.projection)
	if err != nil {
		return fmt.Errorf("store: check %s for a rebuild: %w", s.jobs, err)
	}
	rules, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("store: check %s for a rebuild: %w", s.jobs, err)
	}
	for _, r := range rules {
		problems = append(problems, fmt.Sprintf("rule %s would rewrite the swap's writes (drop it, or rebuild by hand)", r))
	}
	if len(problems) > 0 {
		return &RebuildRefusedError{Table: s.schema + "." + s.projection, Problems: problems}
	}
	return nil
}

// projectorColumns are the read-model columns the migrations create, read
// from a throwaway schema migrated inside a transaction that is rolled
// back.
func (s *Store) projectorColumns(ctx context.Context) ([]column, error) {
	tx, err := s.pool.BeginTx(ctx, readCommitted)
	if err != nil {
		return nil, fmt.Errorf("store: read model columns: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	tmp := "projector_check_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := migrateIn(ctx, tx, tmp, "jobs"); err != nil {
		return nil, err
	}
	return tableColumns(ctx, tx, pgx.Identifier{tmp, "jobs"}.Sanitize())
}

// swapDiff is the statement that finds the rows of live that differ from
// shadow's, in the columns liveCols and shadowCols name in the same order
// (each prefixed l. and s.): projector_swap_diff, one row per job id, gone
// where the shadow lacks the job, added where the live table does.
func swapDiff(live, shadow, liveCols, shadowCols string) string {
	return `CREATE TEMPORARY TABLE projector_swap_diff ON COMMIT DROP AS
			SELECT l.job_id, s.job_id IS NULL AS gone, false AS added
			FROM ` + live + ` AS l LEFT JOIN ` + shadow + ` AS s ON s.job_id = l.job_id
			WHERE s.job_id IS NULL OR (` + liveCols + `) IS DISTINCT FROM (` + shadowCols + `)
			UNION ALL
			SELECT s.job_id, false, true FROM ` + shadow + ` AS s
			WHERE NOT EXISTS (SELECT FROM ` + live + ` AS l WHERE l.job_id = s.job_id)`
}

// keptPrefix names the tables --keep-old keeps: projector_old_<table>_<n>.
const keptPrefix = "projector_old_"

// KeptNameFits reports whether the tables a swap keeps of table (with
// keepOld) have names PostgreSQL can hold.
func KeptNameFits(table string) bool { return len(keptPrefix+table+"_99999999") <= maxIdent }

// SwapResult says what a swap did.
type SwapResult struct {
	// OldTable is where the previous read model went, when kept.
	OldTable string
	// Rows the swap deleted, updated and inserted in the live table to make
	// it equal the shadow.
	Deleted, Updated, Inserted int64
	// Reread is how many records live instances had projected past the
	// rebuilt positions: they read them again after the swap.
	Reread int64
	// ComparedInOneProcess, when not empty, says why the comparison of
	// the live rows with the shadow's ran in one process: the server could
	// not give parallel workers their shared memory (PostgreSQL's error).
	ComparedInOneProcess string
}

// Swap makes the shadow's contents the live projection's in one
// transaction. The live table stays the same table: its rows are made equal
// to the shadow's (rows the shadow lacks deleted, rows that differ updated,
// rows it adds inserted; equal rows are not touched), so views, grants,
// row-level security policies, indexes, triggers and comments stay in place
// and readers are never blocked: they read the old rows until the commit
// and the new ones after it. The shadow's positions and held deltas replace
// the live projection's, its quarantine is merged into the live one (one
// row per record, never deleted), the gaps it closed join the live gap log,
// and every partition's epoch moves past
// both, which fences any instance still running on the old model (it
// claims again and continues from the shadow's positions). With keepOld the
// previous rows are first copied into a table inside the reserved prefix.
// The shadow is dropped.
func (s *Store) Swap(ctx context.Context, shadow *Store, keepOld bool) (SwapResult, error) {
	return s.SwapCaughtUp(ctx, shadow, keepOld, nil, nil)
}

// PartitionPosition is a partition's stored next offset.
type PartitionPosition struct {
	Topic     string
	Partition int
	Next      int64
}

// CatchUp is called by [Store.SwapCaughtUp] with the live positions,
// locked: no batch of the live projection moves them until the swap ends.
// It returns once the shadow has read as far and its writers have stopped,
// or once it gave up waiting; an error abandons the swap.
type CatchUp func(ctx context.Context, live []PartitionPosition) error

// LogStarts returns where the logs of topic's partitions begin now: the
// first offset a reader can fetch.
type LogStarts func(ctx context.Context, topic string, partitions []int) (map[int]int64, error)

// swapIdleBound bounds how long the swap's transaction may sit idle while
// catchUp runs (a frozen rebuild must not hold the live partitions for
// ever).
const swapIdleBound = "90s"

// SwapCaughtUp is [Store.Swap] that first lets the shadow read as far as
// the live projection got: it locks the live positions (live batches wait
// from then on), calls catchUp with them, and only then locks the shadow's
// and swaps. The rows handed over are then never older than what live
// instances had projected, and those instances continue from positions
// that match the rows. Where the shadow still lags a live position, the
// records in between are read again by the live instances after the swap
// (SwapResult.Reread); until they are, those jobs read at the rebuilt
// version.
//
// A live partition the shadow never read (added while the rebuild ran, or
// still unclaimed when the catch-up bound ended) has none of its jobs in
// the rebuilt rows: the swap gives it the position where its log begins
// now (logStarts; offset 0 when nil), so the live instances read it all
// again after the swap, whatever their --start, and those records count
// in SwapResult.Reread. Its position is never dropped: a dropped position
// was resolved again by the next claim (under --start latest, to the
// log's end, skipping every record of the partition).
func (s *Store) SwapCaughtUp(ctx context.Context, shadow *Store, keepOld bool, catchUp CatchUp, logStarts LogStarts) (SwapResult, error) {
	for attempt := 1; ; attempt++ {
		res, err := s.swap(ctx, shadow, keepOld, catchUp, logStarts)
		var pgErr *pgconn.PgError
		// A writer outside the partitions' locks (a repair tool) can
		// deadlock with the swap's multi-row statements; the swap is the
		// one to try again.
		if attempt < 3 && errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001") {
			continue
		}
		return res, err
	}
}

// AnalyzeForSwap gathers the planner's statistics of the shadow s, which
// nothing analyzed since the rebuild wrote it (autovacuum may not have got
// to it, or may be off): without them PostgreSQL takes a table of a
// million rows for several and plans the swap's comparison, which hashes
// the shadow's rows, in batches spilled to temporary files. The plan needs
// the rows' number rather than their distributions, and the statistics go
// with the shadow, so the sample is a tenth of the default (3,000 rows).
// Call it before [Store.SwapCaughtUp], which takes the locks live writers
// wait for: it holds none of those. It waits at most 5 s for its own lock
// on the shadow (longer than the deadlock_timeout after which an
// autovacuum of the table gives way). A failure only leaves the estimates
// as they were: what the swap writes does not depend on them.
func (s *Store) AnalyzeForSwap(ctx context.Context) error {
	return pgx.BeginTxFunc(ctx, s.pool, readCommitted, func(tx pgx.Tx) error {
		for _, st := range []string{`SET LOCAL default_statistics_target = 10`, `SET LOCAL lock_timeout = '5s'`, `ANALYZE ` + s.jobs} {
			if _, err := tx.Exec(ctx, st); err != nil {
				return fmt.Errorf("store: analyze %s: %w", s.jobs, err)
			}
		}
		return nil
	})
}

// swapHashBudget bounds the memory, in kB, each hash of the swap's
// comparison may take on the server, across its processes: 768 MB, as
// work_mem 128MB gives with two workers and hash_mem_multiplier 2 (the
// default from PostgreSQL 15; 1 before, so work_mem is 256MB there). A
// million rows of the bench's shape took 535 MB; in 512 MB the planner
// split that hash in 4 batches and the comparison took 11.2 s rather than
// 3.6 (docs/performance.md). Larger tables spill to temporary files in
// batches rather than take more of the server's memory.
const swapHashBudget = 768 << 10

// swapWorkers is the most parallel workers the comparison plans, whatever
// max_parallel_workers_per_gather allows: a parallel hash may take
// work_mem x hash_mem_multiplier for each of its processes, and work_mem
// is set from swapHashBudget for that many.
const swapWorkers = 2

// swapPlanning tells the planner, for the rest of the swap's transaction,
// that parallel workers cost nothing to start and turns JIT off (see swap).
func swapPlanning(ctx context.Context, tx pgx.Tx) error {
	for _, set := range []string{`SET LOCAL parallel_setup_cost = 0`, `SET LOCAL parallel_tuple_cost = 0`, `SET LOCAL jit = off`} {
		if _, err := tx.Exec(ctx, set); err != nil {
			return err
		}
	}
	return nil
}

// swapMemory sets, for the rest of the swap's transaction, at most
// workers parallel workers (fewer where the server allows fewer) and a
// work_mem that keeps each hash of the comparison within swapHashBudget
// across them: budget / (hash_mem_multiplier x (workers + 1)).
func swapMemory(ctx context.Context, tx pgx.Tx, workers int) error {
	_, err := tx.Exec(ctx, `SELECT set_config('max_parallel_workers_per_gather', w::text, true),
			set_config('work_mem', greatest(64, floor($2::float8 / (m * (w + 1)))::int)::text || 'kB', true)
		FROM (SELECT least(current_setting('max_parallel_workers_per_gather')::int, $1::int) AS w,
			coalesce(current_setting('hash_mem_multiplier', true)::float8, 1) AS m) AS s`, workers, swapHashBudget)
	return err
}

// workersLackedMemory reports an error of PostgreSQL's dynamic shared
// memory, which parallel workers share their hash tables through: a
// container's /dev/shm too small for them. Errors of the same class from
// elsewhere (temporary files, temp_file_limit, memory of one process) are
// not: running in one process would not avoid them.
func workersLackedMemory(e *pgconn.PgError) bool {
	if !strings.HasPrefix(e.Code, "53") {
		return false
	}
	switch e.File {
	case "dsm_impl.c", "dsm.c", "dsa.c", "shm_toc.c":
		return true
	}
	return false
}

// compareForSwap runs diff, the statement that creates the swap's table of
// rows that differ, with parallel workers where the server allows, and
// again in one process, with the whole budget, where the workers could not
// get their shared memory; then it returns PostgreSQL's message for that.
// lackedMemory is workersLackedMemory but in a test, which cannot make the
// server run out of shared memory.
func compareForSwap(ctx context.Context, tx pgx.Tx, diff string, lackedMemory func(*pgconn.PgError) bool) (inOneProcess string, err error) {
	if err := swapMemory(ctx, tx, swapWorkers); err != nil {
		return "", err
	}
	if _, err := tx.Exec(ctx, `SAVEPOINT projector_swap_diff`); err != nil {
		return "", err
	}
	if _, err := tx.Exec(ctx, diff); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || !lackedMemory(pgErr) {
			return "", err
		}
		inOneProcess = pgErr.Message
		if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT projector_swap_diff`); err != nil {
			return "", err
		}
		if err := swapMemory(ctx, tx, 0); err != nil {
			return "", err
		}
		if _, err := tx.Exec(ctx, diff); err != nil {
			return "", fmt.Errorf("%w (in one process, after parallel workers lacked shared memory: %s)", err, inOneProcess)
		}
	}
	_, err = tx.Exec(ctx, `RELEASE SAVEPOINT projector_swap_diff`)
	return inOneProcess, err
}

func (s *Store) swap(ctx context.Context, shadow *Store, keepOld bool, catchUp CatchUp, logStarts LogStarts) (SwapResult, error) {
	var res SwapResult
	live, sh := s.projection, shadow.projection
	err := pgx.BeginTxFunc(ctx, s.pool, readCommitted, func(tx pgx.Tx) error {
		exec := func(sql string, args ...any) (int64, error) {
			tag, err := tx.Exec(ctx, sql, args...)
			if err != nil {
				return 0, fmt.Errorf("store: swap %s into %s: %w", sh, live, err)
			}
			return tag.RowsAffected(), nil
		}
		if _, err := exec(migrateLock, s.schema); err != nil {
			return err
		}
		// The swap lock tells the batches and claims that wait for the
		// partition rows below what they wait for (see [Store.swapping]).
		if _, err := exec(`SELECT pg_advisory_xact_lock($1, $2)`, swapLockClass, s.lockClass); err != nil {
			return err
		}
		if _, err := exec(`SET LOCAL application_name = 'projector rebuild swap'`); err != nil {
			return err
		}
		// Forced row-level security must fail the swap, not hide rows from
		// it.
		if _, err := exec(`SET LOCAL row_security = off`); err != nil {
			return err
		}
		// Positions first, in the order a batch takes its locks (position,
		// then rows): this waits for batches and claims in flight, so the
		// epochs read below are final, and never deadlocks with them.
		// The live rows first, then the shadow's: only the swap takes
		// both.
		positions := func(projection string) ([]PartitionPosition, error) {
			rows, err := tx.Query(ctx, `SELECT topic, partition, next_offset FROM `+s.partitions+`
				WHERE projection = $1 ORDER BY topic, partition FOR UPDATE`, projection)
			if err != nil {
				return nil, fmt.Errorf("store: swap %s into %s: lock %s's positions: %w", sh, live, projection, err)
			}
			out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PartitionPosition, error) {
				var p PartitionPosition
				return p, r.Scan(&p.Topic, &p.Partition, &p.Next)
			})
			if err != nil {
				return nil, fmt.Errorf("store: swap %s into %s: lock %s's positions: %w", sh, live, projection, err)
			}
			return out, nil
		}
		livePos, err := positions(live)
		if err != nil {
			return err
		}
		if catchUp != nil {
			if _, err := exec(`SET LOCAL idle_in_transaction_session_timeout = '` + swapIdleBound + `'`); err != nil {
				return err
			}
			if err := catchUp(ctx, livePos); err != nil {
				return fmt.Errorf("store: swap %s into %s: %w", sh, live, err)
			}
		}
		shadowPos, err := positions(sh)
		if err != nil {
			return err
		}
		// Every job stripe of the live projection, exclusive, after the
		// positions as a batch takes them: a write that moves no position
		// (verify --repair, quarantine replay) waits for the swap and
		// applies to the rebuilt model, never between the swap's writes of
		// rows and of tombstones. Those writers take no position lock, so
		// this never deadlocks with them; the shadow's catch-up above uses
		// the shadow's own stripes.
		if _, err := exec(`SELECT pg_advisory_xact_lock($1, s) FROM generate_series(0, $2::int - 1) AS s`, s.lockClass, lockStripes); err != nil {
			return err
		}
		unread, err := unreadStarts(ctx, livePos, shadowPos, logStarts)
		if err != nil {
			return fmt.Errorf("store: swap %s into %s: %w", sh, live, err)
		}
		rebuilt := map[[2]any]int64{}
		for _, p := range shadowPos {
			rebuilt[[2]any{p.Topic, p.Partition}] = p.Next
		}
		for _, p := range unread {
			rebuilt[[2]any{p.Topic, p.Partition}] = p.Next
		}
		for _, p := range livePos {
			if next := max(rebuilt[[2]any{p.Topic, p.Partition}], 0); p.Next > next {
				res.Reread += p.Next - next
			}
		}
		// The partitions the shadow never read start at their log's start
		// in the rebuilt model; their rows get the shadow's name, so the
		// statements below move their epochs past the live ones and make
		// them live like the others.
		for _, p := range unread {
			if _, err := exec(`INSERT INTO `+s.partitions+` AS t (projection, topic, partition, next_offset, owner)
				VALUES ($1, $2, $3, $4, 'rebuild')
				ON CONFLICT (projection, topic, partition) DO UPDATE SET next_offset = excluded.next_offset
				WHERE t.next_offset < 0`, sh, p.Topic, p.Partition, p.Next); err != nil {
				return err
			}
		}
		if keepOld {
			kept, err := s.keptName(ctx, tx)
			if err != nil {
				return err
			}
			keptTable := pgx.Identifier{s.schema, kept}.Sanitize()
			if _, err := exec(`CREATE TABLE ` + keptTable + ` AS TABLE ` + s.jobs); err != nil {
				return err
			}
			comment := fmt.Sprintf("the read model %s.%s as it was before the rebuild swapped at %s", s.schema, live, time.Now().UTC().Format(time.RFC3339))
			if _, err := exec(`COMMENT ON TABLE ` + keptTable + ` IS ` + quoteLiteral(comment)); err != nil {
				return err
			}
			res.OldTable = s.schema + "." + kept
		}
		cols, err := tableColumns(ctx, tx, shadow.jobs)
		if err != nil {
			return err
		}
		var names, compared, set []string
		for _, c := range cols {
			if c.generated {
				continue
			}
			q := pgx.Identifier{c.name}.Sanitize()
			names = append(names, q)
			if c.name != "job_id" {
				set = append(set, q+" = s."+q)
			}
			// updated_at says when the row last changed: a row the rebuild
			// finds equal keeps it.
			if c.name != "updated_at" {
				compared = append(compared, q)
			}
		}
		list := strings.Join(names, ", ")
		prefixed := func(alias string, cs []string) string {
			out := make([]string, len(cs))
			for i, c := range cs {
				out[i] = alias + "." + c
			}
			return strings.Join(out, ", ")
		}
		// One pass finds the rows that differ; the writes then touch only
		// those, through the primary keys. It is written as a left join
		// of the live rows to the shadow's and an anti join of the
		// shadow's to the live ones, not as one full join, because
		// PostgreSQL runs those with parallel workers (a full join, before
		// version 16, it does not): the rebuild's own process is idle
		// while the swap holds the live writers, so the server's cores
		// are the swap's. The planner is told that workers cost nothing
		// to start, as the tables are large enough to repay them; how
		// many, and the memory of each, compareForSwap bounds. The left
		// join hashes the shadow's rows, whose statistics
		// [Store.AnalyzeForSwap] gathered. JIT compilation is off: each
		// worker compiles the comparison again, and a million rows were
		// compared faster without it (2.4-2.5 s against 3.0-3.2 s;
		// docs/performance.md).
		if err := swapPlanning(ctx, tx); err != nil {
			return fmt.Errorf("store: swap %s into %s: %w", sh, live, err)
		}
		if res.ComparedInOneProcess, err = compareForSwap(ctx, tx, swapDiff(s.jobs, shadow.jobs, prefixed("l", compared), prefixed("s", compared)), workersLackedMemory); err != nil {
			return fmt.Errorf("store: swap %s into %s: %w", sh, live, err)
		}
		if _, err := exec(`ANALYZE projector_swap_diff`); err != nil {
			return err
		}
		// A job the shadow lacks whose row came from a partition the
		// shadow never read stays: that partition is read again from its
		// log's start after the swap, but what retention already removed
		// from it would never come back.
		var keptTopics []string
		var keptParts []int32
		for _, p := range unread {
			if p.Next >= 0 {
				keptTopics, keptParts = append(keptTopics, p.Topic), append(keptParts, int32(p.Partition))
			}
		}
		// (A job the shadow deleted at or above the row's version goes.)
		if res.Deleted, err = exec(`DELETE FROM `+s.jobs+` AS l USING projector_swap_diff AS d WHERE d.gone AND l.job_id = d.job_id
			AND (NOT EXISTS (SELECT 1 FROM unnest($1::text[], $2::int[]) AS u(topic, partition)
					WHERE u.topic = l.source_topic AND u.partition = l.source_partition)
				OR EXISTS (SELECT 1 FROM `+s.tombstones+` AS t WHERE t.projection = $3 AND t.job_id = l.job_id AND t.version >= l.version))`,
			keptTopics, keptParts, sh); err != nil {
			return err
		}
		if res.Updated, err = exec(`UPDATE ` + s.jobs + ` AS l SET ` + strings.Join(set, ", ") + ` FROM ` + shadow.jobs + ` AS s, projector_swap_diff AS d
			WHERE NOT d.gone AND NOT d.added AND s.job_id = d.job_id AND l.job_id = d.job_id`); err != nil {
			return err
		}
		if res.Inserted, err = exec(`INSERT INTO ` + s.jobs + ` (` + list + `) SELECT ` + prefixed("s", names) + ` FROM ` + shadow.jobs + ` AS s
			JOIN projector_swap_diff AS d ON d.job_id = s.job_id WHERE d.added`); err != nil {
			return err
		}
		for _, st := range []struct {
			sql  string
			args []any
		}{
			// Epochs move past both the live and the shadow owners'.
			// So do the counts of logs replaced, which name the
			// quarantine's rows of earlier logs.
			{`UPDATE ` + s.partitions + ` AS p SET epoch = greatest(p.epoch, coalesce((SELECT max(o.epoch) FROM ` + s.partitions + ` o
				WHERE o.projection = $1 AND o.topic = p.topic AND o.partition = p.partition), 0)) + 1,
				log_resets = greatest(p.log_resets, coalesce((SELECT max(o.log_resets) FROM ` + s.partitions + ` o
				WHERE o.projection = $1 AND o.topic = p.topic AND o.partition = p.partition), 0)),
				owner = 'rebuild', updated_at = now() WHERE p.projection = $2`, []any{live, sh}},
			{`DELETE FROM ` + s.partitions + ` WHERE projection = $1`, []any{live}},
			{`UPDATE ` + s.partitions + ` SET projection = $1 WHERE projection = $2`, []any{live, sh}},
			{`DELETE FROM ` + s.held + ` WHERE projection = $1`, []any{live}},
			{`UPDATE ` + s.held + ` SET projection = $1 WHERE projection = $2`, []any{live, sh}},
			// The deletes the shadow replayed move with it: its tombstones
			// replace the live projection's, so no late event brings back
			// a job the rebuilt model deleted.
			{`DELETE FROM ` + s.tombstones + ` WHERE projection = $1`, []any{live}},
			{`UPDATE ` + s.tombstones + ` SET projection = $1 WHERE projection = $2`, []any{live, sh}},
			// A row kept above a tombstone the shadow moved in is the
			// newer: the tombstone goes, as when a snapshot recreates a
			// deleted job.
			{`DELETE FROM ` + s.tombstones + ` AS t USING ` + s.jobs + ` AS j
				WHERE t.projection = $1 AND t.job_id = j.job_id AND t.version < j.version`, []any{live}},
			// The quarantine is merged, never deleted: it may hold records
			// the log no longer has.
			{`INSERT INTO ` + s.quarantine + ` (projection, topic, partition, "offset", key, value, error, "time")
				SELECT $1, topic, partition, "offset", key, value, error, "time" FROM ` + s.quarantine + ` WHERE projection = $2
				ON CONFLICT (projection, topic, partition, "offset") DO UPDATE SET error = excluded.error, "time" = excluded."time"`, []any{live, sh}},
			{`DELETE FROM ` + s.quarantine + ` WHERE projection = $1`, []any{sh}},
			// The gaps the rebuild closed are the rebuilt rows' history.
			{`UPDATE ` + s.gapLog + ` SET projection = $1 WHERE projection = $2`, []any{live, sh}},
			{`DELETE FROM ` + pgx.Identifier{s.schema, "projector_migrations"}.Sanitize() + ` WHERE projection = $1`, []any{sh}},
			{`DROP TABLE ` + shadow.jobs, nil},
		} {
			if _, err := exec(st.sql, st.args...); err != nil {
				return err
			}
		}
		// Every row and position may have moved: listeners read all.
		_, err = exec(`SELECT `+s.announce(1), s.announceArgs(everything)...)
		return err
	})
	return res, err
}

// unreadStarts returns, for each live partition that has a position and
// that the shadow has none for (no row, or -1: it never read it), the
// position the rebuilt model starts it at: where its log begins now. A
// live partition without a position (-1) that the shadow has no row for
// is returned at -1: it keeps no position, but its row, and so its epoch,
// must outlive the swap.
func unreadStarts(ctx context.Context, livePos, shadowPos []PartitionPosition, logStarts LogStarts) ([]PartitionPosition, error) {
	read, rows := map[[2]any]bool{}, map[[2]any]bool{}
	for _, p := range shadowPos {
		rows[[2]any{p.Topic, p.Partition}] = true
		if p.Next >= 0 {
			read[[2]any{p.Topic, p.Partition}] = true
		}
	}
	byTopic := map[string][]int{}
	var topics []string
	var out []PartitionPosition
	for _, p := range livePos {
		k := [2]any{p.Topic, p.Partition}
		if p.Next < 0 {
			// Never read by the live projection either: --start decides
			// where it begins, as before.
			if !rows[k] {
				out = append(out, PartitionPosition{Topic: p.Topic, Partition: p.Partition, Next: -1})
			}
			continue
		}
		if read[k] {
			continue
		}
		if byTopic[p.Topic] == nil {
			topics = append(topics, p.Topic)
		}
		byTopic[p.Topic] = append(byTopic[p.Topic], p.Partition)
	}
	for _, topic := range topics {
		parts := byTopic[topic]
		starts := map[int]int64{}
		if logStarts != nil {
			var err error
			if starts, err = logStarts(ctx, topic, parts); err != nil {
				return nil, fmt.Errorf("where the logs of the partitions the rebuild did not read begin (%s %v): %w", topic, parts, err)
			}
		}
		for _, p := range parts {
			start, ok := starts[p]
			if logStarts != nil && !ok {
				return nil, fmt.Errorf("where the log of %s/%d begins: not answered", topic, p)
			}
			out = append(out, PartitionPosition{Topic: topic, Partition: p, Next: max(start, 0)})
		}
	}
	return out, nil
}

// rebuildLockClass keys the session advisory lock a rebuild holds for as
// long as it runs, with the projection's lock class as the second key.
const rebuildLockClass int32 = 0x70727262 // "prrb"

// ErrRebuildRunning means another rebuild of the same table holds its lock.
var ErrRebuildRunning = errors.New("store: another rebuild of this table is running")

// LockRebuild takes the lock that lets one rebuild of s's table run at a
// time: two would share the shadow, each resetting or swapping what the
// other writes. It returns [ErrRebuildRunning] at once if another holds
// it. The lock lives in a connection of its own until release is called,
// or until the process ends and PostgreSQL drops the connection.
func (s *Store) LockRebuild(ctx context.Context) (release func(), err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: lock the rebuild of %s: %w", s.projection, err)
	}
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, rebuildLockClass, s.lockClass).Scan(&got); err != nil {
		conn.Release()
		return nil, fmt.Errorf("store: lock the rebuild of %s: %w", s.projection, err)
	}
	if !got {
		conn.Release()
		return nil, ErrRebuildRunning
	}
	return func() {
		// A connection that cannot say unlock is closed: its lock goes
		// with it.
		if _, err := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, $2)`, rebuildLockClass, s.lockClass); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
		conn.Release()
	}, nil
}

// swapLockClass keys the advisory lock a swap holds for its whole
// transaction, with the projection's lock class as the second key.
const swapLockClass int32 = 0x70727377 // "prsw"

// SwapWaitError means a batch or a claim waited for the partition's row
// while a rebuild's swap holds it: not an outage, nor a stuck owner. Once
// the swap commits, the batch is fenced and the partition is claimed again
// from the rebuilt positions.
type SwapWaitError struct {
	Table string
	// Running is how long the swap has run; 0 when PostgreSQL does not
	// show it to this role.
	Running time.Duration
	Err     error
}

func (e *SwapWaitError) Error() string {
	running := ""
	if e.Running > 0 {
		running = fmt.Sprintf(" (running for %s)", e.Running.Round(time.Second))
	}
	return fmt.Sprintf("store: a rebuild is swapping its rows into %s%s; its partitions wait for it: %v", e.Table, running, e.Err)
}

func (e *SwapWaitError) Unwrap() error { return e.Err }

// ClaimLockTimeout is how long one claim, or one batch's fence, waits for
// the partition's row before it gives up with a *[ClaimWaitError] or a
// *[SwapWaitError].
func (s *Store) ClaimLockTimeout() time.Duration { return s.claimLockTimeout }

// swapping reports whether a rebuild's swap into s's table is running, and
// for how long: whether the swap lock is held exclusively (claims hold it
// shared, to wait for a swap). It waits for nothing.
func (s *Store) swapping(ctx context.Context) (running time.Duration, ok bool) {
	var secs *float64
	err := s.pool.QueryRow(ctx, `SELECT extract(epoch FROM now() - a.xact_start)::float8
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.mode = 'ExclusiveLock'
			AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND l.classid = ($1::bigint & 4294967295)::oid AND l.objid = ($2::bigint & 4294967295)::oid
		LIMIT 1`, swapLockClass, s.lockClass).Scan(&secs)
	if err != nil {
		return 0, false
	}
	if secs != nil {
		running = time.Duration(*secs * float64(time.Second))
	}
	return running, true
}

// keptName is the next free projector_old_<table>_<n>.
func (s *Store) keptName(ctx context.Context, tx pgx.Tx) (string, error) {
	base := keptPrefix + s.projection + "_"
	var n int64
	err := tx.QueryRow(ctx, `SELECT coalesce(max(substr(c.relname, $3)::bigint), 0) + 1 FROM pg_class c
		JOIN pg_namespace ns ON ns.oid = c.relnamespace
		WHERE ns.nspname = $1 AND c.relkind = 'r' AND c.relname ~ ('^' || $2 || '[0-9]{1,8}$')`,
		s.schema, base, len(base)+1).Scan(&n)
	if err != nil {
		return "", fmt.Errorf("store: name for the kept model of %s: %w", s.projection, err)
	}
	name := base + strconv.FormatInt(n, 10)
	if len(name) > maxIdent {
		return "", fmt.Errorf("store: keep the model of %s: name %q longer than %d bytes", s.projection, name, maxIdent)
	}
	return name, nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Drift counts how the live model differs from a rebuilt one, by kind, with
// a sample of job ids for each.
type Drift struct {
	// Kinds, relative to the rebuilt model: missing (only in it), behind
	// (live version lower), ahead (live version higher), differs (same
	// version, other state), extra (only in the live model).
	Counts  map[string]int64
	Samples map[string][]string
}

// DriftKinds are the kinds of [Drift], in the order they are reported.
var DriftKinds = []string{"missing", "behind", "ahead", "differs", "extra"}

// Diff compares the live model s with the shadow's rows, sampling up to
// sample job ids per kind.
func (s *Store) Diff(ctx context.Context, shadow *Store, sample int) (Drift, error) {
	d := Drift{Counts: map[string]int64{}, Samples: map[string][]string{}}
	// The samples are each kind's first ids by a top-N sort, never an
	// array of every differing id.
	rows, err := s.pool.Query(ctx, `WITH d AS MATERIALIZED (
		SELECT coalesce(l.job_id, s.job_id) AS job_id, CASE
			WHEN l.job_id IS NULL THEN 'missing'
			WHEN s.job_id IS NULL THEN 'extra'
			WHEN l.version < s.version THEN 'behind'
			WHEN l.version > s.version THEN 'ahead'
			WHEN l.state IS DISTINCT FROM s.state THEN 'differs' END AS kind
		FROM `+s.jobs+` AS l FULL JOIN `+shadow.jobs+` AS s ON s.job_id = l.job_id
	), c AS (SELECT kind, count(*) AS n FROM d WHERE kind IS NOT NULL GROUP BY kind)
	SELECT c.kind, c.n, ARRAY(SELECT d.job_id FROM d WHERE d.kind = c.kind ORDER BY d.job_id LIMIT $1) FROM c`, sample)
	if err != nil {
		return d, fmt.Errorf("store: compare %s with %s: %w", s.projection, shadow.projection, err)
	}
	defer rows.Close()
	for rows.Next() {
		var kind string
		var n int64
		var ids []string
		if err := rows.Scan(&kind, &n, &ids); err != nil {
			return d, fmt.Errorf("store: compare %s with %s: %w", s.projection, shadow.projection, err)
		}
		d.Counts[kind], d.Samples[kind] = n, ids
	}
	return d, rows.Err()
}

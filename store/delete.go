package store

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Deletes and tombstones.
//
// A deleted job has no row in the read model and a tombstone in
// projector_tombstones at the delete's version; never both. Whether a
// snapshot or a job's first delta may create a row depends on the
// tombstone table, and whether a delete applies on the jobs table: two
// tables, so no single row lock or unique index orders two writers of one
// job that race from "no row". lockJobs orders them instead.

// lockStripes is how many advisory locks a projection's jobs hash to.
// Every batch takes at most this many, whatever its size, so the shared
// lock table never fills up.
const lockStripes = 64

// lockClassOf keys a projection's stripes apart from other projections'
// (the first half of PostgreSQL's two-key advisory locks).
func lockClassOf(schema, table string) int32 {
	h := fnv.New32a()
	h.Write([]byte("projector.jobs:" + schema + "." + table))
	return int32(h.Sum32())
}

func stripeOf(jobID string) int32 {
	h := fnv.New32a()
	h.Write([]byte(jobID))
	return int32(h.Sum32() % lockStripes)
}

// lockJobs takes, for the rest of the transaction, the advisory lock of
// every stripe the batch writes to: shared for writes that only touch the
// jobs table (snapshots, updates), exclusive for writes that touch
// tombstones (deletes, and states computed from a deleted job). Batches
// without deletes never wait for each other; a delete waits for the
// batches in flight on its stripe, and they for it, so the tombstone
// check inside each write statement sees every committed delete and no
// delete misses a row created meanwhile. An unfenced batch also takes,
// exclusive, the stripes of the jobs it holds deltas of (see
// [Store.heldInLine]). Stripes are taken in ascending order, so two
// batches never deadlock on them.
func (s *Store) lockJobs(ctx context.Context, tx pgx.Tx, b *Batch) error {
	sql, args, ok := s.lockJobsStatement(b)
	if !ok {
		return nil
	}
	_, err := tx.Exec(ctx, sql, args...)
	return err
}

// lockJobsStatement is the statement of [Store.lockJobs] and its
// arguments; ok is false when the batch writes no job.
func (s *Store) lockJobsStatement(b *Batch) (sql string, args []any, ok bool) {
	mode := map[int32]bool{} // stripe -> exclusive
	add := func(ws []Write, exclusive func(Write) bool) {
		for _, w := range ws {
			st := stripeOf(w.JobID)
			mode[st] = mode[st] || exclusive(w)
		}
	}
	add(b.Snapshots, func(Write) bool { return false })
	add(b.Deletes, func(Write) bool { return true })
	add(b.Updates, func(w Write) bool { return w.Deleted || w.ExpectDeleted })
	if b.Unfenced {
		// Without an owner, another instance may write a job while this
		// batch holds one of its deltas: its check of the held rows
		// ([Store.heldInLine]) and this batch's of the row ([Store.hold])
		// must each see what the other committed.
		for _, h := range b.Hold {
			mode[stripeOf(h.JobID)] = true
		}
	}
	if len(mode) == 0 {
		return "", nil, false
	}
	stripes := make([]int32, 0, len(mode))
	for st := range mode {
		stripes = append(stripes, st)
	}
	slices.Sort(stripes)
	excl := make([]bool, len(stripes))
	for i, st := range stripes {
		excl[i] = mode[st]
	}
	// unnest yields the rows in array order, and a function scan
	// evaluates them one by one: the locks are taken in that order.
	return `SELECT CASE WHEN u.x THEN pg_advisory_xact_lock($1, u.s)::text
			ELSE pg_advisory_xact_lock_shared($1, u.s)::text END
		FROM unnest($2::int[], $3::bool[]) AS u(s, x)`, []any{s.lockClass, stripes, excl}, true
}

// applyDeletes writes the batch's deletes: each applies where the job's
// version, its row's or its tombstone's, is below the delete's. The row
// goes and the tombstone takes the delete's version, in one statement.
func (s *Store) applyDeletes(ctx context.Context, tx pgx.Tx, b *Batch, res *Result) error {
	ids, vers, _, offs, evs := columns(b.Deletes)
	rows, err := tx.Query(ctx, `WITH i AS (
			SELECT * FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::text[]) AS i(job_id, version, off, event_id)
		), cur AS (
			SELECT i.*, j.version AS row_version, t.version AS tomb_version
			FROM i LEFT JOIN `+s.jobs+` j ON j.job_id = i.job_id
			LEFT JOIN `+s.tombstones+` t ON t.projection = $1 AND t.job_id = i.job_id
		), tomb AS (
			INSERT INTO `+s.tombstones+` AS t
				(projection, job_id, version, deleted_at, event_id, source_topic, source_partition, source_offset)
			SELECT $1, cur.job_id, cur.version, now(), NULLIF(cur.event_id, ''), $6, $7, cur.off
			FROM cur WHERE coalesce(cur.row_version, 0) < cur.version
			ON CONFLICT (projection, job_id) DO UPDATE SET
				version = excluded.version, deleted_at = excluded.deleted_at, event_id = excluded.event_id,
				source_topic = excluded.source_topic, source_partition = excluded.source_partition,
				source_offset = excluded.source_offset
			WHERE t.version < excluded.version
			RETURNING t.job_id, t.version
		), gone AS (
			DELETE FROM `+s.jobs+` j USING tomb WHERE j.job_id = tomb.job_id AND j.version < tomb.version
		)
		SELECT cur.job_id, coalesce(cur.row_version, cur.tomb_version, 0), tomb.job_id IS NOT NULL,
			cur.row_version IS NOT DISTINCT FROM cur.version
		FROM cur LEFT JOIN tomb ON tomb.job_id = cur.job_id`,
		s.projection, ids, vers, offs, evs, b.Topic, b.Partition)
	if err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: deletes: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	var id string
	var before int64
	var applied, conflict bool
	_, err = pgx.ForEachRow(rows, []any{&id, &before, &applied, &conflict}, func() error {
		switch {
		case applied:
			res.DeletesApplied[id] = before
		case conflict:
			if res.DeleteConflicts == nil {
				res.DeleteConflicts = map[string]bool{}
			}
			res.DeleteConflicts[id] = true
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: deletes: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	return nil
}

// revive writes states computed from a deleted job (a snapshot above its
// tombstone, and the deltas after it): only where the tombstone is still
// at the version they were computed from, which it removes.
func (s *Store) revive(ctx context.Context, tx pgx.Tx, b *Batch, ws []Write) (pgx.Rows, error) {
	ids, vers, states, offs, evs := columns(ws)
	return tx.Query(ctx, `WITH i AS (
			SELECT * FROM unnest($2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::text[], $7::bigint[], $8::text[])
				AS i(job_id, version, state, off, event_id, expect, last_ops)
		), gone AS (
			DELETE FROM `+s.tombstones+` t USING i
			WHERE t.projection = $1 AND t.job_id = i.job_id AND t.version = i.expect
			RETURNING t.job_id
		)
		INSERT INTO `+s.jobs+`
			(job_id, version, state, updated_at, source_topic, source_partition, source_offset, event_id, last_ops)
		SELECT i.job_id, i.version, i.state::jsonb, now(), $9, $10, i.off, NULLIF(i.event_id, ''), NULLIF(i.last_ops, '')::jsonb
		FROM i JOIN gone ON gone.job_id = i.job_id
		ON CONFLICT (job_id) DO NOTHING
		RETURNING job_id`, s.projection, ids, vers, states, offs, evs, expects(ws), lastOps(ws), b.Topic, b.Partition)
}

// The deletes computed from a known job, by what the job was: a row at
// Expect, nothing at all, or a tombstone at Expect. Each writes the
// tombstone only if the job is still what it was computed from.
const (
	deleteRowSQL = `WITH i AS (
			SELECT * FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::bigint[]) AS i(job_id, version, off, event_id, expect)
		), gone AS (
			DELETE FROM {{jobs}} j USING i WHERE j.job_id = i.job_id AND j.version = i.expect
			RETURNING j.job_id
		)
		INSERT INTO {{tombstones}} AS t
			(projection, job_id, version, deleted_at, event_id, source_topic, source_partition, source_offset)
		SELECT $1, i.job_id, i.version, now(), NULLIF(i.event_id, ''), $7, $8, i.off
		FROM i JOIN gone ON gone.job_id = i.job_id
		ON CONFLICT (projection, job_id) DO UPDATE SET
			version = excluded.version, deleted_at = excluded.deleted_at, event_id = excluded.event_id,
			source_topic = excluded.source_topic, source_partition = excluded.source_partition, source_offset = excluded.source_offset
		WHERE t.version < excluded.version
		RETURNING t.job_id`
	deleteNewSQL = `INSERT INTO {{tombstones}}
			(projection, job_id, version, deleted_at, event_id, source_topic, source_partition, source_offset)
		SELECT $1, i.job_id, i.version, now(), NULLIF(i.event_id, ''), $7, $8, i.off
		FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::bigint[]) AS i(job_id, version, off, event_id, expect)
		WHERE NOT EXISTS (SELECT 1 FROM {{jobs}} j WHERE j.job_id = i.job_id)
		ON CONFLICT (projection, job_id) DO NOTHING
		RETURNING job_id`
	redeleteSQL = `UPDATE {{tombstones}} AS t SET
			version = i.version, deleted_at = now(), event_id = NULLIF(i.event_id, ''),
			source_topic = $7, source_partition = $8, source_offset = i.off
		FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::bigint[]) AS i(job_id, version, off, event_id, expect)
		WHERE t.projection = $1 AND t.job_id = i.job_id AND t.version = i.expect
		RETURNING t.job_id`
)

func (s *Store) deleteExpected(ctx context.Context, tx pgx.Tx, b *Batch, sql string, ws []Write) (pgx.Rows, error) {
	ids, vers, _, offs, evs := columns(ws)
	sql = strings.NewReplacer("{{jobs}}", s.jobs, "{{tombstones}}", s.tombstones).Replace(sql)
	return tx.Query(ctx, sql, s.projection, ids, vers, offs, evs, expects(ws), b.Topic, b.Partition)
}

func expects(ws []Write) []int64 {
	out := make([]int64, len(ws))
	for i, w := range ws {
		out[i] = w.Expect
	}
	return out
}

// Tombstone is one deleted job.
type Tombstone struct {
	JobID     string
	Version   int64
	DeletedAt time.Time
}

// Tombstones reads the tombstones of ids that have one.
func (s *Store) Tombstones(ctx context.Context, ids []string) (map[string]Tombstone, error) {
	rows, err := s.pool.Query(ctx, `SELECT job_id, version, deleted_at FROM `+s.tombstones+`
		WHERE projection = $1 AND job_id = ANY($2::text[])`, s.projection, ids)
	if err != nil {
		return nil, fmt.Errorf("store: tombstones: %w", err)
	}
	out := map[string]Tombstone{}
	var t Tombstone
	_, err = pgx.ForEachRow(rows, []any{&t.JobID, &t.Version, &t.DeletedAt}, func() error {
		out[t.JobID] = t
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: tombstones: %w", err)
	}
	return out, nil
}

// CountTombstones says how many deleted jobs the projection remembers; 0
// for a schema not migrated to tombstones yet (it only reads).
func (s *Store) CountTombstones(ctx context.Context) (int64, error) {
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.tombstones).Scan(&exists); err != nil {
		return 0, fmt.Errorf("store: count tombstones: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+s.tombstones+` WHERE projection = $1`, s.projection).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count tombstones: %w", err)
	}
	return n, nil
}

// PruneTombstones deletes at most limit tombstones of deletes made before
// cutoff, oldest first, and returns how many it deleted. Small batches
// keep each statement short: call it again while it returns limit. It
// passes over the tombstones another pruner or a batch has locked, so
// instances pruning at once delete disjoint rows and never wait.
//
// Pruning lowers a deleted job's version back to 0, so an event older
// than the delete arriving afterwards can create the job again: that is
// the trade-off of a bounded retention (docs/contract.md).
func (s *Store) PruneTombstones(ctx context.Context, cutoff time.Time, limit int) (int64, error) {
	// The CTE runs once: a locking subquery the plan rescans would skip
	// the rows this statement already deleted and pick more than limit.
	tag, err := s.pool.Exec(ctx, `WITH old AS MATERIALIZED (
			SELECT job_id FROM `+s.tombstones+` WHERE projection = $1 AND deleted_at < $2
			ORDER BY deleted_at LIMIT $3 FOR UPDATE SKIP LOCKED
		)
		DELETE FROM `+s.tombstones+` t USING old
		WHERE t.projection = $1 AND t.job_id = old.job_id AND t.deleted_at < $2`, s.projection, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("store: prune tombstones before %s: %w", cutoff.UTC().Format(time.RFC3339), err)
	}
	return tag.RowsAffected(), nil
}

package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// JobIDs lists, in order, up to limit job ids of the read model after
// after ("" for the first page).
func (s *Store) JobIDs(ctx context.Context, after string, limit int) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT job_id FROM `+s.jobs+` WHERE job_id > $1 ORDER BY job_id LIMIT $2`, after, limit)
	if err != nil {
		return nil, fmt.Errorf("store: job ids after %q: %w", after, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: job ids after %q: %w", after, err)
	}
	return ids, nil
}

// HeldWithoutRow lists the jobs that have held deltas but no row.
func (s *Store) HeldWithoutRow(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT h.job_id FROM `+s.held+` h
		WHERE h.projection = $1 AND NOT EXISTS (SELECT 1 FROM `+s.jobs+` j WHERE j.job_id = h.job_id)
		ORDER BY 1`, s.projection)
	if err != nil {
		return nil, fmt.Errorf("store: held jobs without a row: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: held jobs without a row: %w", err)
	}
	return ids, nil
}

// SampleJobIDs picks up to n job ids of the read model at random.
func (s *Store) SampleJobIDs(ctx context.Context, n int) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT job_id FROM `+s.jobs+` ORDER BY random() LIMIT $1`, n)
	if err != nil {
		return nil, fmt.Errorf("store: sample %d job ids: %w", n, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: sample %d job ids: %w", n, err)
	}
	return ids, nil
}

// Heal writes a trusted snapshot over a job's row where the row is missing,
// below its version, or at its version with another state: the one place an
// equal-version overwrite is allowed. The version condition is in the same
// statement as the write, so a version never goes down, whatever writes
// meanwhile. An applied heal is written to the gap log (step "verify") in
// the same transaction. It returns whether it applied and the row's version
// before (0: no row).
func (s *Store) Heal(ctx context.Context, jobID string, version int64, state json.RawMessage, eventID string) (applied bool, before int64, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// A deleted job is healed like a row: its tombstone at or below
		// the authority's version gives way, one above it keeps the job
		// deleted. The stripe lock orders this against deletes.
		if err := s.lockJobs(ctx, tx, &Batch{Deletes: []Write{{JobID: jobID}}}); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, `WITH old AS (
				SELECT version FROM `+s.jobs+` WHERE job_id = $1
			), tomb AS (
				SELECT version FROM `+s.tombstones+` WHERE projection = $5 AND job_id = $1
			), ins AS (
				INSERT INTO `+s.jobs+` AS t
				(job_id, version, state, updated_at, source_topic, source_partition, source_offset, event_id, last_ops)
				SELECT $1, $2, $3::jsonb, now(), NULL, NULL, -1, NULLIF($4, ''), NULL
				WHERE NOT EXISTS (SELECT 1 FROM tomb WHERE tomb.version > $2)
				ON CONFLICT (job_id) DO UPDATE SET
					version = excluded.version, state = excluded.state, updated_at = excluded.updated_at,
					source_topic = excluded.source_topic, source_partition = excluded.source_partition,
					source_offset = excluded.source_offset, event_id = excluded.event_id, last_ops = NULL
				WHERE t.version < excluded.version
					OR (t.version = excluded.version AND t.state IS DISTINCT FROM excluded.state)
				RETURNING t.job_id
			), revived AS (
				DELETE FROM `+s.tombstones+` WHERE projection = $5 AND job_id IN (SELECT job_id FROM ins)
			)
			SELECT coalesce((SELECT version FROM old), (SELECT version FROM tomb), 0) FROM ins`,
			jobID, version, string(state), eventID, s.projection).Scan(&before)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		applied = true
		_, err = tx.Exec(ctx, `INSERT INTO `+s.gapLog+` (projection, job_id, opened_at, step, from_version, to_version)
			VALUES ($1, $2, now(), 'verify', $3, $4)`, s.projection, jobID, before, version)
		return err
	})
	if err != nil {
		return false, 0, fmt.Errorf("store: heal %q at v%d: %w", jobID, version, err)
	}
	return applied, before, nil
}

// HealDelete applies the authority's delete of a job where its row is
// missing, below the delete's version, or at it (the job exists where the
// authority says it was deleted), and where no tombstone is at or above
// it: the row goes and a tombstone at version stays. Like [Store.Heal], it
// is written to the gap log and returns whether it applied and the job's
// version before (its row's or its tombstone's; 0: neither).
func (s *Store) HealDelete(ctx context.Context, jobID string, version int64, eventID string) (applied bool, before int64, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.lockJobs(ctx, tx, &Batch{Deletes: []Write{{JobID: jobID}}}); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, `WITH cur AS (
				SELECT (SELECT version FROM `+s.jobs+` WHERE job_id = $1) AS row_version,
					(SELECT version FROM `+s.tombstones+` WHERE projection = $4 AND job_id = $1) AS tomb_version
			), tomb AS (
				INSERT INTO `+s.tombstones+` AS t (projection, job_id, version, deleted_at, event_id, source_offset)
				SELECT $4, $1, $2, now(), NULLIF($3, ''), -1 FROM cur WHERE coalesce(cur.row_version, 0) <= $2
				ON CONFLICT (projection, job_id) DO UPDATE SET
					version = excluded.version, deleted_at = excluded.deleted_at, event_id = excluded.event_id,
					source_topic = NULL, source_partition = NULL, source_offset = -1
				WHERE t.version < excluded.version
				RETURNING t.job_id
			), gone AS (
				DELETE FROM `+s.jobs+` WHERE job_id IN (SELECT job_id FROM tomb) AND version <= $2
			)
			SELECT coalesce(cur.row_version, cur.tomb_version, 0) FROM cur, tomb`,
			jobID, version, eventID, s.projection).Scan(&before)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		applied = true
		_, err = tx.Exec(ctx, `INSERT INTO `+s.gapLog+` (projection, job_id, opened_at, step, from_version, to_version)
			VALUES ($1, $2, now(), 'verify', $3, $4)`, s.projection, jobID, before, version)
		return err
	})
	if err != nil {
		return false, 0, fmt.Errorf("store: heal %q: delete at v%d: %w", jobID, version, err)
	}
	return applied, before, nil
}

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

// Heal writes what the trusted authority says of a job over the read model:
// a snapshot where the job is missing, below its version (a row or a
// tombstone), or at its version with another state, which is the one place
// an equal-version overwrite is allowed; a delete (deleted true) where the
// job is below its version, as a batch's delete applies. The version
// condition is in the same statement as the write, so a version never goes
// down, whatever writes meanwhile. An applied heal is written to the gap log
// (step "verify") in the same transaction. It returns whether it applied and
// the job's version before (0: neither row nor tombstone).
func (s *Store) Heal(ctx context.Context, jobID string, version int64, state json.RawMessage, eventID string, deleted bool) (applied bool, before int64, err error) {
	err = pgx.BeginTxFunc(ctx, s.pool, readCommitted, func(tx pgx.Tx) error {
		w := Write{JobID: jobID, Version: version, State: state, Offset: -1, EventID: eventID}
		// Exclusive on the job's stripe: the heal may touch its tombstone.
		b := &Batch{Deletes: []Write{w}}
		if err := s.lockJobs(ctx, tx, b); err != nil {
			return err
		}
		if deleted {
			res := Result{DeletesApplied: map[string]int64{}}
			if err := s.applyDeletes(ctx, tx, b, &res); err != nil {
				return err
			}
			before, applied = res.DeletesApplied[jobID]
		} else {
			err := tx.QueryRow(ctx, `WITH tomb AS (
					SELECT version FROM `+s.tombstones+` WHERE projection = $5 AND job_id = $1
				), old AS (
					SELECT version FROM `+s.jobs+` WHERE job_id = $1
				), gone AS (
					DELETE FROM `+s.tombstones+` t WHERE t.projection = $5 AND t.job_id = $1 AND t.version < $2
				), ins AS (
					INSERT INTO `+s.jobs+` AS t
					(job_id, version, state, updated_at, source_topic, source_partition, source_offset, event_id, last_ops)
					SELECT $1, $2, $3::jsonb, now(), NULL, NULL, -1, NULLIF($4, ''), NULL
					WHERE NOT EXISTS (SELECT 1 FROM tomb WHERE tomb.version >= $2)
					ON CONFLICT (job_id) DO UPDATE SET
						version = excluded.version, state = excluded.state, updated_at = excluded.updated_at,
						source_topic = excluded.source_topic, source_partition = excluded.source_partition,
						source_offset = excluded.source_offset, last_ops = NULL,
						-- A same-version rewrite leaves the version where it was, so
						-- it marks the row's event id instead: a running engine's
						-- update, conditioned on the event id it computed from,
						-- then misses and reloads the repaired row.
						event_id = CASE WHEN t.version = excluded.version
							THEN concat('verify#', txid_current(), ':', excluded.event_id)
							ELSE excluded.event_id END
					WHERE t.version < excluded.version
						OR (t.version = excluded.version AND t.state IS DISTINCT FROM excluded.state)
					RETURNING t.job_id
				)
				SELECT coalesce((SELECT version FROM old), (SELECT version FROM tomb), 0) FROM ins`,
				jobID, version, string(state), eventID, s.projection).Scan(&before)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				return nil
			case err != nil:
				return err
			}
			applied = true
		}
		if !applied {
			return nil
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+s.gapLog+` (projection, job_id, opened_at, step, from_version, to_version)
			VALUES ($1, $2, now(), 'verify', $3, $4)`, s.projection, jobID, before, version)
		if err != nil {
			return err
		}
		return s.notifyJobs(ctx, tx, jobID)
	})
	if err != nil {
		return false, 0, fmt.Errorf("store: heal %q at v%d: %w", jobID, version, err)
	}
	return applied, before, nil
}

// DeletedJobIDs lists, in order, up to limit ids of jobs the projection
// holds a tombstone of, after after ("" for the first page).
func (s *Store) DeletedJobIDs(ctx context.Context, after string, limit int) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT job_id FROM `+s.tombstones+` WHERE projection = $1 AND job_id > $2
		ORDER BY job_id LIMIT $3`, s.projection, after, limit)
	if err != nil {
		return nil, fmt.Errorf("store: deleted job ids after %q: %w", after, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: deleted job ids after %q: %w", after, err)
	}
	return ids, nil
}

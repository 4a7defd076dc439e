package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoProjection means the projection's tables do not exist: nothing has
// run against this schema and table yet. Read-only commands report it
// rather than create them.
var ErrNoProjection = errors.New("store: the projection does not exist")

// CheckExists reports, wrapping [ErrNoProjection], a projection whose
// read-model table or bookkeeping tables are missing. It creates nothing.
func (s *Store) CheckExists(ctx context.Context) error {
	for _, t := range []string{s.jobs, s.partitions, s.held, s.quarantine} {
		var exists bool
		if err := s.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, t).Scan(&exists); err != nil {
			return fmt.Errorf("store: check %s: %w", t, err)
		}
		if !exists {
			return fmt.Errorf("%w: table %s is missing (has `projector run` ever run with this --schema and --table?)", ErrNoProjection, t)
		}
	}
	return nil
}

// QuarantineRecord is one row of the quarantine, with the id operators
// name it by.
type QuarantineRecord struct {
	ID        int64
	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	Value     []byte
	Error     string
	Time      time.Time
}

// QuarantineFilter selects quarantined records: by IDs if any are given,
// otherwise every record since Since (zero: all), newest first, at most
// Limit (0: no limit).
type QuarantineFilter struct {
	IDs   []int64
	Since time.Time
	Limit int
}

// QuarantineRecords lists the projection's quarantined records matching f.
func (s *Store) QuarantineRecords(ctx context.Context, f QuarantineFilter) ([]QuarantineRecord, error) {
	sql := `SELECT id, topic, partition, "offset", key, value, error, "time" FROM ` + s.quarantine + `
		WHERE projection = $1`
	args := []any{s.projection}
	if len(f.IDs) > 0 {
		args = append(args, f.IDs)
		sql += fmt.Sprintf(` AND id = ANY($%d::bigint[])`, len(args))
	}
	if !f.Since.IsZero() {
		args = append(args, f.Since)
		sql += fmt.Sprintf(` AND "time" >= $%d`, len(args))
	}
	sql += ` ORDER BY id DESC`
	if f.Limit > 0 {
		args = append(args, f.Limit)
		sql += fmt.Sprintf(` LIMIT $%d`, len(args))
	}
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("store: quarantine list: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (QuarantineRecord, error) {
		var q QuarantineRecord
		err := r.Scan(&q.ID, &q.Topic, &q.Partition, &q.Offset, &q.Key, &q.Value, &q.Error, &q.Time)
		return q, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: quarantine list: %w", err)
	}
	return out, nil
}

// QuarantineIDs lists the ids of every quarantined record of the
// projection, oldest first.
func (s *Store) QuarantineIDs(ctx context.Context) ([]int64, error) {
	rows, err := s.pool.Query(ctx, `SELECT id FROM `+s.quarantine+` WHERE projection = $1 ORDER BY id`, s.projection)
	if err != nil {
		return nil, fmt.Errorf("store: quarantine ids: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("store: quarantine ids: %w", err)
	}
	return ids, nil
}

// PurgeQuarantine deletes the quarantined records older than before, or
// all of them when before is zero, and returns how many it deleted.
func (s *Store) PurgeQuarantine(ctx context.Context, before time.Time) (int64, error) {
	sql := `DELETE FROM ` + s.quarantine + ` WHERE projection = $1`
	args := []any{s.projection}
	if !before.IsZero() {
		sql += ` AND "time" < $2`
		args = append(args, before)
	}
	tag, err := s.pool.Exec(ctx, sql, args...)
	if err != nil {
		return 0, fmt.Errorf("store: quarantine purge: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Requarantine keeps record id in the quarantine with a new reason. A
// record whose reason is unchanged is not written at all.
func (s *Store) Requarantine(ctx context.Context, id int64, reason string) error {
	_, err := s.pool.Exec(ctx, `UPDATE `+s.quarantine+` SET error = $3
		WHERE projection = $1 AND id = $2 AND error IS DISTINCT FROM $3`, s.projection, id, cleanReason(reason))
	if err != nil {
		return fmt.Errorf("store: requarantine %d: %w", id, err)
	}
	return nil
}

// Unquarantine takes record q out of the quarantine, first writing w, if
// not nil, with the same version condition as a batch's updates: where the
// row is still at w.Expect (0: where there is no row). Both happen in one
// transaction: a write that does not apply returns a *[StaleError] and the
// record stays. It never touches a partition's position or epoch, so it is
// safe while the partition's owner runs.
func (s *Store) Unquarantine(ctx context.Context, q QuarantineRecord, w *Write) error {
	return pgx.BeginTxFunc(ctx, s.pool, readCommitted, func(tx pgx.Tx) error {
		if w != nil {
			b := &Batch{Topic: q.Topic, Partition: q.Partition, NextOffset: q.Offset + 1, Updates: []Write{*w}}
			if err := s.lockJobs(ctx, tx, b); err != nil {
				return fmt.Errorf("store: unquarantine %d: lock job: %w", q.ID, err)
			}
			if err := s.applyUpdates(ctx, tx, b); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+s.quarantine+` WHERE projection = $1 AND id = $2`, s.projection, q.ID); err != nil {
			return fmt.Errorf("store: unquarantine %d: %w", q.ID, err)
		}
		if w != nil {
			if err := s.notifyJobs(ctx, tx, w.JobID); err != nil {
				return fmt.Errorf("store: unquarantine %d: %w", q.ID, err)
			}
		}
		return nil
	})
}

// cleanReason keeps a reason that quotes input as text PostgreSQL accepts.
func cleanReason(s string) string {
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
}

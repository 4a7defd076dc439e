package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// GapClosed is a gap a batch closes, written to the gap log in the batch's
// transaction.
type GapClosed struct {
	JobID string
	// Opened is when the job's oldest held delta was first held.
	Opened time.Time
	// Step closed it: "wait", "reread", "snapshot" or "verify".
	Step string
	// From and To are the row's versions before and after.
	From, To int64
	// Held are the held versions the close released.
	Held []int64
}

// Attempt is a gap attempt that ended with its job still held; the batch
// records it on the job's held rows.
type Attempt struct {
	JobID string
	Step  string
	Err   string
}

// writeGapLog records b's closed gaps, with the attempts their held rows
// counted, and b's failed attempts on the held rows. It runs before the
// batch releases held rows.
func (s *Store) writeGapLog(ctx context.Context, tx pgx.Tx, b *Batch) error {
	if len(b.Gaps) > 0 {
		ids := make([]string, len(b.Gaps))
		opened := make([]time.Time, len(b.Gaps))
		steps := make([]string, len(b.Gaps))
		from := make([]int64, len(b.Gaps))
		to := make([]int64, len(b.Gaps))
		held := make([]string, len(b.Gaps))
		for i, g := range b.Gaps {
			ids[i], opened[i], steps[i], from[i], to[i] = g.JobID, g.Opened, g.Step, g.From, g.To
			held[i] = int64Array(g.Held)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.gapLog+`
				(projection, job_id, opened_at, step, from_version, to_version, held_versions, attempts, topic, partition)
			SELECT $1, i.job_id, i.opened, i.step, i.from_v, i.to_v, i.held::bigint[],
				coalesce((SELECT max(h.attempts) FROM `+s.held+` h WHERE h.projection = $1 AND h.job_id = i.job_id), 0),
				$2, $3
			FROM unnest($4::text[], $5::timestamptz[], $6::text[], $7::bigint[], $8::bigint[], $9::text[])
				AS i(job_id, opened, step, from_v, to_v, held)`,
			s.projection, b.Topic, b.Partition, ids, opened, steps, from, to, held); err != nil {
			return fmt.Errorf("store: apply %s/%d@%d: gap log: %w", b.Topic, b.Partition, b.NextOffset, err)
		}
	}
	if len(b.Attempts) > 0 {
		ids := make([]string, len(b.Attempts))
		steps := make([]string, len(b.Attempts))
		errs := make([]string, len(b.Attempts))
		for i, a := range b.Attempts {
			ids[i], steps[i], errs[i] = a.JobID, a.Step, cleanReason(a.Err)
		}
		if _, err := tx.Exec(ctx, `UPDATE `+s.held+` h SET attempts = h.attempts + 1,
				last_step = i.step, last_error = i.err, last_attempt_at = now()
			FROM unnest($2::text[], $3::text[], $4::text[]) AS i(job_id, step, err)
			WHERE h.projection = $1 AND h.job_id = i.job_id`,
			s.projection, ids, steps, errs); err != nil {
			return fmt.Errorf("store: apply %s/%d@%d: gap attempts: %w", b.Topic, b.Partition, b.NextOffset, err)
		}
	}
	return nil
}

// int64Array is vs as a PostgreSQL array literal, so a batch of rows with
// arrays of different lengths passes through one unnest.
func int64Array(vs []int64) string {
	b := []byte{'{'}
	for i, v := range vs {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, "%d", v)
	}
	return string(append(b, '}'))
}

// PruneGapLog deletes, in batches of at most batch rows, the projection's
// gap log rows closed more than maxAge ago and the oldest rows beyond
// maxRows, and returns how many it deleted. A zero bound is not applied.
// Each batch is its own short statement, so pruning never holds locks for
// long beside the batch transactions that insert.
func (s *Store) PruneGapLog(ctx context.Context, maxAge time.Duration, maxRows, batch int) (int64, error) {
	var total int64
	for _, q := range []struct {
		on   bool
		sql  string
		args []any
	}{
		{maxAge > 0, `DELETE FROM ` + s.gapLog + ` WHERE id IN (SELECT id FROM ` + s.gapLog + `
			WHERE projection = $1 AND closed_at < now() - $2::interval ORDER BY closed_at LIMIT $3)`,
			[]any{s.projection, maxAge, batch}},
		{maxRows > 0, `DELETE FROM ` + s.gapLog + ` WHERE id IN (SELECT id FROM ` + s.gapLog + `
			WHERE projection = $1 ORDER BY id DESC OFFSET $2 LIMIT $3)`,
			[]any{s.projection, maxRows, batch}},
	} {
		for q.on {
			tag, err := s.pool.Exec(ctx, q.sql, q.args...)
			if err != nil {
				return total, fmt.Errorf("store: prune gap log: %w", err)
			}
			total += tag.RowsAffected()
			if tag.RowsAffected() < int64(batch) {
				break
			}
		}
	}
	return total, nil
}

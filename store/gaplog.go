package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// GapLogEntry is one closed gap.
type GapLogEntry struct {
	Opened    time.Time `json:"opened"`
	Closed    time.Time `json:"closed"`
	Step      string    `json:"step"`
	From      int64     `json:"from_version"`
	To        int64     `json:"to_version"`
	Held      []int64   `json:"held_versions"`
	Attempts  int       `json:"attempts"`
	Topic     string    `json:"topic"`
	Partition *int      `json:"partition"`
}

// HeldDelta is one held delta with the attempts that left it held.
type HeldDelta struct {
	Version int64  `json:"version"`
	Topic   string `json:"topic"`
	// Partition and Offset are where the delta was read; HeldBy is the
	// partition whose owner holds it (they differ when a re-read found it
	// in another partition).
	Partition   int        `json:"partition"`
	Offset      int64      `json:"offset"`
	HeldBy      int        `json:"held_by_partition"`
	EventID     string     `json:"event_id"`
	Since       time.Time  `json:"held_since"`
	Attempts    int        `json:"attempts"`
	LastStep    string     `json:"last_step"`
	LastError   string     `json:"last_error"`
	LastAttempt *time.Time `json:"last_attempt"`
}

// JobRow is a read-model row as explain shows it.
type JobRow struct {
	Version   int64
	State     []byte
	UpdatedAt time.Time
	Topic     string
	Partition *int
	Offset    *int64
	EventID   string
}

// TombstoneRow is a deleted job's tombstone as explain shows it.
type TombstoneRow struct {
	Version   int64     `json:"version"`
	DeletedAt time.Time `json:"deleted_at"`
	EventID   string    `json:"event_id"`
	Topic     string    `json:"topic"`
	Partition *int      `json:"partition"`
	Offset    *int64    `json:"offset"`
}

// Explanation is everything the store knows of one job.
type Explanation struct {
	Row *JobRow
	// Tombstone is set when the job was deleted (and not created again).
	Tombstone *TombstoneRow
	Held      []HeldDelta
	// Waiting are the versions the held deltas wait for (at most 20).
	Waiting []int64
	Gaps    []GapLogEntry
}

// Explain reads job's row, its held deltas and its newest gap log entries,
// at most gaps of them, in one snapshot. It only reads. A projection that
// has no gap log yet (not migrated since) explains without it.
func (s *Store) Explain(ctx context.Context, job string, gaps int) (*Explanation, error) {
	ex := &Explanation{Held: []HeldDelta{}, Gaps: []GapLogEntry{}}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var r JobRow
		err := tx.QueryRow(ctx, `SELECT version, state::text, updated_at, coalesce(source_topic, ''), source_partition, source_offset, coalesce(event_id, '')
			FROM `+s.jobs+` WHERE job_id = $1`, job).Scan(&r.Version, &r.State, &r.UpdatedAt, &r.Topic, &r.Partition, &r.Offset, &r.EventID)
		switch {
		case err == nil:
			ex.Row = &r
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		var hasLog, hasTombstones bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
			s.gapLog, s.tombstones).Scan(&hasLog, &hasTombstones); err != nil {
			return err
		}
		if hasTombstones {
			var t TombstoneRow
			err := tx.QueryRow(ctx, `SELECT version, deleted_at, coalesce(event_id, ''), coalesce(source_topic, ''), source_partition, source_offset
				FROM `+s.tombstones+` WHERE projection = $1 AND job_id = $2`, s.projection, job).
				Scan(&t.Version, &t.DeletedAt, &t.EventID, &t.Topic, &t.Partition, &t.Offset)
			switch {
			case err == nil:
				ex.Tombstone = &t
			case !errors.Is(err, pgx.ErrNoRows):
				return err
			}
		}
		// Columns added by later migrations are read through to_jsonb, so
		// a projection not migrated since still explains.
		rows, err := tx.Query(ctx, `SELECT version, topic, partition,
				coalesce((to_jsonb(h)->>'source_partition')::int, partition), "offset", event_id, held_since,
				coalesce((to_jsonb(h)->>'attempts')::int, 0), coalesce(to_jsonb(h)->>'last_step', ''),
				coalesce(to_jsonb(h)->>'last_error', ''), (to_jsonb(h)->>'last_attempt_at')::timestamptz
			FROM `+s.held+` h WHERE projection = $1 AND job_id = $2 ORDER BY version`, s.projection, job)
		if err != nil {
			return err
		}
		ex.Held, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (HeldDelta, error) {
			var h HeldDelta
			err := r.Scan(&h.Version, &h.Topic, &h.HeldBy, &h.Partition, &h.Offset, &h.EventID, &h.Since, &h.Attempts, &h.LastStep, &h.LastError, &h.LastAttempt)
			return h, err
		})
		if err != nil {
			return err
		}
		if !hasLog {
			return nil
		}
		rows, err = tx.Query(ctx, `SELECT opened_at, closed_at, step, from_version, to_version, held_versions, attempts, topic, partition
			FROM `+s.gapLog+` WHERE projection = $1 AND job_id = $2 ORDER BY id DESC LIMIT $3`, s.projection, job, gaps)
		if err != nil {
			return err
		}
		ex.Gaps, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (GapLogEntry, error) {
			var g GapLogEntry
			err := r.Scan(&g.Opened, &g.Closed, &g.Step, &g.From, &g.To, &g.Held, &g.Attempts, &g.Topic, &g.Partition)
			return g, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: explain %q: %w", job, err)
	}
	if len(ex.Held) > 0 {
		var row int64
		switch {
		case ex.Row != nil:
			row = ex.Row.Version
		case ex.Tombstone != nil:
			row = ex.Tombstone.Version
		}
		vs := make([]int64, len(ex.Held))
		for i, h := range ex.Held {
			vs[i] = h.Version
		}
		slices.Sort(vs)
		ex.Waiting = missing(row, vs, 20)
	}
	return ex, nil
}

// Schema is the PostgreSQL schema the projection lives in.
func (s *Store) Schema() string { return s.schema }

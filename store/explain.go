package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

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

package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Position is one partition's stored position and owner.
type Position struct {
	Topic      string    `json:"topic"`
	Partition  int       `json:"partition"`
	NextOffset int64     `json:"next_offset"`
	Epoch      int64     `json:"epoch"`
	Owner      string    `json:"owner"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// Positions lists the projection's partitions, all topics, in order.
func (s *Store) Positions(ctx context.Context) ([]Position, error) {
	rows, err := s.pool.Query(ctx, `SELECT topic, partition, next_offset, epoch, owner, updated_at
		FROM `+s.partitions+` WHERE projection = $1 ORDER BY topic, partition`, s.projection)
	if err != nil {
		return nil, fmt.Errorf("store: positions: %w", err)
	}
	defer rows.Close()
	var out []Position
	for rows.Next() {
		var p Position
		if err := rows.Scan(&p.Topic, &p.Partition, &p.NextOffset, &p.Epoch, &p.Owner, &p.UpdatedAt); err != nil {
			return nil, fmt.Errorf("store: positions: %w", err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// HeldSummary is one job's held deltas.
type HeldSummary struct {
	JobID     string `json:"job_id"`
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	// RowVersion is the job's version in the read model, or its tombstone's
	// when it was deleted (0: neither).
	RowVersion int64 `json:"row_version"`
	// Missing are the first versions the held ones wait for.
	Missing  []int64   `json:"missing_versions"`
	Versions []int64   `json:"held_versions"`
	Since    time.Time `json:"since"`
}

// HeldJobs lists the jobs with held deltas, oldest hold first, at most limit.
func (s *Store) HeldJobs(ctx context.Context, limit int) ([]HeldSummary, int, error) {
	var total int
	if err := s.pool.QueryRow(ctx, `SELECT count(DISTINCT job_id) FROM `+s.held+` WHERE projection = $1`, s.projection).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("store: held: %w", err)
	}
	// A deleted job's version is its tombstone's (a schema not migrated to
	// tombstones yet has none: status only reads).
	var hasTombstones bool
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.tombstones).Scan(&hasTombstones); err != nil {
		return nil, 0, fmt.Errorf("store: held: %w", err)
	}
	version, tombJoin := `coalesce(j.version, 0)`, ``
	if hasTombstones {
		version = `coalesce(j.version, t.version, 0)`
		tombJoin = ` LEFT JOIN ` + s.tombstones + ` t ON t.projection = $1 AND t.job_id = h.job_id`
	}
	rows, err := s.pool.Query(ctx, `SELECT h.job_id, h.topic, h.partition, `+version+`, h.versions, h.since
		FROM (SELECT job_id, min(topic) AS topic, min(partition) AS partition,
				array_agg(version ORDER BY version) AS versions, min(held_since) AS since
			FROM `+s.held+` WHERE projection = $1 GROUP BY job_id) h
		LEFT JOIN `+s.jobs+` j ON j.job_id = h.job_id`+tombJoin+`
		ORDER BY h.since, h.job_id LIMIT $2`, s.projection, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("store: held: %w", err)
	}
	defer rows.Close()
	var out []HeldSummary
	for rows.Next() {
		var h HeldSummary
		if err := rows.Scan(&h.JobID, &h.Topic, &h.Partition, &h.RowVersion, &h.Versions, &h.Since); err != nil {
			return nil, 0, fmt.Errorf("store: held: %w", err)
		}
		h.Missing = missing(h.RowVersion, h.Versions, 10)
		out = append(out, h)
	}
	return out, total, rows.Err()
}

// Quarantined is one record in the quarantine.
type Quarantined struct {
	Topic     string    `json:"topic"`
	Partition int       `json:"partition"`
	Offset    int64     `json:"offset"`
	Key       []byte    `json:"key"`
	Value     []byte    `json:"value"`
	Error     string    `json:"error"`
	CreatedAt time.Time `json:"time"`
	// Coordinate names an SQS message; zero for a Kafka record.
	Coordinate Coordinate `json:"sqs,omitzero"`
}

// Quarantine lists the newest quarantined records, at most limit, and the total.
func (s *Store) Quarantine(ctx context.Context, limit int) ([]Quarantined, int, error) {
	var total int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+s.quarantine+` WHERE projection = $1`, s.projection).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("store: quarantine: %w", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT topic, partition, "offset", key, value, error, "time",
			coalesce(message_id, ''), coalesce(sequence_number, '')
		FROM `+s.quarantine+` WHERE projection = $1 ORDER BY id DESC LIMIT $2`, s.projection, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("store: quarantine: %w", err)
	}
	defer rows.Close()
	var out []Quarantined
	for rows.Next() {
		var q Quarantined
		if err := rows.Scan(&q.Topic, &q.Partition, &q.Offset, &q.Key, &q.Value, &q.Error, &q.CreatedAt,
			&q.Coordinate.MessageID, &q.Coordinate.SequenceNumber); err != nil {
			return nil, 0, fmt.Errorf("store: quarantine: %w", err)
		}
		out = append(out, q)
	}
	return out, total, rows.Err()
}

// Jobs reads every row of the read model, for verification and tools.
func (s *Store) Jobs(ctx context.Context) (map[string]Job, error) {
	rows, err := s.pool.Query(ctx, `SELECT job_id, version, state::text, coalesce(event_id, '') FROM `+s.jobs)
	if err != nil {
		return nil, fmt.Errorf("store: jobs: %w", err)
	}
	defer rows.Close()
	out := map[string]Job{}
	for rows.Next() {
		var j Job
		var state string
		if err := rows.Scan(&j.ID, &j.Version, &state, &j.EventID); err != nil {
			return nil, fmt.Errorf("store: jobs: %w", err)
		}
		j.State = []byte(state)
		out[j.ID] = j
	}
	return out, rows.Err()
}

// CountJobs counts the read model's rows.
func (s *Store) CountJobs(ctx context.Context) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+s.jobs).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count jobs: %w", err)
	}
	return n, nil
}

// missing lists, up to limit, the versions between the row's and the
// highest held one that are not held: what the held deltas wait for.
func missing(row int64, held []int64, limit int) []int64 {
	out := []int64{}
	next := row + 1
	for _, v := range held {
		for ; next < v && len(out) < limit; next++ {
			out = append(out, next)
		}
		next = max(next, v+1)
	}
	return out
}

// Ping checks that PostgreSQL answers, for readiness.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("store: ping: %w", err)
	}
	return nil
}

// OpenReadOnly connects like [Open], but every transaction of the pool is
// read-only (default_transaction_read_only): a Store opened so can read
// the projection and never create or alter anything, which is what a
// monitoring command needs and all the rights it should need. It does not
// migrate; [Store.CheckExists] says whether there is anything to read.
func OpenReadOnly(ctx context.Context, databaseURL string, cfg Config) (*Store, error) {
	pcfg, err := parseURL(databaseURL)
	if err != nil {
		return nil, err
	}
	pcfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	pcfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("store: connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: connect to %s: %w", redact(pcfg.ConnConfig), err)
	}
	s, err := New(pool, cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.ownPool = true
	return s, nil
}

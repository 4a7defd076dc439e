package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Held is a delta waiting for the versions before it.
type Held struct {
	JobID   string
	Version int64
	// Partition is the partition whose owner holds it (and reloads it on
	// claim). SourcePartition and Offset are where the delta was read: a
	// re-read may find it in another partition.
	Partition       int
	SourcePartition int
	Offset          int64
	Ops             json.RawMessage
	EventID         string
	Since           time.Time
	// LogTime is the record's broker timestamp; zero when unknown.
	LogTime time.Time
	// Coordinate names an SQS message; zero for a Kafka record.
	Coordinate Coordinate
}

// LoadHeld reads the held deltas a partition's previous owner stored.
func (s *Store) LoadHeld(ctx context.Context, topic string, p int) ([]Held, error) {
	return s.loadHeld(ctx, topic, p, true, nil)
}

// LoadHeldIndex is LoadHeld without the ops: what is held and where it
// came from, for a caller that reads the ops it keeps in memory with
// [Store.LoadHeldOps] and leaves the rest in PostgreSQL.
func (s *Store) LoadHeldIndex(ctx context.Context, topic string, p int) ([]Held, error) {
	return s.loadHeld(ctx, topic, p, false, nil)
}

// LoadHeldOf is LoadHeld for the given jobs alone: a caller without an
// owner's view of a partition (another instance on the same queue holds
// deltas too) reads what is held for the jobs it found out of date.
func (s *Store) LoadHeldOf(ctx context.Context, topic string, p int, ids []string) ([]Held, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	return s.loadHeld(ctx, topic, p, true, ids)
}

// loadHeld reads held deltas ordered by job and version, with their ops
// or without, of every job or only of ids when it is not nil.
func (s *Store) loadHeld(ctx context.Context, topic string, p int, withOps bool, ids []string) ([]Held, error) {
	ops := "NULL::text"
	if withOps {
		ops = "ops::text"
	}
	rows, err := s.pool.Query(ctx, `SELECT job_id, version, partition, coalesce(source_partition, partition), "offset",
			`+ops+`, event_id, held_since, log_time, coalesce(message_id, ''), coalesce(sequence_number, '')
		FROM `+s.held+` WHERE projection = $1 AND topic = $2 AND partition = $3
			AND ($4::text[] IS NULL OR job_id = ANY($4::text[]))
		ORDER BY job_id, version`,
		s.projection, topic, p, ids)
	if err != nil {
		return nil, fmt.Errorf("store: load held %s/%d: %w", topic, p, err)
	}
	defer rows.Close()
	var out []Held
	for rows.Next() {
		var h Held
		var ops *string
		var logTime *time.Time
		if err := rows.Scan(&h.JobID, &h.Version, &h.Partition, &h.SourcePartition, &h.Offset, &ops, &h.EventID, &h.Since, &logTime,
			&h.Coordinate.MessageID, &h.Coordinate.SequenceNumber); err != nil {
			return nil, fmt.Errorf("store: load held %s/%d: %w", topic, p, err)
		}
		if ops != nil {
			h.Ops = json.RawMessage(*ops)
		}
		if logTime != nil {
			h.LogTime = *logTime
		}
		out = append(out, h)
	}
	return out, rows.Err()
}

// HeldKey names one held delta.
type HeldKey struct {
	JobID   string
	Version int64
}

// hold inserts b's newly held deltas, each only while its job's row (or
// tombstone) is still behind it: at or below its version minus two, so
// that a version between them is missing. A delta whose job is not behind
// any more (another writer moved the row since the batch was planned: an
// unfenced source's other instance, or a stale view of the row) is never
// stored as held, where nothing would release it; the batch fails with a
// *[StaleError] naming its job, and its planner reads the row again and
// applies the delta, or drops it as a duplicate.
func (s *Store) hold(ctx context.Context, tx pgx.Tx, b *Batch) error {
	if len(b.Hold) == 0 {
		return nil
	}
	ids := make([]string, len(b.Hold))
	vers := make([]int64, len(b.Hold))
	parts := make([]int32, len(b.Hold))
	srcs := make([]int32, len(b.Hold))
	offs := make([]int64, len(b.Hold))
	ops := make([]string, len(b.Hold))
	evs := make([]string, len(b.Hold))
	since := make([]time.Time, len(b.Hold))
	logTimes := make([]*time.Time, len(b.Hold))
	msgIDs, seqs := make([]*string, len(b.Hold)), make([]*string, len(b.Hold))
	for i, h := range b.Hold {
		ids[i], vers[i], parts[i], srcs[i] = h.JobID, h.Version, int32(h.Partition), int32(h.SourcePartition)
		offs[i], ops[i], evs[i], since[i] = h.Offset, string(h.Ops), h.EventID, h.Since
		if !h.LogTime.IsZero() {
			logTimes[i] = &h.LogTime
		}
		msgIDs[i], seqs[i] = b.coordinate(h.Offset, h.Coordinate)
	}
	// The job's version is its row's, else its tombstone's, else 0, as
	// LoadJobs reads it; the statement sees this batch's own writes.
	rows, err := tx.Query(ctx, `WITH i AS (
			SELECT * FROM unnest($3::text[], $4::bigint[], $5::int[], $6::int[], $7::bigint[], $8::text[], $9::text[],
				$10::timestamptz[], $11::timestamptz[], $12::text[], $13::text[]) AS i(job_id, version, part, src, off, ops, ev, since, logt, msg, seq)
		), cur AS (
			SELECT i.*, coalesce(j.version, t.version, 0) AS at
			FROM i LEFT JOIN `+s.jobs+` j ON j.job_id = i.job_id
			LEFT JOIN `+s.tombstones+` t ON t.projection = $1 AND t.job_id = i.job_id
		), ins AS (
			INSERT INTO `+s.held+`
				(projection, job_id, version, topic, partition, source_partition, "offset", ops, event_id, held_since, log_time,
				 message_id, sequence_number)
			SELECT $1, cur.job_id, cur.version, $2, cur.part, cur.src, cur.off, cur.ops::jsonb, cur.ev, cur.since, cur.logt, cur.msg, cur.seq
			FROM cur WHERE cur.version > cur.at + 1
			ON CONFLICT (projection, job_id, version) DO NOTHING
		)
		SELECT DISTINCT job_id FROM cur WHERE cur.version <= cur.at + 1 ORDER BY job_id`,
		s.projection, b.Topic, ids, vers, parts, srcs, offs, ops, evs, since, logTimes, msgIDs, seqs)
	if err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: hold: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	notBehind, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: hold: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	if len(notBehind) > 0 {
		return &StaleError{Jobs: notBehind}
	}
	return nil
}

// heldInLine checks, for a batch without an owner ([Batch.Unfenced]),
// that every job it wrote or held keeps no held delta its row has caught
// up with. Another instance may hold deltas of the same job that this
// batch's planner never saw; a write that fills their gap, or covers
// them, would leave them held with nothing to release them. Such jobs
// fail the batch with a *[StaleError]: its planner reads their rows and
// held deltas again and releases them in the batch that fills the gap.
// The job stripe locks ([Store.lockJobs], exclusive for an unfenced
// batch's held jobs) order this check and [Store.hold] of two instances,
// so each sees what the other committed.
func (s *Store) heldInLine(ctx context.Context, tx pgx.Tx, b *Batch) error {
	if !b.Unfenced {
		return nil
	}
	ids := make([]string, 0, len(b.Snapshots)+len(b.Deletes)+len(b.Updates)+len(b.Hold))
	for _, ws := range [][]Write{b.Snapshots, b.Deletes, b.Updates} {
		for _, w := range ws {
			ids = append(ids, w.JobID)
		}
	}
	for _, h := range b.Hold {
		ids = append(ids, h.JobID)
	}
	if len(ids) == 0 {
		return nil
	}
	asideIDs := make([]string, len(b.Aside))
	asideVers := make([]int64, len(b.Aside))
	for i, k := range b.Aside {
		asideIDs[i], asideVers[i] = k.JobID, k.Version
	}
	rows, err := tx.Query(ctx, `WITH w AS (
			SELECT DISTINCT job_id FROM unnest($2::text[]) AS w(job_id)
		), cur AS (
			SELECT w.job_id, coalesce(j.version, t.version, 0) AS at
			FROM w LEFT JOIN `+s.jobs+` j ON j.job_id = w.job_id
			LEFT JOIN `+s.tombstones+` t ON t.projection = $1 AND t.job_id = w.job_id
		)
		SELECT DISTINCT h.job_id FROM `+s.held+` h JOIN cur ON cur.job_id = h.job_id
		WHERE h.projection = $1 AND h.topic = $3 AND h.partition = $4 AND h.version <= cur.at + 1
			AND NOT EXISTS (SELECT 1 FROM unnest($5::text[], $6::bigint[]) AS a(job_id, version)
				WHERE a.job_id = h.job_id AND a.version = h.version)
		ORDER BY h.job_id`, s.projection, ids, b.Topic, b.Partition, asideIDs, asideVers)
	if err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: held in line: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	inLine, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: held in line: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	if len(inLine) > 0 {
		return &StaleError{Jobs: inLine}
	}
	return nil
}

// release deletes the held deltas b applied or covered.
func (s *Store) release(ctx context.Context, tx pgx.Tx, b *Batch) error {
	if len(b.Release) == 0 {
		return nil
	}
	ids := make([]string, len(b.Release))
	vers := make([]int64, len(b.Release))
	for i, k := range b.Release {
		ids[i], vers[i] = k.JobID, k.Version
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+s.held+` h USING unnest($2::text[], $3::bigint[]) AS i(job_id, version)
		WHERE h.projection = $1 AND h.job_id = i.job_id AND h.version = i.version`,
		s.projection, ids, vers); err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: release: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	return nil
}

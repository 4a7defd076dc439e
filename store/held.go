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
	return s.loadHeld(ctx, topic, p, true)
}

// LoadHeldIndex is LoadHeld without the ops: what is held and where it
// came from, for a caller that reads the ops it keeps in memory with
// [Store.LoadHeldOps] and leaves the rest in PostgreSQL.
func (s *Store) LoadHeldIndex(ctx context.Context, topic string, p int) ([]Held, error) {
	return s.loadHeld(ctx, topic, p, false)
}

func (s *Store) loadHeld(ctx context.Context, topic string, p int, withOps bool) ([]Held, error) {
	ops := "NULL::text"
	if withOps {
		ops = "ops::text"
	}
	rows, err := s.pool.Query(ctx, `SELECT job_id, version, partition, coalesce(source_partition, partition), "offset",
			`+ops+`, event_id, held_since, log_time, coalesce(message_id, ''), coalesce(sequence_number, '')
		FROM `+s.held+` WHERE projection = $1 AND topic = $2 AND partition = $3 ORDER BY job_id, version`,
		s.projection, topic, p)
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

// hold inserts b's newly held deltas.
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
	if _, err := tx.Exec(ctx, `INSERT INTO `+s.held+`
			(projection, job_id, version, topic, partition, source_partition, "offset", ops, event_id, held_since, log_time,
			 message_id, sequence_number)
		SELECT $1, i.job_id, i.version, $2, i.part, i.src, i.off, i.ops::jsonb, i.ev, i.since, i.logt, i.msg, i.seq
		FROM unnest($3::text[], $4::bigint[], $5::int[], $6::int[], $7::bigint[], $8::text[], $9::text[],
			$10::timestamptz[], $11::timestamptz[], $12::text[], $13::text[]) AS i(job_id, version, part, src, off, ops, ev, since, logt, msg, seq)
		ON CONFLICT (projection, job_id, version) DO NOTHING`,
		s.projection, b.Topic, ids, vers, parts, srcs, offs, ops, evs, since, logTimes, msgIDs, seqs); err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: hold: %w", b.Topic, b.Partition, b.NextOffset, err)
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

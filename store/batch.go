package store

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projector/projector/internal/buildhook/failpoint"
)

// StaleError means the batch was planned from a view of some rows that is
// out of date: an update did not apply although its expected version came
// from that view, a delta to be held is not behind its job's row any more
// ([Store.hold]), or, in an unfenced batch, a job it touched keeps held
// deltas its row has caught up with ([Store.heldInLine]). Another writer
// moved those rows, or held those deltas. The batch was rolled back;
// reload the jobs (with their held deltas, where another instance may
// hold some) and classify their events again.
type StaleError struct{ Jobs []string }

func (e *StaleError) Error() string {
	return fmt.Sprintf("store: %d job rows moved under this batch (first %q); reload and retry", len(e.Jobs), e.Jobs[0])
}

// Job is one read-model row, or a deleted job's tombstone.
type Job struct {
	ID      string
	Version int64
	State   json.RawMessage
	EventID string
	// LastOps are the ops of the delta that made Version; nil when a
	// snapshot did.
	LastOps json.RawMessage
	// Deleted reports a tombstone: the job was deleted at Version and has
	// no row and no State.
	Deleted bool
}

// LoadJobs reads the rows of ids that exist, and the tombstones of those
// deleted; a job with neither is at version 0.
func (s *Store) LoadJobs(ctx context.Context, ids []string) (map[string]Job, error) {
	out := make(map[string]Job, len(ids))
	err := s.EachJob(ctx, ids, func(j Job) { out[j.ID] = j })
	if err != nil {
		return nil, err
	}
	return out, nil
}

// EachJob is [Store.LoadJobs] handing each row or tombstone found to fn as
// it is read, with no map of them: a batch's planner keeps its own. ids
// should hold each job once; one with neither row nor tombstone is not
// handed over.
func (s *Store) EachJob(ctx context.Context, ids []string, fn func(Job)) error {
	return loadJobs(ctx, s.pool, s.jobs, s.tombstones, s.projection, ids, fn)
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func loadJobs(ctx context.Context, q querier, table, tombstones, projection string, ids []string, fn func(Job)) error {
	if len(ids) == 0 {
		return nil
	}
	// Planned for its arguments every time, as the batch's statements are
	// (see fence): a generic plan of a table that started empty scans it.
	rows, err := q.Query(ctx, `SELECT job_id, version, state::text, coalesce(event_id, ''), coalesce(last_ops::text, ''), false
		FROM `+table+` WHERE job_id = ANY($1::text[])
		UNION ALL
		SELECT t.job_id, t.version, '', coalesce(t.event_id, ''), '', true
		FROM `+tombstones+` t WHERE t.projection = $2 AND t.job_id = ANY($1::text[])
			AND NOT EXISTS (SELECT 1 FROM `+table+` j WHERE j.job_id = t.job_id)`, pgx.QueryExecModeCacheDescribe, ids, projection)
	if err != nil {
		return fmt.Errorf("store: load %d jobs: %w", len(ids), err)
	}
	defer rows.Close()
	for rows.Next() {
		var j Job
		// Scanned as bytes, each copied once out of the row (as a string
		// and then to bytes was twice).
		var state, lastOps []byte
		if err := rows.Scan(&j.ID, &j.Version, &state, &j.EventID, &lastOps, &j.Deleted); err != nil {
			return fmt.Errorf("store: load jobs: %w", err)
		}
		if !j.Deleted {
			j.State = json.RawMessage(state)
		}
		if len(lastOps) > 0 {
			j.LastOps = json.RawMessage(lastOps)
		}
		fn(j)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("store: load jobs: %w", err)
	}
	return nil
}

// writeKind says which of [Store.applyUpdates]'s statements makes a write.
type writeKind uint8

const (
	kindUpdate   writeKind = iota // a row at the expected version
	kindInsert                    // no row and no tombstone
	kindNew                       // no row and no tombstone, known so (Write.New)
	kindRevive                    // a tombstone the write replaces by a row
	kindDelRow                    // a delete of a row
	kindDelNew                    // a delete of a job never written
	kindRedelete                  // a delete at a later version of a deleted job
	kindCount
)

func kindOf(w *Write) writeKind {
	switch {
	case w.Deleted && w.ExpectDeleted:
		return kindRedelete
	case w.Deleted && w.Expect == 0:
		return kindDelNew
	case w.Deleted:
		return kindDelRow
	case w.ExpectDeleted:
		return kindRevive
	case w.Expect == 0 && w.New:
		return kindNew
	case w.Expect == 0:
		return kindInsert
	}
	return kindUpdate
}

// Write is the new state of one job. Its bytes (State, LastOps) must not
// change while [Store.Apply] runs: they are passed to PostgreSQL without
// being copied.
type Write struct {
	JobID   string
	Version int64
	State   json.RawMessage
	// Deleted makes the new state "absent": the row goes and a tombstone
	// at Version stays. State is ignored.
	Deleted bool
	// Expect is the version the row must be at for an [Batch.Updates] write
	// to apply; 0 means the row must not exist, and no tombstone either.
	// Ignored for snapshots and deletes.
	Expect int64
	// ExpectEventID is the event id of the row an update was computed from
	// ("" for none): with Expect it makes the condition, so a row rewritten
	// at the same version (verify --repair) is not built upon blindly.
	ExpectEventID string
	// ExpectDeleted means the job must be deleted at Expect (a tombstone,
	// no row) for an [Batch.Updates] write to apply.
	ExpectDeleted bool
	// Offset and EventID record where the state came from.
	Offset  int64
	EventID string
	// LastOps are the ops of the delta that made Version, for an update;
	// nil when a snapshot did.
	LastOps json.RawMessage
	// New says, for an [Batch.Updates] write with Expect 0, that the
	// writer knows the job has neither row nor tombstone (a rebuild into
	// an empty table that keeps the set of jobs it wrote). Such writes
	// are copied in (COPY), PostgreSQL's cheapest way to take rows,
	// without the insert's conflict check. Knowing wrong costs a retry,
	// not a row: a tombstone, or a row met by the copy, fails the batch
	// with a *[StaleError] naming the jobs, and nothing of it is written.
	// Only for a table written through this package alone, with no rules
	// or row-level security (COPY ignores the one and refuses the other):
	// a rebuild's shadow, made by the migrations. COPY is not seen by a
	// pool's query tracer.
	New bool
}

// Bad is a record that broke the wire format.
type Bad struct {
	// Partition is where the record was read; -1 means the batch's.
	Partition  int
	Offset     int64
	Key, Value []byte
	Err        string
	// Coordinate names the SQS message the record was read from; zero for
	// Kafka, or when the batch's [Batch.Coordinates] name it by offset.
	Coordinate Coordinate
}

// Batch is everything one partition's batch changes, committed at once.
type Batch struct {
	Topic     string
	Partition int
	Epoch     int64
	// Unfenced is a batch of a source with no owners to fence (SQS): the
	// partition's row is neither checked nor written, and the conditional
	// writes alone decide what applies.
	Unfenced bool
	// Coordinates name, by offset, the SQS messages of the batch, for its
	// held and quarantine rows.
	Coordinates map[int64]Coordinate
	// NextOffset is the position after this batch: last offset read + 1.
	NextOffset int64
	// Last is the batch's last record, stored with the position so that a
	// new log under the same name is told from the one read (nil: keep
	// the one stored).
	Last *LogMark
	// Snapshots are applied where the row's version is below theirs; at
	// most one per job (fold first).
	Snapshots []Write
	// Deletes are applied where the job's version (its row's, or its
	// tombstone's) is below theirs, like snapshots; at most one per job,
	// not also in Snapshots (fold first).
	Deletes []Write
	// Updates are states computed from a known row; applied only where the
	// row is still at Expect. One per job; not also in Snapshots or
	// Deletes.
	Updates []Write
	Hold    []Held
	Release []HeldKey
	// Aside are held deltas the batch's planner knows of and leaves held
	// on purpose although its writes may put them in line: it isolates
	// a refused batch and applies them one at a time next. An unfenced
	// batch's check of held deltas in line ([Store.heldInLine]) passes
	// over them.
	Aside []HeldKey
	Bad   []Bad
	// Gaps are the gaps this batch closes, for the gap log; Attempts the
	// gap attempts that left their jobs held, recorded on the held rows.
	Gaps     []GapClosed
	Attempts []Attempt
}

// Result tells which writes applied.
type Result struct {
	// SnapshotsApplied maps each job whose snapshot write applied to the
	// version its row had before (0: no row); the others were stale.
	SnapshotsApplied map[string]int64
	// SnapshotConflicts are jobs whose snapshot did not apply because the
	// row is at the same version with other content: the first applied
	// wins, and the conflict is the caller's to report.
	SnapshotConflicts map[string]bool
	// DeletesApplied maps each job whose delete applied to the version
	// it was at before (its row's or its tombstone's; 0: neither); the
	// others were stale.
	DeletesApplied map[string]int64
	// DeleteConflicts are jobs whose delete did not apply because the row
	// is at the delete's version: a state and "absent" at one version.
	DeleteConflicts map[string]bool
}

// Apply commits b in one transaction: fence, writes, held rows, quarantine
// and position. It returns [ErrFenced] if another owner claimed the
// partition, or a *[StaleError] if an update's row moved; both roll back.
// Its steps run in this order: [Store.fence] (which also takes the job
// locks of [Store.lockJobs], in the same round trip), [Store.applySnapshots], [Store.applyDeletes], [Store.applyUpdates],
// [Store.hold], [Store.writeGapLog], [Store.release], [Store.heldInLine],
// [Store.writeQuarantine], then the commit.
func (s *Store) Apply(ctx context.Context, b *Batch) (Result, error) {
	res := Result{SnapshotsApplied: make(map[string]int64, len(b.Snapshots)), DeletesApplied: make(map[string]int64, len(b.Deletes))}
	// The fence argument (docs/design.md) assumes READ COMMITTED: each
	// statement sees rows committed before it started. Pin it rather than
	// inherit whatever default_transaction_isolation the server has.
	tx, err := s.pool.BeginTx(ctx, readCommitted)
	if err != nil {
		return res, fmt.Errorf("store: apply %s/%d@%d: begin: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := s.fence(ctx, tx, b); err != nil {
		return res, err
	}
	if err := s.applySnapshots(ctx, tx, b, &res); err != nil {
		return res, err
	}
	if len(b.Deletes) > 0 {
		if err := s.applyDeletes(ctx, tx, b, &res); err != nil {
			return res, err
		}
	}
	if len(b.Updates) > 0 {
		if err := s.applyUpdates(ctx, tx, b); err != nil {
			return res, err
		}
	}
	if err := s.hold(ctx, tx, b); err != nil {
		return res, err
	}
	if err := s.writeGapLog(ctx, tx, b); err != nil {
		return res, err
	}
	if err := s.release(ctx, tx, b); err != nil {
		return res, err
	}
	if err := s.heldInLine(ctx, tx, b); err != nil {
		return res, err
	}
	if err := s.writeQuarantine(ctx, tx, b); err != nil {
		return res, err
	}
	failpoint.Hit(failpoint.BeforeCommit)
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("store: apply %s/%d@%d: commit: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	return res, nil
}

// applySnapshots writes b's snapshots where the row's version is below
// theirs, recording in res which applied and which met a conflict.
func (s *Store) applySnapshots(ctx context.Context, tx pgx.Tx, b *Batch, res *Result) error {
	if len(b.Snapshots) == 0 {
		return nil
	}
	err := inChunks(b.Snapshots, func(ws []Write) error { return s.snapshotChunk(ctx, tx, b, ws, res) })
	if err != nil {
		return err
	}
	if err := s.snapshotConflicts(ctx, tx, b, res); err != nil {
		return err
	}
	return nil
}

// snapshotChunk is [Store.applySnapshots] for a part of the batch's
// snapshots ([inChunks]).
func (s *Store) snapshotChunk(ctx context.Context, tx pgx.Tx, b *Batch, ws []Write, res *Result) error {
	ids, vers, states, offs, evs := columns(ws)
	// The CTEs read the rows and tombstones as they were before this
	// statement, which tells how far each applied snapshot moved its
	// job. A tombstone at or above a snapshot keeps the job deleted;
	// one below it is removed as the snapshot creates the job again.
	// lockJobs makes the tombstone check and the write atomic.
	rows, err := s.query(ctx, tx, `WITH old AS (
			SELECT job_id, version FROM `+s.jobs+` WHERE job_id = ANY($1::text[])
		), tomb AS (
			SELECT job_id, version FROM `+s.tombstones+` WHERE projection = $8 AND job_id = ANY($1::text[])
		), ins AS (
			INSERT INTO `+s.jobs+` AS t
			(job_id, version, state, updated_at, source_topic, source_partition, source_offset, event_id)
			SELECT i.job_id, i.version, i.state::jsonb, now(), $6, $7, i.off, NULLIF(i.event_id, '')
			FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[]) AS i(job_id, version, state, off, event_id)
			WHERE NOT EXISTS (SELECT 1 FROM tomb WHERE tomb.job_id = i.job_id AND tomb.version >= i.version)
			ON CONFLICT (job_id) DO UPDATE SET
				version = excluded.version, state = excluded.state, updated_at = excluded.updated_at,
				source_topic = excluded.source_topic, source_partition = excluded.source_partition,
				source_offset = excluded.source_offset, event_id = excluded.event_id, last_ops = NULL
			WHERE t.version < excluded.version
			RETURNING t.job_id, t.version
		), revived AS (
			DELETE FROM `+s.tombstones+` d USING ins
			WHERE d.projection = $8 AND d.job_id = ins.job_id AND d.version < ins.version
		)
		SELECT ins.job_id, coalesce(old.version, tomb.version, 0) FROM ins
		LEFT JOIN old ON old.job_id = ins.job_id LEFT JOIN tomb ON tomb.job_id = ins.job_id`,
		ids, vers, states, offs, evs, b.Topic, b.Partition, s.projection)
	if err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: snapshots: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	var id string
	var before int64
	_, err = pgx.ForEachRow(rows, []any{&id, &before}, func() error {
		res.SnapshotsApplied[id] = before
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: snapshots: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	return nil
}

// writeQuarantine stores b's records that broke the wire format or that
// PostgreSQL refused. A record already quarantined (read again) is not
// stored twice. The offset of an SQS record only stands for its message
// (see [Coordinate]): two messages may share one, and the second is then
// stored at the next free offset rather than dropped as a duplicate of the
// first ([Store.quarantineApart]).
func (s *Store) writeQuarantine(ctx context.Context, tx pgx.Tx, b *Batch) error {
	if len(b.Bad) == 0 {
		return nil
	}
	parts := make([]int32, len(b.Bad))
	offs := make([]int64, len(b.Bad))
	keys := make([][]byte, len(b.Bad))
	vals := make([][]byte, len(b.Bad))
	errs := make([]string, len(b.Bad))
	msgIDs, seqs := make([]*string, len(b.Bad)), make([]*string, len(b.Bad))
	for i, r := range b.Bad {
		msgIDs[i], seqs[i] = b.coordinate(r.Offset, r.Coordinate)
		// The reason quotes input: keep it text PostgreSQL accepts.
		reason := strings.ToValidUTF8(strings.ReplaceAll(r.Err, "\x00", ""), "\uFFFD")
		parts[i], offs[i], keys[i], vals[i], errs[i] = int32(r.Partition), r.Offset, r.Key, r.Value, reason
		if r.Partition < 0 {
			parts[i] = int32(b.Partition)
		}
	}
	rows, err := tx.Query(ctx, `INSERT INTO `+s.quarantine+` (projection, topic, partition, "offset", key, value, error, message_id, sequence_number)
		SELECT $1, $2, i.part, i.off, i.key, i.value, i.err, i.msg, i.seq
		FROM unnest($3::int[], $4::bigint[], $5::bytea[], $6::bytea[], $7::text[], $8::text[], $9::text[]) AS i(part, off, key, value, err, msg, seq)
		ON CONFLICT (projection, topic, partition, "offset") DO NOTHING
		RETURNING partition, "offset", coalesce(message_id, '')`,
		s.projection, b.Topic, parts, offs, keys, vals, errs, msgIDs, seqs)
	if err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: quarantine: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	type stored struct {
		part int32
		off  int64
		msg  string
	}
	inserted := map[stored]bool{}
	var k stored
	if _, err := pgx.ForEachRow(rows, []any{&k.part, &k.off, &k.msg}, func() error {
		inserted[k] = true
		return nil
	}); err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: quarantine: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	for i := range b.Bad {
		if msgIDs[i] == nil || inserted[stored{parts[i], offs[i], *msgIDs[i]}] {
			// A Kafka record's offset is its own: a conflict is the same
			// record, quarantined before.
			continue
		}
		if err := s.quarantineApart(ctx, tx, b.Topic, parts[i], offs[i], keys[i], vals[i], errs[i], msgIDs[i], seqs[i]); err != nil {
			return fmt.Errorf("store: apply %s/%d@%d: quarantine: %w", b.Topic, b.Partition, b.NextOffset, err)
		}
	}
	return nil
}

// quarantineApartTries bounds the search for a free offset: two SQS
// messages sharing an offset is already rare.
const quarantineApartTries = 64

// quarantineApart stores an SQS record whose offset another row holds:
// nothing if that row is the same message (delivered again), else at the
// first offset after it that is free or holds the same message.
func (s *Store) quarantineApart(ctx context.Context, tx pgx.Tx, topic string, part int32, off int64, key, value []byte, reason string, msgID, seq *string) error {
	for range quarantineApartTries {
		var there string
		err := tx.QueryRow(ctx, `SELECT coalesce(message_id, '') FROM `+s.quarantine+`
			WHERE projection = $1 AND topic = $2 AND partition = $3 AND "offset" = $4`, s.projection, topic, part, off).Scan(&there)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			if _, err := tx.Exec(ctx, `INSERT INTO `+s.quarantine+` (projection, topic, partition, "offset", key, value, error, message_id, sequence_number)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`, s.projection, topic, part, off, key, value, reason, msgID, seq); err != nil {
				return err
			}
			return nil
		case err != nil:
			return err
		case there == *msgID:
			return nil
		}
		if off == math.MaxInt64 {
			off = 0
		} else {
			off++
		}
	}
	return fmt.Errorf("message %s: no free offset within %d of %d", *msgID, quarantineApartTries, off)
}

// Coordinate names a record read from SQS, which has no partition and
// offset: its message id and, on a FIFO queue, its 128-bit sequence
// number. The record's Offset stands for it in keys (see the migration
// 006_sqs_coordinates.sql).
type Coordinate struct {
	MessageID      string `json:"message_id,omitempty"`
	SequenceNumber string `json:"sequence_number,omitempty"`
}

// coordinate is the SQS message id and sequence number of a record: c,
// its own, when set, else the batch's coordinate at offset (which two
// messages sharing an offset would make ambiguous); nil for a Kafka record.
func (b *Batch) coordinate(offset int64, c Coordinate) (msgID, seq *string) {
	if bc, ok := b.Coordinates[offset]; ok && c.MessageID == "" {
		c = bc
	}
	if c.MessageID != "" {
		msgID = &c.MessageID
	}
	if c.SequenceNumber != "" {
		seq = &c.SequenceNumber
	}
	return msgID, seq
}

// snapshotConflicts looks, among the snapshots that did not apply, for rows
// at the same version with other content. Only batches with stale
// snapshots pay for the query.
func (s *Store) snapshotConflicts(ctx context.Context, tx pgx.Tx, b *Batch, res *Result) error {
	var missed []Write
	for _, w := range b.Snapshots {
		if _, ok := res.SnapshotsApplied[w.JobID]; !ok {
			missed = append(missed, w)
		}
	}
	if len(missed) == 0 {
		return nil
	}
	res.SnapshotConflicts = map[string]bool{}
	err := inChunks(missed, func(missed []Write) error {
		ids, vers, states, _, _ := columns(missed)
		rows, err := tx.Query(ctx, `SELECT j.job_id FROM `+s.jobs+` j
			JOIN unnest($1::text[], $2::bigint[], $3::text[]) AS i(job_id, version, state)
			ON j.job_id = i.job_id AND j.version = i.version AND j.state <> i.state::jsonb`, ids, vers, states)
		if err != nil {
			return err
		}
		conflicts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, id := range conflicts {
			res.SnapshotConflicts[id] = true
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: conflicts: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	return nil
}

func (s *Store) applyUpdates(ctx context.Context, tx pgx.Tx, b *Batch) error {
	// Each write goes to the statement of its kind; most are plain
	// updates, so a batch of nothing else passes its writes as they are,
	// and the others are cut from an array sized once (grown by doubling,
	// copying writes of ~150 bytes was the largest allocation of a batch
	// after the statements' parameters).
	kinds := make([]writeKind, len(b.Updates))
	var count [kindCount]int
	for i := range b.Updates {
		kinds[i] = kindOf(&b.Updates[i])
		count[kinds[i]]++
	}
	var byKind [kindCount][]Write
	if count[kindUpdate] == len(b.Updates) {
		byKind[kindUpdate] = b.Updates
	} else {
		all := make([]Write, len(b.Updates))
		for k := range byKind {
			byKind[k], all = all[:0:count[k]], all[count[k]:]
		}
		for i := range b.Updates {
			byKind[kinds[i]] = append(byKind[kinds[i]], b.Updates[i])
		}
	}
	upd, ins, revive, delRow, delNew, redelete := byKind[kindUpdate], byKind[kindInsert], byKind[kindRevive], byKind[kindDelRow], byKind[kindDelNew], byKind[kindRedelete]
	if err := s.copyNew(ctx, tx, b, byKind[kindNew]); err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: new jobs: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	applied := make(map[string]struct{}, len(b.Updates))
	for _, w := range byKind[kindNew] {
		applied[w.JobID] = struct{}{}
	}
	collect := func(rows pgx.Rows, err error) error {
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, id := range ids {
			applied[id] = struct{}{}
		}
		return err
	}
	err := inChunks(upd, func(upd []Write) error {
		ids, vers, states, offs, evs := columns(upd)
		expect := make([]int64, len(upd))
		expectEv := make([]string, len(upd))
		for i, w := range upd {
			expect[i], expectEv[i] = w.Expect, w.ExpectEventID
		}
		return collect(s.query(ctx, tx, `UPDATE `+s.jobs+` AS t SET
				version = i.version, state = i.state::jsonb, updated_at = now(),
				source_topic = $8, source_partition = $9, source_offset = i.off, event_id = NULLIF(i.event_id, ''),
				last_ops = NULLIF(i.last_ops, '')::jsonb
			FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[], $6::bigint[], $7::text[], $10::text[])
				AS i(job_id, version, state, off, event_id, expect, last_ops, expect_ev)
			WHERE t.job_id = i.job_id AND t.version = i.expect AND coalesce(t.event_id, '') = i.expect_ev
			RETURNING t.job_id`, ids, vers, states, offs, evs, expect, lastOps(upd), b.Topic, b.Partition, expectEv))
	})
	if err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: updates: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	err = inChunks(ins, func(ins []Write) error {
		ids, vers, states, offs, evs := columns(ins)
		// A job never seen has no tombstone either: one that appeared
		// meanwhile means the job was deleted, and the batch is stale.
		return collect(s.query(ctx, tx, `INSERT INTO `+s.jobs+`
			(job_id, version, state, updated_at, source_topic, source_partition, source_offset, event_id, last_ops)
			SELECT i.job_id, i.version, i.state::jsonb, now(), $7, $8, i.off, NULLIF(i.event_id, ''), NULLIF(i.last_ops, '')::jsonb
			FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[], $6::text[]) AS i(job_id, version, state, off, event_id, last_ops)
			WHERE NOT EXISTS (SELECT 1 FROM `+s.tombstones+` t WHERE t.projection = $9 AND t.job_id = i.job_id)
			ON CONFLICT (job_id) DO NOTHING
			RETURNING job_id`, ids, vers, states, offs, evs, lastOps(ins), b.Topic, b.Partition, s.projection))
	})
	if err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: inserts: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	err = inChunks(revive, func(revive []Write) error { return collect(s.revive(ctx, tx, b, revive)) })
	if err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: recreate deleted jobs: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	for _, kind := range []struct {
		writes []Write
		sql    string
	}{{delRow, deleteRowSQL}, {delNew, deleteNewSQL}, {redelete, redeleteSQL}} {
		if len(kind.writes) == 0 {
			continue
		}
		if err := collect(s.deleteExpected(ctx, tx, b, kind.sql, kind.writes)); err != nil {
			return fmt.Errorf("store: apply %s/%d@%d: deletes: %w", b.Topic, b.Partition, b.NextOffset, err)
		}
	}
	if len(applied) < len(b.Updates) {
		stale := &StaleError{}
		for _, w := range b.Updates {
			if _, ok := applied[w.JobID]; !ok {
				stale.Jobs = append(stale.Jobs, w.JobID)
			}
		}
		return stale
	}
	return nil
}

// The bounds of one statement's writes ([inChunks]).
const (
	chunkRows  = 1000
	chunkBytes = 256 << 10
)

// inChunks calls write with consecutive parts of ws, in order, each of at
// most chunkRows writes and, past its first, chunkBytes of job ids, states
// and ops. A statement's parameters are encoded whole, twice over (the
// encoded arrays, kept for the next statement, and the protocol message),
// before any is sent: one statement for a batch of 5,000 writes held
// several megabytes of each for every batch being written. The parts are
// statements of one transaction, so the batch is as atomic as before. A batch has one write per job of a
// kind (see [Batch]), so no job is in two parts: a second write of a job
// in another part would not meet PostgreSQL's "cannot affect row a second
// time" as it would in one statement.
func inChunks(ws []Write, write func([]Write) error) error {
	for len(ws) > 0 {
		n, size := 0, 0
		for n < len(ws) && n < chunkRows {
			size += len(ws[n].JobID) + len(ws[n].State) + len(ws[n].LastOps)
			if n > 0 && size > chunkBytes {
				break
			}
			n++
		}
		if err := write(ws[:n]); err != nil {
			return err
		}
		ws = ws[n:]
	}
	return nil
}

// copyNewSQL is the COPY of [Store.copyNew] into table: updated_at takes its
// default, now(), the transaction's time as the insert's now() is.
func copyNewSQL(table string) string {
	return `COPY ` + table + ` (job_id, version, state, source_topic, source_partition, source_offset, event_id, last_ops) FROM STDIN BINARY`
}

// copyNew writes jobs known to have neither row nor tombstone ([Write.New])
// with COPY. The insert it replaces looked up each job in the tombstones and
// in the table's key before writing it, planned a statement for its
// arguments and confirmed each row in the WAL; COPY writes rows a page at a
// time and meets the key only in the index, where a job that has a row
// after all fails the copy. The tombstones are read first, in one
// statement, for the same reason: a job known wrong fails the batch as
// stale (the caller reads it and tries again); it never gets a row its
// tombstone or its row would have refused.
func (s *Store) copyNew(ctx context.Context, tx pgx.Tx, b *Batch, ws []Write) error {
	if len(ws) == 0 {
		return nil
	}
	ids := make([]string, len(ws))
	for i := range ws {
		ids[i] = ws[i].JobID
	}
	rows, err := s.query(ctx, tx, `SELECT job_id FROM `+s.tombstones+` WHERE projection = $1 AND job_id = ANY($2::text[])`, s.projection, ids)
	if err != nil {
		return err
	}
	deleted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	if len(deleted) > 0 {
		return &StaleError{Jobs: deleted}
	}
	p := getParams()
	r := &newRows{ws: ws, topic: b.Topic, partition: int32(b.Partition), buf: p.buf[:0]}
	tag, err := tx.Conn().PgConn().CopyFrom(ctx, r, copyNewSQL(s.jobs))
	var pgErr *pgconn.PgError
	if err == nil || errors.As(err, &pgErr) {
		// pgconn has waited for its reader: the buffer is free again.
		// Where the connection broke or the context ended mid-copy it may
		// not have, and the buffer is left to the collector.
		p.buf = r.buf[:0]
		putParams(p)
	}
	switch {
	case pgErr != nil && pgErr.Code == "23505":
		// Which job met a row only the server's detail says: every job
		// of the copy is read again (the rest are in the caller's set
		// already, so the retry copies none of them).
		return &StaleError{Jobs: ids}
	case err != nil:
		return err
	case tag.RowsAffected() != int64(len(ws)):
		// A trigger kept some rows out, as the insert would have
		// reported by not returning them.
		return &StaleError{Jobs: ids}
	}
	return nil
}

// newRows is the stream [Store.copyNew] sends: ws in PostgreSQL's binary
// COPY format (a header; each row its fields, each a length and its bytes,
// -1 for NULL; a trailer), encoded a row at a time as the server reads it,
// so a batch of new jobs takes a buffer of about one read (pgconn reads 64
// KiB at a time) and its largest row, not one of the batch. The column
// types are the migrations' (store/migrations); the copy's tests write
// through them.
type newRows struct {
	ws        []Write
	topic     string
	partition int32
	buf       []byte
	off       int  // what of buf was read
	next      int  // the row to encode next
	started   bool // the header is out
	done      bool // the trailer is out
}

// copyHeader starts a binary COPY: its signature, no flags, no extension.
const copyHeader = "PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00"

func (r *newRows) Read(p []byte) (int, error) {
	if r.off > 0 {
		// What the last read left of a row goes to the front, so the
		// buffer holds one read's rows, not every row read so far.
		r.buf, r.off = r.buf[:copy(r.buf, r.buf[r.off:])], 0
	}
	for len(r.buf)-r.off < len(p) && !r.done {
		switch {
		case !r.started:
			r.buf, r.started = append(r.buf, copyHeader...), true
		case r.next == len(r.ws):
			r.buf, r.done = binary.BigEndian.AppendUint16(r.buf, 0xffff), true
		default:
			r.buf = r.appendRow(r.buf, &r.ws[r.next])
			r.next++
		}
	}
	n := copy(p, r.buf[r.off:])
	r.off += n
	if n == 0 && r.done {
		return 0, io.EOF
	}
	return n, nil
}

// appendRow appends w's row: job_id, version, state, source_topic,
// source_partition, source_offset, event_id, last_ops (copyNewSQL's order),
// an empty event id or ops as NULL, as the insert writes them. jsonb's
// binary form is its version, 1, and the JSON text.
func (r *newRows) appendRow(buf []byte, w *Write) []byte {
	be := binary.BigEndian
	buf = be.AppendUint16(buf, 8)
	buf = appendField(buf, w.JobID)
	buf = be.AppendUint64(be.AppendUint32(buf, 8), uint64(w.Version))
	buf = append(be.AppendUint32(buf, uint32(len(w.State)+1)), 1)
	buf = append(buf, w.State...)
	buf = appendField(buf, r.topic)
	buf = be.AppendUint32(be.AppendUint32(buf, 4), uint32(r.partition))
	buf = be.AppendUint64(be.AppendUint32(buf, 8), uint64(w.Offset))
	if w.EventID == "" {
		buf = be.AppendUint32(buf, math.MaxUint32) // -1: NULL
	} else {
		buf = appendField(buf, w.EventID)
	}
	if len(w.LastOps) == 0 {
		buf = be.AppendUint32(buf, math.MaxUint32)
	} else {
		buf = append(be.AppendUint32(buf, uint32(len(w.LastOps)+1)), 1)
		buf = append(buf, w.LastOps...)
	}
	return buf
}

// appendField appends a text field: its length and its bytes.
func appendField(buf []byte, v string) []byte {
	return append(binary.BigEndian.AppendUint32(buf, uint32(len(v))), v...)
}

// columns are ws's writes as the columns of an unnest. The states are the
// writes' own bytes, not copies ([text]).
func columns(ws []Write) (ids []string, vers []int64, states []string, offs []int64, evs []string) {
	ids = make([]string, len(ws))
	vers = make([]int64, len(ws))
	states = make([]string, len(ws))
	offs = make([]int64, len(ws))
	evs = make([]string, len(ws))
	for i, w := range ws {
		ids[i], vers[i], states[i], offs[i], evs[i] = w.JobID, w.Version, text(w.State), w.Offset, w.EventID
	}
	return
}

func lastOps(ws []Write) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = text(w.LastOps)
	}
	return out
}

// text is b as a string without a copy, for a statement's parameters: a
// batch's states and ops are not changed once planned (the planner makes
// new ones; the cache keeps its own copies), and pgx only reads them
// while it encodes the statement.
func text(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}

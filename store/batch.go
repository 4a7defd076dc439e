package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projector/projector/internal/failpoint"
)

// ErrFenced means another owner claimed the partition after this one: the
// batch was rolled back and the caller must stop working the partition.
var ErrFenced = errors.New("store: partition fenced: another owner claimed it")

// StaleError means an [Update] did not apply although its expected version
// came from this owner's view of the row: another writer moved those rows.
// The batch was rolled back; reload the jobs and classify their events again.
type StaleError struct{ Jobs []string }

func (e *StaleError) Error() string {
	return fmt.Sprintf("store: %d job rows moved under this batch (first %q); reload and retry", len(e.Jobs), e.Jobs[0])
}

// Claim is a partition's stored position and this owner's fencing epoch.
type Claim struct {
	Epoch int64
	// NextOffset is the next offset to read; -1 when the partition was never
	// processed.
	NextOffset int64
}

// Claim takes partition p of topic for owner: it bumps the epoch, which
// fences any previous owner's next batch, and returns the stored position.
// A previous owner's open batch transaction holds the partition row: the
// claim waits for it at most the ClaimLockTimeout, then returns a
// *[ClaimWaitError] naming that owner, for the caller to log and retry.
func (s *Store) Claim(ctx context.Context, topic string, p int, owner string) (Claim, error) {
	return s.ClaimFrom(ctx, topic, p, owner, -1)
}

// ClaimFrom is [Store.Claim] for a partition that starts at start when no
// position is stored yet (never processed, NextOffset -1): the statement
// that takes the partition stores start as its position, so there is no
// moment, however short, when the partition is claimed and its start not
// stored. A stored position always wins over start; start -1 stores
// nothing.
func (s *Store) ClaimFrom(ctx context.Context, topic string, p int, owner string, start int64) (Claim, error) {
	if start < -1 {
		return Claim{}, fmt.Errorf("store: claim %s/%d: start %d is not an offset", topic, p, start)
	}
	var c Claim
	err := pgx.BeginTxFunc(ctx, s.pool, readCommitted, func(tx pgx.Tx) error {
		// The claim's own transaction holds the row too, from its write to
		// its commit: a claimer frozen in between is bounded like a batch.
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $2, true)`,
			millis(s.claimLockTimeout), millis(s.idleTimeout)); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `INSERT INTO `+s.partitions+` AS t (projection, topic, partition, epoch, owner, next_offset)
			VALUES ($1, $2, $3, 1, $4, $5)
			ON CONFLICT (projection, topic, partition)
			DO UPDATE SET epoch = t.epoch + 1, owner = excluded.owner, updated_at = now(),
				next_offset = CASE WHEN t.next_offset < 0 THEN excluded.next_offset ELSE t.next_offset END
			RETURNING epoch, next_offset`, s.projection, topic, p, owner, start).Scan(&c.Epoch, &c.NextOffset)
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
			if running, ok := s.swapping(ctx); ok {
				return Claim{}, fmt.Errorf("store: claim %s/%d: %w", topic, p, &SwapWaitError{Table: s.schema + "." + s.projection, Running: running, Err: err})
			}
			w := &ClaimWaitError{Topic: topic, Partition: p, Waited: s.claimLockTimeout, Err: err}
			// A plain read does not wait for the row lock: it sees the
			// owner as last committed, the one whose transaction is open.
			_ = s.pool.QueryRow(ctx, `SELECT owner FROM `+s.partitions+` WHERE projection = $1 AND topic = $2 AND partition = $3`,
				s.projection, topic, p).Scan(&w.Owner)
			return Claim{}, w
		}
		return Claim{}, fmt.Errorf("store: claim %s/%d: %w", topic, p, err)
	}
	return c, nil
}

// NextOffset is partition p's stored position as last committed, without
// waiting for any lock: -1 when the partition was never processed.
func (s *Store) NextOffset(ctx context.Context, topic string, p int) (int64, error) {
	next := int64(-1)
	err := s.pool.QueryRow(ctx, `SELECT next_offset FROM `+s.partitions+` WHERE projection = $1 AND topic = $2 AND partition = $3`,
		s.projection, topic, p).Scan(&next)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return -1, fmt.Errorf("store: position %s/%d: %w", topic, p, err)
	}
	return next, nil
}

// ClaimWaitError means a claim gave up waiting for the partition's row: a
// previous owner's batch transaction is still open (a slow, stalled or
// frozen owner). PostgreSQL ends such a transaction once its client has
// been idle for the IdleInTransactionTimeout, so retrying succeeds.
type ClaimWaitError struct {
	Topic     string
	Partition int
	// Owner is the partition's owner as last committed, whose transaction
	// is open; empty if it could not be read.
	Owner  string
	Waited time.Duration
	Err    error
}

func (e *ClaimWaitError) Error() string {
	return fmt.Sprintf("store: claim %s/%d: waited %s for the open transaction of the previous owner %q: %v", e.Topic, e.Partition, e.Waited, e.Owner, e.Err)
}

func (e *ClaimWaitError) Unwrap() error { return e.Err }

// millis is d as a PostgreSQL time setting in milliseconds.
func millis(d time.Duration) string { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) }

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
	return loadJobs(ctx, s.pool, s.jobs, s.tombstones, s.projection, ids)
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func loadJobs(ctx context.Context, q querier, table, tombstones, projection string, ids []string) (map[string]Job, error) {
	out := make(map[string]Job, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := q.Query(ctx, `SELECT job_id, version, state::text, coalesce(event_id, ''), coalesce(last_ops::text, ''), false
		FROM `+table+` WHERE job_id = ANY($1::text[])
		UNION ALL
		SELECT t.job_id, t.version, '', coalesce(t.event_id, ''), '', true
		FROM `+tombstones+` t WHERE t.projection = $2 AND t.job_id = ANY($1::text[])
			AND NOT EXISTS (SELECT 1 FROM `+table+` j WHERE j.job_id = t.job_id)`, ids, projection)
	if err != nil {
		return nil, fmt.Errorf("store: load %d jobs: %w", len(ids), err)
	}
	defer rows.Close()
	for rows.Next() {
		var j Job
		var state, lastOps string
		if err := rows.Scan(&j.ID, &j.Version, &state, &j.EventID, &lastOps, &j.Deleted); err != nil {
			return nil, fmt.Errorf("store: load jobs: %w", err)
		}
		if !j.Deleted {
			j.State = json.RawMessage(state)
		}
		if lastOps != "" {
			j.LastOps = json.RawMessage(lastOps)
		}
		out[j.ID] = j
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: load jobs: %w", err)
	}
	return out, nil
}

// Write is the new state of one job.
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
}

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

// Coordinate names a record read from SQS, which has no partition and
// offset: its message id and, on a FIFO queue, its 128-bit sequence
// number. The record's Offset stands for it in keys (see the migration
// 006_sqs_coordinates.sql).
type Coordinate struct {
	MessageID      string `json:"message_id,omitempty"`
	SequenceNumber string `json:"sequence_number,omitempty"`
}

// LoadHeld reads the held deltas a partition's previous owner stored.
func (s *Store) LoadHeld(ctx context.Context, topic string, p int) ([]Held, error) {
	rows, err := s.pool.Query(ctx, `SELECT job_id, version, partition, coalesce(source_partition, partition), "offset",
			ops::text, event_id, held_since, log_time, coalesce(message_id, ''), coalesce(sequence_number, '')
		FROM `+s.held+` WHERE projection = $1 AND topic = $2 AND partition = $3 ORDER BY job_id, version`,
		s.projection, topic, p)
	if err != nil {
		return nil, fmt.Errorf("store: load held %s/%d: %w", topic, p, err)
	}
	defer rows.Close()
	var out []Held
	for rows.Next() {
		var h Held
		var ops string
		var logTime *time.Time
		if err := rows.Scan(&h.JobID, &h.Version, &h.Partition, &h.SourcePartition, &h.Offset, &ops, &h.EventID, &h.Since, &logTime,
			&h.Coordinate.MessageID, &h.Coordinate.SequenceNumber); err != nil {
			return nil, fmt.Errorf("store: load held %s/%d: %w", topic, p, err)
		}
		h.Ops = json.RawMessage(ops)
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

// Bad is a record that broke the wire format.
type Bad struct {
	// Partition is where the record was read; -1 means the batch's.
	Partition  int
	Offset     int64
	Key, Value []byte
	Err        string
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
	// Coordinates name, by offset, the SQS messages of the batch (and of
	// the held deltas it may quarantine), for the held and quarantine rows.
	Coordinates map[int64]Coordinate
	// NextOffset is the position after this batch: last offset read + 1.
	NextOffset int64
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
	Bad     []Bad
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
	// The fence below locks the partition row until commit: bound how long
	// a frozen client may keep the transaction open, and each statement.
	// The fence waits for the partition's row at most as long as a claim
	// does: only a claim (brief) or a rebuild's swap (long) holds it, and a
	// batch waiting for a swap says so (*[SwapWaitError]) rather than
	// failing as an outage at the statement bound. The statements after
	// the fence wait as before: the bound is lifted once it holds the row.
	var lockTimeout string
	if err := tx.QueryRow(ctx, `SELECT current_setting('lock_timeout'), set_config('idle_in_transaction_session_timeout', $1, true),
		set_config('statement_timeout', $2, true), set_config('lock_timeout', $3, true)`,
		millis(s.idleTimeout), millis(s.statementTimeout), millis(s.claimLockTimeout)).Scan(&lockTimeout, nil, nil, nil); err != nil {
		return res, fmt.Errorf("store: apply %s/%d@%d: bounds: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	if b.Unfenced {
		// Nothing to fence: put the bounds back as they were.
		_, err = tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, lockTimeout)
		if err != nil {
			return res, fmt.Errorf("store: apply %s: bounds: %w", b.Topic, err)
		}
		return s.applyWrites(ctx, tx, b, res)
	}
	tag, err := tx.Exec(ctx, `UPDATE `+s.partitions+` SET next_offset = $5, updated_at = now()
		WHERE projection = $1 AND topic = $2 AND partition = $3 AND epoch = $4`,
		s.projection, b.Topic, b.Partition, b.Epoch, b.NextOffset)
	if err == nil {
		_, err = tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, lockTimeout)
	}
	if err != nil {
		var pgErr *pgconn.PgError
		// lock_not_available, or the statement bound if it is the shorter.
		if errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "57014") {
			if running, ok := s.swapping(ctx); ok {
				err = &SwapWaitError{Table: s.schema + "." + s.projection, Running: running, Err: err}
			}
		}
		return res, fmt.Errorf("store: apply %s/%d@%d: fence: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	if tag.RowsAffected() == 0 {
		return res, ErrFenced
	}
	return s.applyWrites(ctx, tx, b, res)
}

// applyWrites is the rest of [Store.Apply] after the fence: the writes, held
// rows and quarantine, and the commit.
func (s *Store) applyWrites(ctx context.Context, tx pgx.Tx, b *Batch, res Result) (Result, error) {
	if err := s.lockJobs(ctx, tx, b); err != nil {
		return res, fmt.Errorf("store: apply %s/%d@%d: lock jobs: %w", b.Topic, b.Partition, b.NextOffset, err)
	}

	if len(b.Snapshots) > 0 {
		ids, vers, states, offs, evs := columns(b.Snapshots)
		// The CTEs read the rows and tombstones as they were before this
		// statement, which tells how far each applied snapshot moved its
		// job. A tombstone at or above a snapshot keeps the job deleted;
		// one below it is removed as the snapshot creates the job again.
		// lockJobs makes the tombstone check and the write atomic.
		rows, err := tx.Query(ctx, `WITH old AS (
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
			return res, fmt.Errorf("store: apply %s/%d@%d: snapshots: %w", b.Topic, b.Partition, b.NextOffset, err)
		}
		var id string
		var before int64
		_, err = pgx.ForEachRow(rows, []any{&id, &before}, func() error {
			res.SnapshotsApplied[id] = before
			return nil
		})
		if err != nil {
			return res, fmt.Errorf("store: apply %s/%d@%d: snapshots: %w", b.Topic, b.Partition, b.NextOffset, err)
		}
		if err := s.snapshotConflicts(ctx, tx, b, &res); err != nil {
			return res, err
		}
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

	if len(b.Hold) > 0 {
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

			return res, fmt.Errorf("store: apply %s/%d@%d: hold: %w", b.Topic, b.Partition, b.NextOffset, err)
		}
	}
	if err := s.writeGapLog(ctx, tx, b); err != nil {
		return res, err
	}
	if len(b.Release) > 0 {
		ids := make([]string, len(b.Release))
		vers := make([]int64, len(b.Release))
		for i, k := range b.Release {
			ids[i], vers[i] = k.JobID, k.Version
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+s.held+` h USING unnest($2::text[], $3::bigint[]) AS i(job_id, version)
			WHERE h.projection = $1 AND h.job_id = i.job_id AND h.version = i.version`,
			s.projection, ids, vers); err != nil {
			return res, fmt.Errorf("store: apply %s/%d@%d: release: %w", b.Topic, b.Partition, b.NextOffset, err)
		}
	}

	if len(b.Bad) > 0 {
		parts := make([]int32, len(b.Bad))
		offs := make([]int64, len(b.Bad))
		keys := make([][]byte, len(b.Bad))
		vals := make([][]byte, len(b.Bad))
		errs := make([]string, len(b.Bad))
		msgIDs, seqs := make([]*string, len(b.Bad)), make([]*string, len(b.Bad))
		for i, r := range b.Bad {
			msgIDs[i], seqs[i] = b.coordinate(r.Offset, Coordinate{})
			// The reason quotes input: keep it text PostgreSQL accepts.
			reason := strings.ToValidUTF8(strings.ReplaceAll(r.Err, "\x00", ""), "\uFFFD")
			parts[i], offs[i], keys[i], vals[i], errs[i] = int32(r.Partition), r.Offset, r.Key, r.Value, reason
			if r.Partition < 0 {
				parts[i] = int32(b.Partition)
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.quarantine+` (projection, topic, partition, "offset", key, value, error, message_id, sequence_number)
			SELECT $1, $2, i.part, i.off, i.key, i.value, i.err, i.msg, i.seq
			FROM unnest($3::int[], $4::bigint[], $5::bytea[], $6::bytea[], $7::text[], $8::text[], $9::text[]) AS i(part, off, key, value, err, msg, seq)
			ON CONFLICT (projection, topic, partition, "offset") DO NOTHING`,
			s.projection, b.Topic, parts, offs, keys, vals, errs, msgIDs, seqs); err != nil {
			return res, fmt.Errorf("store: apply %s/%d@%d: quarantine: %w", b.Topic, b.Partition, b.NextOffset, err)
		}
	}

	failpoint.Hit(failpoint.BeforeCommit)
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("store: apply %s/%d@%d: commit: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	return res, nil
}

// coordinate is the SQS message id and sequence number of the record at
// offset, from the batch's coordinates or else c; nil for a Kafka record.
func (b *Batch) coordinate(offset int64, c Coordinate) (msgID, seq *string) {
	if bc, ok := b.Coordinates[offset]; ok {
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
	ids, vers, states, _, _ := columns(missed)
	rows, err := tx.Query(ctx, `SELECT j.job_id FROM `+s.jobs+` j
		JOIN unnest($1::text[], $2::bigint[], $3::text[]) AS i(job_id, version, state)
		ON j.job_id = i.job_id AND j.version = i.version AND j.state <> i.state::jsonb`, ids, vers, states)
	if err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: conflicts: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	conflicts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: conflicts: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	res.SnapshotConflicts = make(map[string]bool, len(conflicts))
	for _, id := range conflicts {
		res.SnapshotConflicts[id] = true
	}
	return nil
}

func (s *Store) applyUpdates(ctx context.Context, tx pgx.Tx, b *Batch) error {
	var upd, ins, revive, delRow, delNew, redelete []Write
	for _, w := range b.Updates {
		switch {
		case w.Deleted && w.ExpectDeleted:
			redelete = append(redelete, w)
		case w.Deleted && w.Expect == 0:
			delNew = append(delNew, w)
		case w.Deleted:
			delRow = append(delRow, w)
		case w.ExpectDeleted:
			revive = append(revive, w)
		case w.Expect == 0:
			ins = append(ins, w)
		default:
			upd = append(upd, w)
		}
	}
	applied := make(map[string]struct{}, len(b.Updates))
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
	if len(upd) > 0 {
		ids, vers, states, offs, evs := columns(upd)
		expect := make([]int64, len(upd))
		expectEv := make([]string, len(upd))
		for i, w := range upd {
			expect[i], expectEv[i] = w.Expect, w.ExpectEventID
		}
		err := collect(tx.Query(ctx, `UPDATE `+s.jobs+` AS t SET
				version = i.version, state = i.state::jsonb, updated_at = now(),
				source_topic = $8, source_partition = $9, source_offset = i.off, event_id = NULLIF(i.event_id, ''),
				last_ops = NULLIF(i.last_ops, '')::jsonb
			FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[], $6::bigint[], $7::text[], $10::text[])
				AS i(job_id, version, state, off, event_id, expect, last_ops, expect_ev)
			WHERE t.job_id = i.job_id AND t.version = i.expect AND coalesce(t.event_id, '') = i.expect_ev
			RETURNING t.job_id`, ids, vers, states, offs, evs, expect, lastOps(upd), b.Topic, b.Partition, expectEv))
		if err != nil {
			return fmt.Errorf("store: apply %s/%d@%d: updates: %w", b.Topic, b.Partition, b.NextOffset, err)
		}
	}
	if len(ins) > 0 {
		ids, vers, states, offs, evs := columns(ins)
		// A job never seen has no tombstone either: one that appeared
		// meanwhile means the job was deleted, and the batch is stale.
		err := collect(tx.Query(ctx, `INSERT INTO `+s.jobs+`
			(job_id, version, state, updated_at, source_topic, source_partition, source_offset, event_id, last_ops)
			SELECT i.job_id, i.version, i.state::jsonb, now(), $7, $8, i.off, NULLIF(i.event_id, ''), NULLIF(i.last_ops, '')::jsonb
			FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[], $6::text[]) AS i(job_id, version, state, off, event_id, last_ops)
			WHERE NOT EXISTS (SELECT 1 FROM `+s.tombstones+` t WHERE t.projection = $9 AND t.job_id = i.job_id)
			ON CONFLICT (job_id) DO NOTHING
			RETURNING job_id`, ids, vers, states, offs, evs, lastOps(ins), b.Topic, b.Partition, s.projection))
		if err != nil {
			return fmt.Errorf("store: apply %s/%d@%d: inserts: %w", b.Topic, b.Partition, b.NextOffset, err)
		}
	}
	if len(revive) > 0 {
		if err := collect(s.revive(ctx, tx, b, revive)); err != nil {
			return fmt.Errorf("store: apply %s/%d@%d: recreate deleted jobs: %w", b.Topic, b.Partition, b.NextOffset, err)
		}
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

func columns(ws []Write) (ids []string, vers []int64, states []string, offs []int64, evs []string) {
	ids = make([]string, len(ws))
	vers = make([]int64, len(ws))
	states = make([]string, len(ws))
	offs = make([]int64, len(ws))
	evs = make([]string, len(ws))
	for i, w := range ws {
		ids[i], vers[i], states[i], offs[i], evs[i] = w.JobID, w.Version, string(w.State), w.Offset, w.EventID
	}
	return
}

func lastOps(ws []Write) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = string(w.LastOps)
	}
	return out
}

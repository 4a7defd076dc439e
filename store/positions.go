package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrFenced means another owner claimed the partition after this one: the
// batch was rolled back and the caller must stop working the partition.
var ErrFenced = errors.New("store: partition fenced: another owner claimed it")

// Claim is a partition's stored position and this owner's fencing epoch.
type Claim struct {
	Epoch int64
	// NextOffset is the next offset to read; -1 when the partition was never
	// processed.
	NextOffset int64
	// Last is the last record a batch read, to tell the log the position
	// was read from from a new one; nil when none was recorded.
	Last *LogMark
	// LogResets counts the new logs found on the partition.
	LogResets int
}

// LogMark is a record of a partition's log: its offset and a hash of what
// it holds. A log that has another record at that offset is another log.
type LogMark struct {
	Offset int64
	Hash   int64
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
	var lastOffset, lastHash *int64
	err := pgx.BeginTxFunc(ctx, s.pool, readCommitted, func(tx pgx.Tx) error {
		// The claim's own transaction holds the row too, from its write to
		// its commit: a claimer frozen in between is bounded like a batch.
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $2, true)`,
			millis(s.claimLockTimeout), millis(s.idleTimeout)); err != nil {
			return err
		}
		// A rebuild's swap holds this lock exclusively from its start:
		// a claim of a partition with no row yet (added to the topic
		// while the swap runs) would otherwise insert one the swap's
		// locks do not cover, and the swap would drop it.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared($1, $2)`, swapLockClass, s.lockClass); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, `INSERT INTO `+s.partitions+` AS t (projection, topic, partition, epoch, owner, next_offset)
			VALUES ($1, $2, $3, 1, $4, $5)
			ON CONFLICT (projection, topic, partition)
			DO UPDATE SET epoch = t.epoch + 1, owner = excluded.owner, updated_at = now(),
				next_offset = CASE WHEN t.next_offset < 0 THEN excluded.next_offset ELSE t.next_offset END
			RETURNING epoch, next_offset, last_offset, last_hash, log_resets`, s.projection, topic, p, owner, start).Scan(&c.Epoch, &c.NextOffset, &lastOffset, &lastHash, &c.LogResets)
		if err != nil || start < 0 || c.NextOffset != start {
			return err
		}
		// The claim may have stored its start (--start latest): waiters
		// by position read it.
		return s.notifyPosition(ctx, tx, topic, p, start)
	})
	if err == nil && lastOffset != nil && lastHash != nil {
		c.Last = &LogMark{Offset: *lastOffset, Hash: *lastHash}
	}
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

// fence bounds the batch transaction and takes the partition's row under
// b's epoch, storing b's position: [ErrFenced] when the epoch is no longer
// the partition's, a *[SwapWaitError] when a rebuild's swap holds the row.
// A batch of a source with no owners (b.Unfenced, SQS) has no row to check
// or write. It then takes the batch's job locks ([Store.lockJobs]). The
// statements go to the server in one round trip (a pipeline): each runs
// only once the one before it has, in the same transaction, and the first
// that fails fails the rest, so the order and the bounds are those of one
// statement after the other.
func (s *Store) fence(ctx context.Context, tx pgx.Tx, b *Batch) error {
	// The fence below locks the partition row until commit: bound how long
	// a frozen client may keep the transaction open, and each statement.
	// The fence waits for the partition's row at most as long as a claim
	// does: only a claim (brief) or a rebuild's swap (long) holds it, and a
	// batch waiting for a swap says so (*[SwapWaitError]) rather than
	// failing as an outage at the statement bound. The statements after
	// the fence wait as before: the bound is lifted once it holds the row
	// (the setting it had is kept in projector.lock_timeout meanwhile).
	//
	// Every statement of the batch is planned for its own arguments
	// (plan_cache_mode): pgx prepares them once a connection, and after
	// five runs PostgreSQL may keep a generic plan made from the table's
	// statistics of then; for a table that started empty that plan reads
	// the whole table once per row of the batch's arrays, and a batch of
	// 5,000 took over 20 s once the table had grown (the bench's live
	// runs, until an analyze replaced the plan).
	var pipe pgx.Batch
	pipe.Queue(`SELECT set_config('projector.lock_timeout', current_setting('lock_timeout'), true),
		set_config('idle_in_transaction_session_timeout', $1, true),
		set_config('statement_timeout', $2, true), set_config('lock_timeout', $3, true),
		set_config('plan_cache_mode', 'force_custom_plan', true)`,
		millis(s.idleTimeout), millis(s.statementTimeout), millis(s.claimLockTimeout))
	if !b.Unfenced {
		var lastOffset, lastHash *int64
		if b.Last != nil {
			lastOffset, lastHash = &b.Last.Offset, &b.Last.Hash
		}
		pipe.Queue(`UPDATE `+s.partitions+` SET next_offset = $5, updated_at = now(),
				last_offset = coalesce($6::bigint, last_offset), last_hash = coalesce($7::bigint, last_hash)
			WHERE projection = $1 AND topic = $2 AND partition = $3 AND epoch = $4`,
			s.projection, b.Topic, b.Partition, b.Epoch, b.NextOffset, lastOffset, lastHash)
	}
	// The batch's notification rides on a statement the pipeline sends
	// anyway: PostgreSQL delivers it only if the transaction commits, so
	// a listener hears of the batch exactly when its writes are visible.
	// It is sent only while a waiter's lease is live (or Notify): see
	// announce.
	pipe.Queue(`SELECT set_config('lock_timeout', current_setting('projector.lock_timeout'), true), `+s.announce(1),
		s.announceArgs(b.notice())...)
	lockSQL, lockArgs, lock := s.lockJobsStatement(b)
	if lock {
		pipe.Queue(lockSQL, lockArgs...)
	}
	br := tx.SendBatch(ctx, &pipe)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: bounds: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	if b.Unfenced {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("store: apply %s: bounds: %w", b.Topic, err)
		}
	} else {
		tag, err := br.Exec()
		if err == nil {
			_, err = br.Exec()
		}
		if err != nil {
			var pgErr *pgconn.PgError
			// lock_not_available, or the statement bound if it is the shorter.
			if errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "57014") {
				if running, ok := s.swapping(ctx); ok {
					err = &SwapWaitError{Table: s.schema + "." + s.projection, Running: running, Err: err}
				}
			}
			return fmt.Errorf("store: apply %s/%d@%d: fence: %w", b.Topic, b.Partition, b.NextOffset, err)
		}
		if tag.RowsAffected() == 0 {
			return ErrFenced
		}
	}
	if lock {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("store: apply %s/%d@%d: lock jobs: %w", b.Topic, b.Partition, b.NextOffset, err)
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("store: apply %s/%d@%d: fence: %w", b.Topic, b.Partition, b.NextOffset, err)
	}
	return nil
}

// MoveToLog moves partition p's position to next under the owner's epoch,
// where its log is read on from when it is not as the position says. With
// newLog the log is not the one the position was read from (a topic
// deleted and recreated): the last record is forgotten, and the
// quarantined records of the replaced log are renamed to the topic
// "<topic>~log<n>" (n counts the logs replaced), so that records of the
// new log at the same offsets are quarantined beside them. Without, the
// log was truncated before the position. It returns the number of logs
// replaced so far, or [ErrFenced] when the epoch is no longer the
// partition's.
func (s *Store) MoveToLog(ctx context.Context, topic string, p int, epoch, next int64, newLog bool) (resets int, err error) {
	err = pgx.BeginTxFunc(ctx, s.pool, readCommitted, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `UPDATE `+s.partitions+` SET next_offset = $5, updated_at = now(),
				last_offset = CASE WHEN $6 THEN NULL ELSE last_offset END,
				last_hash = CASE WHEN $6 THEN NULL ELSE last_hash END,
				log_resets = log_resets + CASE WHEN $6 THEN 1 ELSE 0 END
			WHERE projection = $1 AND topic = $2 AND partition = $3 AND epoch = $4
			RETURNING log_resets`, s.projection, topic, p, epoch, next, newLog).Scan(&resets)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrFenced
		}
		if err != nil {
			return err
		}
		if err := s.notifyPosition(ctx, tx, topic, p, next); err != nil || !newLog {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE `+s.quarantine+` SET topic = topic || '~log' || $4::int
			WHERE projection = $1 AND topic = $2 AND partition = $3`, s.projection, topic, p, resets)
		return err
	})
	if err != nil && !errors.Is(err, ErrFenced) {
		return 0, fmt.Errorf("store: new log of %s/%d: %w", topic, p, err)
	}
	return resets, err
}

// ResetPosition sets partition p's position to next whatever it was, for
// an operator who chose where a partition goes on (`projector
// reset-positions`): the epoch moves on, which fences the instance
// working it (it claims again and reads from next), and the last record
// is forgotten. With newLog, the partition's log is a new one, as for
// [Store.NewLog]: the quarantined records of the old one are renamed.
// It returns the position it replaced (-1: none), and creates the row if
// there is none.
func (s *Store) ResetPosition(ctx context.Context, topic string, p int, next int64, owner string, newLog bool) (was int64, err error) {
	err = pgx.BeginTxFunc(ctx, s.pool, readCommitted, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, millis(s.claimLockTimeout)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared($1, $2)`, swapLockClass, s.lockClass); err != nil {
			return err
		}
		was = -1
		err := tx.QueryRow(ctx, `SELECT next_offset FROM `+s.partitions+` WHERE projection = $1 AND topic = $2 AND partition = $3 FOR UPDATE`,
			s.projection, topic, p).Scan(&was)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+s.partitions+` AS t (projection, topic, partition, epoch, owner, next_offset)
			VALUES ($1, $2, $3, 1, $4, $5)
			ON CONFLICT (projection, topic, partition)
			DO UPDATE SET epoch = t.epoch + 1, owner = excluded.owner, next_offset = excluded.next_offset,
				last_offset = NULL, last_hash = NULL, updated_at = now()`, s.projection, topic, p, owner, next)
		if err != nil {
			return err
		}
		if err := s.notifyPosition(ctx, tx, topic, p, next); err != nil || !newLog {
			return err
		}
		var resets int
		if err := tx.QueryRow(ctx, `UPDATE `+s.partitions+` SET log_resets = log_resets + 1
			WHERE projection = $1 AND topic = $2 AND partition = $3 RETURNING log_resets`, s.projection, topic, p).Scan(&resets); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE `+s.quarantine+` SET topic = topic || '~log' || $4::int
			WHERE projection = $1 AND topic = $2 AND partition = $3`, s.projection, topic, p, resets)
		return err
	})
	if err != nil {
		return -1, fmt.Errorf("store: reset the position of %s/%d: %w", topic, p, err)
	}
	return was, nil
}

package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Listener is a connection of its own, taken out of the pool, that
// listens on the projection's [Store.Channel]. It holds no pooled
// connection: a process needs one, however many wait on it.
type Listener struct {
	conn *pgx.Conn
	s    *Store
}

// Listen opens a [Listener]. The caller closes it.
func (s *Store) Listen(ctx context.Context) (*Listener, error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: listen: %w", err)
	}
	// Hijacked, the connection leaves the pool for good: the pool opens
	// another in its place and never hands this one out.
	conn := c.Hijack()
	if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("store: listen on %s: %w", s.channel, err)
	}
	return &Listener{conn: conn, s: s}, nil
}

// Next waits for the next notification and returns its payload; an error
// is ctx's or the connection's (it is then lost: close it and listen again).
func (l *Listener) Next(ctx context.Context) (string, error) {
	n, err := l.conn.WaitForNotification(ctx)
	if err != nil {
		return "", fmt.Errorf("store: wait for notification: %w", err)
	}
	return n.Payload, nil
}

// Ping runs a trivial statement on the connection: an error (ctx's
// deadline included) means it is lost, whatever the server says. A
// connection cut without a word (a host gone, a firewall dropping it)
// would otherwise wait for notifications for ever.
func (l *Listener) Ping(ctx context.Context) error {
	if _, err := l.conn.Exec(ctx, `SELECT 1`); err != nil {
		return fmt.Errorf("store: ping the listening connection: %w", err)
	}
	return nil
}

// HoldWaitLease is [Store.HoldWaitLease] on the listening connection, so
// that renewing the lease also proves the connection alive. A refusal
// that will not change while the process runs (*[LeaseRefusedError]: the
// role may not write the table, the table is not there, the server is
// read-only) leaves the connection usable; any other error, the server's
// included (a connection terminated by an operator or a restart, a
// statement cancelled), is the connection's: listen again.
func (l *Listener) HoldWaitLease(ctx context.Context, holder string, ttl time.Duration) error {
	err := holdWaitLease(ctx, l.conn, l.s, holder, ttl)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && leaseRefusal[pgErr.Code] && !l.conn.IsClosed() && l.conn.PgConn().TxStatus() == 'I' {
		return &LeaseRefusedError{Err: err}
	}
	return err
}

// leaseRefusal are the SQLSTATEs of a lease the server will go on
// refusing: insufficient_privilege, undefined_table (the migration that
// adds the table not run), read_only_sql_transaction (a standby, or
// default_transaction_read_only).
var leaseRefusal = map[string]bool{"42501": true, "42P01": true, "25006": true}

// LeaseRefusedError is a lease the server refused to record (most often
// a role that may not write projector_wait_leases).
type LeaseRefusedError struct{ Err error }

func (e *LeaseRefusedError) Error() string { return e.Err.Error() }
func (e *LeaseRefusedError) Unwrap() error { return e.Err }

// Close closes the connection.
func (l *Listener) Close(ctx context.Context) error {
	return l.conn.Close(ctx)
}

// JobState is how far a job's row has come, for a client waiting for a
// version of it.
type JobState struct {
	JobID string `json:"job_id"`
	// Version is the row's version, or its tombstone's when the job is
	// deleted; 0 when neither exists.
	Version int64 `json:"version"`
	Deleted bool  `json:"deleted"`
	// Missing are the first versions the job's held deltas wait for
	// (empty when none are held).
	Missing []int64 `json:"missing"`
	// Held is the number of held deltas, for [Seen].
	Held int `json:"-"`
}

// PositionKey names a partition of the projection.
type PositionKey struct {
	Topic     string
	Partition int
}

// maxMissingShown bounds the missing versions a [JobState] lists.
const maxMissingShown = 10

// Seen is what a reader last read of a job: its version and how many
// held deltas it had. [Unseen] has it read again whatever it is.
type Seen struct {
	Version int64
	Held    int
}

// Unseen is the Seen of a job not read yet.
var Unseen = Seen{Version: -1}

// Reached reads, in one query, the jobs of seen whose version or held
// deltas differ from what seen says (a job with no row, no tombstone and
// no held delta is at version 0), and the stored next offset of the
// partitions parts (-1 for a partition with no row). Only the jobs that
// changed come back: a reader of many jobs that mostly did not move
// receives, and decodes, little.
func (s *Store) Reached(ctx context.Context, seen map[string]Seen, parts []PositionKey) (map[string]JobState, map[PositionKey]int64, error) {
	topics := make([]string, len(parts))
	nums := make([]int32, len(parts))
	for i, k := range parts {
		topics[i], nums[i] = k.Topic, int32(k.Partition)
	}
	ids := make([]string, 0, len(seen))
	vers := make([]int64, 0, len(seen))
	held := make([]int32, 0, len(seen))
	for id, sn := range seen {
		ids, vers, held = append(ids, id), append(vers, sn.Version), append(held, int32(sn.Held))
	}
	rows, err := s.pool.Query(ctx, `SELECT true, i.id, 0, coalesce(j.version, t.version, 0),
			j.job_id IS NULL AND t.job_id IS NOT NULL, coalesce(h.versions, '{}')
		FROM unnest($1::text[], $5::bigint[], $6::int[]) AS i(id, seen, seen_held)
		LEFT JOIN `+s.jobs+` j ON j.job_id = i.id
		LEFT JOIN `+s.tombstones+` t ON t.projection = $2 AND t.job_id = i.id
		LEFT JOIN LATERAL (SELECT array_agg(version ORDER BY version) AS versions
			FROM `+s.held+` WHERE projection = $2 AND job_id = i.id) h ON true
		WHERE coalesce(j.version, t.version, 0) <> i.seen OR coalesce(cardinality(h.versions), 0) <> i.seen_held
		UNION ALL
		SELECT false, k.topic, k.part, coalesce(p.next_offset, -1), false, '{}'
		FROM unnest($3::text[], $4::int[]) AS k(topic, part)
		LEFT JOIN `+s.partitions+` p ON p.projection = $2 AND p.topic = k.topic AND p.partition = k.part`,
		ids, s.projection, topics, nums, vers, held)
	if err != nil {
		return nil, nil, fmt.Errorf("store: progress of %d jobs, %d partitions: %w", len(ids), len(parts), err)
	}
	defer rows.Close()
	jobs := make(map[string]JobState)
	positions := make(map[PositionKey]int64, len(parts))
	for rows.Next() {
		var isJob, deleted bool
		var key string
		var part int32
		var n int64
		var versions []int64
		if err := rows.Scan(&isJob, &key, &part, &n, &deleted, &versions); err != nil {
			return nil, nil, fmt.Errorf("store: progress: %w", err)
		}
		if isJob {
			jobs[key] = JobState{JobID: key, Version: n, Deleted: deleted, Missing: missing(n, versions, maxMissingShown), Held: len(versions)}
		} else {
			positions[PositionKey{Topic: key, Partition: int(part)}] = n
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("store: progress: %w", err)
	}
	return jobs, positions, nil
}

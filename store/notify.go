package store

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Channel is the PostgreSQL notification channel on which every batch of
// the projection is announced once it commits (see [Notice]). Its name is
// derived from the schema and table, hashed because a channel is an
// identifier of at most 63 bytes: two projections of one database whose
// hashes meet share a channel, and their listeners only wake more often.
func (s *Store) Channel() string { return s.channel }

func channelOf(schema, table string) string {
	return fmt.Sprintf("projector_%08x", uint32(lockClassOf(schema, table)))
}

// Notice is the payload of a batch's notification: where a Kafka batch
// left its partition (for a source with no positions, SQS, and writes
// outside batches, only that jobs may have changed), and which jobs it
// may have changed. A listener reads the model again rather than trusting
// the notice for more than a hint of what changed.
type Notice struct {
	// Topic, Partition and NextOffset are the Kafka batch's position
	// after it committed; Topic is empty for an unfenced batch or a
	// write outside batches (Partition and NextOffset -1).
	Topic      string `json:"topic,omitempty"`
	Partition  int    `json:"partition"`
	NextOffset int64  `json:"next_offset"`
	// Jobs is a Bloom filter of the jobs whose row or held deltas the
	// write may have changed (see [Notice.MayHaveChanged]); empty when
	// any job may have.
	Jobs []byte `json:"jobs,omitempty"`
	// All says that every job and every position may have changed (a
	// rebuild's swap).
	All bool `json:"all,omitempty"`
}

// everything is the notice of a rebuild's swap.
var everything = func() string {
	out, _ := json.Marshal(Notice{Partition: -1, NextOffset: -1, All: true})
	return string(out)
}()

// Bounds of a notice's filter: 16 bits a job, so one in about a hundred
// jobs not written is taken for written, up to 32768 bits (4 KiB, 5.5 KB
// in base64 within PostgreSQL's 8000-byte payload), where a batch of 5000
// jobs still leaves only one in fifteen.
const (
	minFilterBits = 256
	maxFilterBits = 32768
	filterHashes  = 2
)

// JobHash is a job id hashed for [Notice.MayHaveChanged]: a reader
// testing one job against many notices hashes it once.
type JobHash struct{ a, b uint32 }

// HashJob hashes id for [Notice.MayHaveChanged].
func HashJob(id string) JobHash {
	h := fnv.New64a()
	h.Write([]byte(id))
	sum := h.Sum64()
	return JobHash{a: uint32(sum), b: uint32(sum>>32) | 1}
}

// MayHaveChanged reports whether the write the notice announces may have
// changed the job hashed to h: false means it did not.
func (n Notice) MayHaveChanged(h JobHash) bool {
	if n.All || len(n.Jobs) == 0 {
		return true
	}
	bits := uint32(len(n.Jobs)) * 8
	for i := range uint32(filterHashes) {
		p := (h.a + i*h.b) % bits
		if n.Jobs[p/8]&(1<<(p%8)) == 0 {
			return false
		}
	}
	return true
}

// jobFilter is the Bloom filter of the job ids in groups.
func jobFilter(groups ...[]string) []byte {
	n := 0
	for _, g := range groups {
		n += len(g)
	}
	bits := minFilterBits
	for bits < 16*n && bits < maxFilterBits {
		bits *= 2
	}
	f := make([]byte, bits/8)
	for _, g := range groups {
		for _, id := range g {
			h := HashJob(id)
			for i := range uint32(filterHashes) {
				p := (h.a + i*h.b) % uint32(bits)
				f[p/8] |= 1 << (p % 8)
			}
		}
	}
	return f
}

// notice is b's notification payload: its position and the filter of
// the jobs its writes, held and released deltas touch.
func (b *Batch) notice() string {
	n := Notice{Topic: b.Topic, Partition: b.Partition, NextOffset: b.NextOffset, Jobs: jobFilter(
		writeIDs(b.Snapshots), writeIDs(b.Deletes), writeIDs(b.Updates), heldIDs(b.Hold), releasedIDs(b.Release))}
	if b.Unfenced {
		n.Topic, n.Partition, n.NextOffset = "", -1, -1
	}
	out, _ := json.Marshal(n)
	return string(out)
}

func writeIDs(ws []Write) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.JobID
	}
	return out
}

func heldIDs(hs []Held) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.JobID
	}
	return out
}

func releasedIDs(ks []HeldKey) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = k.JobID
	}
	return out
}

// announce is an SQL expression that announces the payload $n+1 on the
// channel $n when the store announces always ($n+2) or a waiter's lease
// on the projection ($n+3) is live: [Store.announceArgs] gives the four
// arguments. The check is made in the writing transaction, so every
// instance announces as soon as any process serves waits, whatever its
// own settings; when none does, nothing is announced, PostgreSQL takes
// no notification lock at commit, and the check costs one index probe.
func (s *Store) announce(n int) string {
	return fmt.Sprintf(`(SELECT pg_notify($%d, $%d) WHERE $%d::boolean
		OR EXISTS (SELECT 1 FROM %s WHERE projection = $%d AND expires_at > now()))`, n, n+1, n+2, s.leases, n+3)
}

func (s *Store) announceArgs(payload string) []any {
	return []any{s.channel, payload, s.notifyAlways, s.projection}
}

// notifyJobs announces, in tx, a write outside a partition's batches to
// the jobs ids.
func (s *Store) notifyJobs(ctx context.Context, tx pgx.Tx, ids ...string) error {
	out, _ := json.Marshal(Notice{Partition: -1, NextOffset: -1, Jobs: jobFilter(ids)})
	if _, err := tx.Exec(ctx, `SELECT `+s.announce(1), s.announceArgs(string(out))...); err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	return nil
}

// notifyPosition announces, in tx, that partition p's stored position
// moved to next outside its batches (a new log, an operator's reset, a
// first claim that stores its start): waiters by position read it
// again; no job changed.
func (s *Store) notifyPosition(ctx context.Context, tx pgx.Tx, topic string, p int, next int64) error {
	out, _ := json.Marshal(Notice{Topic: topic, Partition: p, NextOffset: next, Jobs: jobFilter()})
	if _, err := tx.Exec(ctx, `SELECT `+s.announce(1), s.announceArgs(string(out))...); err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	return nil
}

// HoldWaitLease records that holder serves waits on the projection until
// ttl from now: every instance's writes are announced meanwhile. The
// holder renews it well before it expires, and releases it
// ([Store.ReleaseWaitLease]) when it stops. Expired leases of any holder
// are deleted on the way.
func (s *Store) HoldWaitLease(ctx context.Context, holder string, ttl time.Duration) error {
	return holdWaitLease(ctx, s.pool, s, holder, ttl)
}

// execer is a pool or a connection.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func holdWaitLease(ctx context.Context, db execer, s *Store, holder string, ttl time.Duration) error {
	_, err := db.Exec(ctx, `WITH gone AS (DELETE FROM `+s.leases+` WHERE projection = $1 AND expires_at < now() AND holder <> $2)
		INSERT INTO `+s.leases+` (projection, holder, expires_at) VALUES ($1, $2, now() + $3::bigint * interval '1 millisecond')
		ON CONFLICT (projection, holder) DO UPDATE SET expires_at = excluded.expires_at`,
		s.projection, holder, ttl.Milliseconds())
	if err != nil {
		return fmt.Errorf("store: hold the wait lease of %s: %w", holder, err)
	}
	return nil
}

// ReleaseWaitLease deletes holder's lease: once no lease is live, writes
// are no longer announced (unless [Config.Notify]).
func (s *Store) ReleaseWaitLease(ctx context.Context, holder string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM `+s.leases+` WHERE projection = $1 AND holder = $2`, s.projection, holder); err != nil {
		return fmt.Errorf("store: release the wait lease of %s: %w", holder, err)
	}
	return nil
}

package store

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"
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

// notifyJobs announces, in tx, a write outside a partition's batches to
// the jobs ids.
func (s *Store) notifyJobs(ctx context.Context, tx pgx.Tx, ids ...string) error {
	out, _ := json.Marshal(Notice{Partition: -1, NextOffset: -1, Jobs: jobFilter(ids)})
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, s.channel, string(out)); err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	return nil
}

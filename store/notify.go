package store

import (
	"context"
	"encoding/json"
	"fmt"

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
// left its partition, or, for a source with no positions (SQS), only that
// job versions may have changed. A listener reads the model again rather
// than trusting the notice for more than a hint of what changed.
type Notice struct {
	// Topic, Partition and NextOffset are the Kafka batch's position
	// after it committed; Topic is empty for an unfenced batch.
	Topic      string `json:"topic,omitempty"`
	Partition  int    `json:"partition"`
	NextOffset int64  `json:"next_offset"`
}

// notice is b's notification payload, a few dozen bytes (PostgreSQL
// takes up to 8000).
func (b *Batch) notice() string {
	if b.Unfenced {
		return jobsChanged
	}
	out, _ := json.Marshal(Notice{Topic: b.Topic, Partition: b.Partition, NextOffset: b.NextOffset})
	return string(out)
}

// jobsChanged is the notice of a write outside a partition's batches (a
// replay, a heal): job versions may have changed, no position did.
var jobsChanged = func() string {
	out, _ := json.Marshal(Notice{Partition: -1, NextOffset: -1})
	return string(out)
}()

// notifyJobs announces, in tx, a write outside a partition's batches.
func (s *Store) notifyJobs(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, s.channel, jobsChanged); err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	return nil
}

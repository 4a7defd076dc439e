// Package source is what every source of job events hands the engine:
// [Lane]s, each read through a [Reader] as [Record]s with where they sit
// in their source. The sources themselves live in the packages below
// (source/kafka, source/sqs), and each passes the conformance suite of
// source/sourcetest.
package source

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// Record is one record a [Reader] delivers: the wire format's key and
// value, when the source accepted it, and where it sits in the source.
type Record struct {
	Key, Value []byte
	// Time is when the source accepted the record (Kafka's log append time,
	// SQS's sent timestamp). It orders nothing: it bounds the log re-read
	// and ages held deltas.
	Time  time.Time
	Coord Coord
	// Skipped counts the offsets right after the record that hold nothing
	// to deliver (Kafka: transaction markers, records of aborted
	// transactions, records compacted away) when the source read past
	// them before it handed the record over: the log goes on at
	// [Record.Next], and a batch ending with the record stores that
	// position.
	Skipped int64
}

// Next is where the log goes on after r: the position after a batch
// that ends with it.
func (r Record) Next() int64 { return r.Coord.Offset + 1 + r.Skipped }

// Coord is where a record sits in its source. A Kafka record has a
// partition and an offset; an SQS message has an id and, on a FIFO queue,
// a sequence number, and its Offset is derived from them (see
// the SQS source) so that the store's keys stay unique. Held and
// quarantine rows keep the coordinate, so a record can be found again.
type Coord struct {
	// Partition and Offset name a Kafka record. Offset is also set for an
	// SQS message; Partition is -1 there.
	Partition int
	Offset    int64
	// MessageID and Sequence name an SQS message: its id, and its FIFO
	// sequence number (a decimal string of up to 128 digits, empty on a
	// standard queue). Empty for Kafka.
	MessageID, Sequence string
	// Group is the message's ordering scope on SQS (its MessageGroupId);
	// empty for Kafka, whose ordering scope is the partition.
	Group string
}

// Lane is one ordering scope a source hands the engine: a Kafka partition
// of the group's assignment (fenced: one owner at a time), or an SQS queue
// (unfenced: every instance receives from it at once). One loop runs every
// lane (the engine's worker loop); what differs is in [LaneCaps], never in a type
// assertion.
//
// The loop claims a fenced lane in the store, compares a lane's log with
// its stored position where it has one, restores the lane's held deltas,
// opens a [Reader] and then fetches batches, plans them, commits each in
// one PostgreSQL transaction, and only then acknowledges it. A batch that
// never commits is never acknowledged, so the source delivers it again
// (Kafka: the next owner reads from the stored position; SQS: the messages
// become visible again once the source stops extending their visibility).
//
// Every write is conditional on the job's version in PostgreSQL, so a
// record delivered twice is dropped as a duplicate or stale: correctness
// never depends on exclusive delivery. A fenced lane additionally stores
// its position with each batch under the claim's epoch, so one owner at a
// time writes it and nothing is read twice in the common case.
type Lane interface {
	// Scope names the lane's rows in the store (positions, held deltas,
	// quarantine): a Kafka topic and partition, or a queue's name and 0.
	Scope() (topic string, partition int)
	// Caps says what the lane can do.
	Caps() LaneCaps
	// Bounds reads the lane's log start and end (the high watermark);
	// only when Caps().Log.
	Bounds(ctx context.Context) (first, end int64, err error)
	// RecordAt reads the record at offset, or the first after it when it
	// is gone (compaction), read uncommitted; only when Caps().Log.
	RecordAt(ctx context.Context, offset int64) (Record, error)
	// Open starts reading: from the stored position, or where start says
	// when there is none (start is an offset of the log, or one of
	// StartFirst and StartLast). hooks tell the engine what the reader
	// finds on the way.
	Open(ctx context.Context, position, start int64, hooks LaneHooks) (Reader, error)
}

// Where a lane with no stored position starts reading: the log's first
// record, or its end (kafka-go's FirstOffset and LastOffset).
const (
	StartFirst int64 = -2
	StartLast  int64 = -1
)

// LaneCaps are what a lane can do.
type LaneCaps struct {
	// Fenced: the lane is claimed by one owner at a time, and every batch
	// commits under the claim's epoch and stores the lane's position.
	// False for a lane that several instances read at once: batches
	// commit unfenced, and the conditional writes alone decide.
	Fenced bool
	// Log: the lane is a log with offsets that can be read again (its
	// bounds, a record at an offset, and the gap re-read).
	Log bool
	// Shared: other instances read the lane at the same time, and hold
	// deltas of it too: the loop adopts theirs from time to time.
	Shared bool
}

// LaneHooks are what a [Reader] tells the engine while it reads.
type LaneHooks struct {
	// Committed hands an acknowledged position to the source's own
	// bookkeeping (Kafka: the group offset commit, for lag tools).
	Committed func(next int64)
	// Moved says the position moved without a batch: records deleted
	// before they were read, or offsets that hold nothing to deliver.
	Moved func(next int64)
	// NewLog is told the position is past the log's end; it returns where
	// reading goes on (the position itself to wait).
	NewLog func(ctx context.Context, position int64) (int64, error)
	// Lost counts records deleted from the log before they were read.
	Lost *atomic.Int64
}

// Reader is an open [Lane]'s records.
type Reader interface {
	// Fetch waits up to wait for a first record, then gathers more up to the batch size or the linger time; no records and no error when wait passed (or ctx ended), an error when the source is unreachable.
	Fetch(ctx context.Context, wait time.Duration) ([]Record, error)
	// Ack tells the source that recs' batch transaction committed (Kafka: the position goes to the group offset; SQS: the messages are deleted); a failed Ack only means they are delivered again. It is called for a batch that committed during shutdown too, with a context that is live but bounded.
	Ack(ctx context.Context, recs []Record) error
	// Ends are where the lane's log ends as the reader last saw it: the high watermark, and the last stable offset; -1 where there is no log or it is not known yet.
	Ends() (hwm, stable int64)
	// Lag is how many records the lane holds that are not acknowledged yet: on a log, from the position after the last acknowledged batch to the end the reader last saw (the last stable offset when it reads committed); on a queue, its messages visible and in flight, as the service counts them (approximately, on SQS).
	Lag(ctx context.Context) (int64, error)
	// Err is an error that ends the lane for good (the source refused the credentials); nil while reading goes on.
	Err() error
	// Close stops reading and releases what was not acknowledged, to be delivered again.
	Close() error
}

// ErrNoLog is what a lane that is not a log answers to Bounds and
// RecordAt.
var ErrNoLog = errors.New("source: the lane is not a log")

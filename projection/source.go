package projection

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/projector/projector/source"
)

// Record is one record a [Reader] delivers ([source.Record]).
type Record = source.Record

// Coord is where a record sits in its source ([source.Coord]).
type Coord = source.Coord

// Lane is one ordering scope a source hands the engine: a Kafka partition
// of the group's assignment (fenced: one owner at a time), or an SQS queue
// (unfenced: every instance receives from it at once). One loop runs every
// lane ([worker.run]); what differs is in [LaneCaps], never in a type
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
	// Err is an error that ends the lane for good (the source refused the credentials); nil while reading goes on.
	Err() error
	// Close stops reading and releases what was not acknowledged, to be delivered again.
	Close() error
}

// firstOffset is the offset of a batch's first record, for logs; -1 for
// none.
func firstOffset(recs []Record) int64 {
	if len(recs) == 0 {
		return -1
	}
	return recs[0].Coord.Offset
}

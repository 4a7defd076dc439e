package projection

import (
	"context"
	"time"

	"github.com/projector/projector/source"
)

// Record is one record a [Source] delivers ([source.Record]).
type Record = source.Record

// Coord is where a record sits in its source ([source.Coord]).
type Coord = source.Coord

// Source is what a partition worker reads records from: one Kafka
// partition, or an SQS FIFO queue. The worker fetches a batch, plans it,
// commits its effect in one PostgreSQL transaction, and only then
// acknowledges it. A batch that never commits is never acknowledged, so
// the source delivers it again (Kafka: the next owner reads from the
// stored position; SQS: the messages become visible again when the
// source stops extending their visibility). A source keeps the records it
// delivered and that are not yet acknowledged reserved for as long as
// their batch is in flight (SQS: it extends their visibility timeout);
// Close ends that.
//
// Every write is conditional on the job's version in PostgreSQL, so a
// record delivered twice is dropped as a duplicate or stale: correctness
// never depends on exclusive delivery. An ordered source additionally has
// positions that are stored with each batch under an epoch fence, so one
// owner at a time writes a partition and nothing is read twice in the
// common case.
type Source interface {
	// Fetch waits up to wait for a first record, then gathers more up to the batch size or the linger time; no records and no error when wait passed (or ctx ended), an error when the source is unreachable.
	Fetch(ctx context.Context, wait time.Duration) ([]Record, error)
	// Ack tells the source that recs' batch transaction committed (Kafka: the position goes to the group offset; SQS: the messages are deleted); a failed Ack only means they are delivered again. It is called for a batch that committed during shutdown too, with a context that is live but bounded.
	Ack(ctx context.Context, recs []Record) error
	// Ordered reports whether records have ordered positions, stored and fenced per owner, and can be read again from the log (Kafka); false for a queue that deletes after commit (SQS FIFO), where the gap re-read checks the store only.
	Ordered() bool
	// Lag is how many records wait to be projected (Kafka: the partition's end minus the position; SQS: approximate visible plus in-flight messages). The engine does not call it yet: the status and metrics read the same figures from the partition book (docs/design.md, "Sources").
	Lag(ctx context.Context) (int64, error)
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

// Package source holds what every source of job events hands the engine:
// records with where they sit in their source. The sources themselves live
// in the packages below (source/kafka, source/sqs).
package source

import "time"

// Record is one record a [Source] delivers: the wire format's key and
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

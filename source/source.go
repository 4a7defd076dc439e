// Package source is what every source of job events hands the engine:
// [Lane]s, each read through a [Reader] as [Record]s with where they sit
// in their source. The sources themselves live in the packages below
// (source/kafka, source/sqs), and each passes the conformance suite of
// source/sourcetest.
package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/projector/projector/source/kafka/kafkacfg"
	"github.com/projector/projector/source/sqs/sqscfg"
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
	// Ack tells the source that recs' batch transaction committed (Kafka: the position goes to the group offset; SQS: the messages are deleted); a failed Ack only means they are delivered again. It is called for a batch that committed during shutdown too, with a context that is live but bounded. With no records it says that a position the reader moved to on its own (LaneHooks.Moved) was stored.
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

// Source hands the engine its lanes. Kafka's consumer group hands one
// fenced lane per partition of each generation's assignment; an SQS queue
// hands one shared lane for as long as the instance runs. The engine runs
// every lane with the same loop; how lanes are assigned, and what tells
// the source's health, is the source's.
//
// A source is built outside the engine and handed to it. A new source is
// a package with a Source and its [Lane]s, held to the conformance suite
// of source/sourcetest.
type Source interface {
	// Run records what the source consumes as (a consumer group, a queue)
	// through host, then hands host a lane at a time through
	// [Host.Serve] until ctx ends, and returns nil once every lane it
	// handed has returned. An error ends the instance: the source
	// refused the credentials, or another projection works the group or
	// the queue (*ConflictError).
	Run(ctx context.Context, host Host) error
	// Checks are the source's readiness checks: the topic exists and the
	// instance is in a generation of the group; the queue answers.
	Checks() []Check
	// Status is the source's part of /status.
	Status() Status
	// Rereader reads the log again for held jobs' missing versions; nil
	// for a source that is not a log.
	Rereader() Rereader
	// Ends reads where every partition's log ends, and Starts where the
	// given partitions' logs start; ErrNoLog for a source that is not a
	// log.
	Ends(ctx context.Context) (map[int]LogEnd, error)
	Starts(ctx context.Context, partitions []int) (map[int]int64, error)
}

// Host is the engine as a [Source] sees it.
type Host interface {
	// Record resolves the consumer (group or queue) the projection
	// uses, records it in the store, and says who the projection is. It
	// waits out the database; another projection that recorded it is a
	// *ConflictError.
	Record(ctx context.Context, c Consumer) (Recorded, error)
	// Serve runs lane until ctx ends (nil), or the lane is lost (fenced:
	// its claim was taken) or cannot go on (the source refused the
	// credentials), and says why then.
	Serve(ctx context.Context, lane Lane) error
	// Ends are where the lanes' logs end, read in the background so the
	// lag is current while nothing is fetched.
	Ends(ends map[int]LogEnd)
	// QueueLag is a queue's messages visible and in flight (known), or
	// that they cannot be read (!known).
	QueueLag(n int64, known bool)
	// Failed and Answered report the source's outage: failing since the
	// first Failed (retried after retryIn), until an Answered. A lane's
	// Fetch errors are reported by the engine too: a source reports what
	// its own background work meets (joining, reading log ends, a queue's
	// receiver) and when it answers again. Failing is the outage in
	// progress, one for the source, as the engine's
	// health, readiness, watchdog and metrics read it: how long it has
	// lasted at now, and its last error; 0 when there is none.
	Failed(err error, retryIn time.Duration)
	Answered()
	Failing(now time.Time) (time.Duration, string)
	// Alive registers a background loop of the source for liveness; beat
	// marks a sign of life, done removes the loop.
	Alive(name string, floor time.Duration) (beat func(), done func())
	// Logger is the instance's logger.
	Logger() *slog.Logger
}

// LogEnd is where one partition's log ends.
type LogEnd struct {
	// HighWatermark is the offset the next record appended gets.
	HighWatermark int64
	// LastStable is the last stable offset: below it every transaction
	// has committed or aborted. It is the first offset of the oldest
	// transaction still open, the high watermark with none.
	LastStable int64
	// End is where a reader at the isolation level asked reads to, and
	// lag is measured to: LastStable reading committed, HighWatermark
	// reading uncommitted.
	End int64
}

// Rereader reads a log again from a time on, for the records of some
// keys (jobs).
type Rereader interface {
	Reread(ctx context.Context, keys map[string]bool, from time.Time) ([]Record, error)
}

// ConsumerKind is what a source consumes as.
type ConsumerKind int

const (
	// ConsumerGroup is a Kafka consumer group.
	ConsumerGroup ConsumerKind = iota
	// ConsumerQueue is an SQS queue.
	ConsumerQueue
)

// Consumer is what a source asks to record: Explicit when the operator
// named one, else the one recorded, else Fresh for a new projection
// (Legacy for a projection that ran before consumers were recorded).
type Consumer struct {
	Kind                    ConsumerKind
	Explicit, Fresh, Legacy string
}

// Recorded is what [Host.Record] decided.
type Recorded struct {
	// Name is the consumer in force; Previous the one it replaced.
	Name, Previous string
	// Legacy says Name was kept from before consumers were recorded.
	Legacy bool
	// Identity is the projection's: ID, the same in every instance of it
	// and in no other projection; Name, how people name it.
	ID, Projection string
	// Suggest is a consumer group of the projection's own, for errors.
	Suggest string
}

// Check is one condition of readiness.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// Status is a source's part of /status.
type Status struct {
	// Group and Generation are the consumer group's (Kafka), empty and 0
	// for a queue.
	Group      string
	Generation int32
	// Queue is a queue source's own report (Kafka: nil).
	Queue *sqscfg.Status
}

// ConflictError is a consumer group, or an SQS queue, that another
// projection's instances already work: this instance was refused rather
// than take part of what the other projection reads. The operator must
// give this projection a group (or queue) of its own.
type ConflictError struct {
	// Group is the consumer group, or the queue.
	Group string
	// Ours and Theirs name the two projections.
	Ours, Theirs string
	// Queue says Group is an SQS queue, and Tag names the queue's tag that
	// says whose it is.
	Queue bool
	Tag   string
	// Suggest is a group of this projection's own.
	Suggest string
}

func (e *ConflictError) Error() string {
	if e.Queue {
		tag := e.Tag
		if tag == "" {
			tag = sqscfg.OwnerTag
		}
		return fmt.Sprintf("the SQS queue %s is read by another projection (%s); this one (%s) would receive only part of its messages and the other would miss them: give each projection a queue of its own (if %s no longer runs, remove the queue's tag %s)",
			e.Group, e.Theirs, e.Ours, e.Theirs, tag)
	}
	return fmt.Sprintf("consumer group %q is used by another projection (%s); this one (%s) would split the topic's partitions with it and both read models would miss records: give this projection a group of its own with --group (for example %s)",
		e.Group, e.Theirs, e.Ours, e.Suggest)
}

// Settings are what a source is built from: the engine's configuration as
// far as sources read it. Each source reads its own part.
type Settings struct {
	// Topic is the Kafka topic, or the name a queue's rows are stored
	// under; Group the consumer group asked for (empty: the recorded
	// one, else Fresh); Owner names the instance in logs.
	Topic, Group, Fresh, Owner string
	Kafka                      kafkacfg.Config
	SQS                        sqscfg.Config
	// The Kafka group protocol's timings.
	HeartbeatInterval, SessionTimeout, RebalanceTimeout, JoinGroupBackoff, PartitionWatchInterval time.Duration
	// MaxWait is how long a broker holds a fetch with nothing to return;
	// BatchSize and Linger bound one batch.
	MaxWait   time.Duration
	BatchSize int
	Linger    time.Duration
	// RereadMaxBytes and RereadMaxTime bound one re-read of a log.
	RereadMaxBytes int64
	RereadMaxTime  time.Duration
	Logger         *slog.Logger
}

// Builder builds a source from its settings.
type Builder func(Settings) (Source, error)

var (
	buildersMu sync.Mutex
	builders   = map[string]Builder{}
)

// Register makes a source buildable by name ("kafka", "sqs"): a source
// package registers itself when it is linked in, as a database/sql driver
// does.
func Register(name string, b Builder) {
	buildersMu.Lock()
	defer buildersMu.Unlock()
	if b == nil {
		panic("source: Register of a nil builder for " + name)
	}
	if _, dup := builders[name]; dup {
		panic("source: Register called twice for " + name)
	}
	builders[name] = b
}

// Build builds the source registered under name.
func Build(name string, s Settings) (Source, error) {
	buildersMu.Lock()
	b := builders[name]
	buildersMu.Unlock()
	if b == nil {
		return nil, fmt.Errorf("source %q is not linked into this program (import its package, e.g. github.com/projector/projector/source/%s)", name, name)
	}
	return b(s)
}

// Backoff is the retry pacing the sources and the engine share: from
// 200ms, doubling (with jitter) up to max, never giving up by itself; the
// caller's context ends it.
func Backoff(max time.Duration) *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 200 * time.Millisecond
	bo.MaxInterval = max
	bo.MaxElapsedTime = 0
	return bo
}

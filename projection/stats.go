package projection

import (
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Counters are cumulative record outcomes since the process started.
type Counters struct {
	Consumed int64 `json:"consumed"`
	Applied  int64 `json:"applied"`
	// Deleted counts deletes that removed a job (or marked one never
	// seen as deleted).
	Deleted int64 `json:"deleted"`
	// Covered counts held deltas dropped because a snapshot or a delete
	// at or above their version replaced the job's whole state.
	Covered     int64 `json:"covered"`
	Stale       int64 `json:"stale"`
	Duplicates  int64 `json:"duplicates"`
	Conflicts   int64 `json:"conflicts"`
	Held        int64 `json:"held"`
	Quarantined int64 `json:"quarantined"`
	Batches     int64 `json:"batches"`
	Fenced      int64 `json:"fenced"`
	// Gaps closed, by the step that closed them.
	ClosedByWait     int64 `json:"gaps_closed_by_wait"`
	ClosedByReread   int64 `json:"gaps_closed_by_reread"`
	ClosedBySnapshot int64 `json:"gaps_closed_by_snapshot"`
	// HeldJobs is how many jobs are held right now.
	HeldJobs int64 `json:"held_jobs"`
	// Lost counts records deleted from the log (retention, compaction)
	// before they could be read.
	Lost int64 `json:"lost_before_read"`
	// NewLogs counts partitions found reading a new log (a topic deleted
	// and recreated) and read again from its start.
	NewLogs int64 `json:"new_logs"`
	// GapsOpened counts jobs that started waiting behind a gap.
	GapsOpened int64 `json:"gaps_opened"`
	// DatabaseErrors counts failed PostgreSQL operations (batches, claims,
	// reloads, pings), retried.
	DatabaseErrors int64 `json:"database_errors"`
	// Authority requests (snapshot fetches) by result.
	AuthorityOK       int64 `json:"authority_ok"`
	AuthorityNotFound int64 `json:"authority_not_found"`
	AuthorityError    int64 `json:"authority_error"`
	// AuthorityTimeouts counts fetches that ended with a request cut by
	// its timeout (counted in AuthorityError too); each gives its job's
	// next request twice the time.
	AuthorityTimeouts int64 `json:"authority_timeouts"`
	// TombstonesPruned counts tombstones removed after the tombstone
	// retention.
	TombstonesPruned int64 `json:"tombstones_pruned"`
	// Stalls counts partitions found with lag and no progress for the
	// stall timeout (the instance stops at the first).
	Stalls int64 `json:"stalls"`
}

// LogValue lets a log line show the counters as attributes.
func (c Counters) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Int64("consumed", c.Consumed), slog.Int64("applied", c.Applied), slog.Int64("deleted", c.Deleted),
		slog.Int64("covered", c.Covered), slog.Int64("stale", c.Stale),
		slog.Int64("duplicates", c.Duplicates), slog.Int64("conflicts", c.Conflicts), slog.Int64("held", c.Held),
		slog.Int64("quarantined", c.Quarantined), slog.Int64("batches", c.Batches), slog.Int64("fenced", c.Fenced),
		slog.Int64("gaps_closed_by_wait", c.ClosedByWait), slog.Int64("gaps_closed_by_reread", c.ClosedByReread),
		slog.Int64("gaps_closed_by_snapshot", c.ClosedBySnapshot), slog.Int64("lost_before_read", c.Lost),
		slog.Int64("gaps_opened", c.GapsOpened), slog.Int64("database_errors", c.DatabaseErrors),
		slog.Int64("tombstones_pruned", c.TombstonesPruned), slog.Int64("new_logs", c.NewLogs),
	)
}

type counters struct {
	consumed, applied, stale, duplicates, conflicts, held, quarantined, batches, fenced atomic.Int64
	closedWait, closedReread, closedSnapshot, lost                                      atomic.Int64
	gapsOpened, dbErrors, authorityOK, authorityNotFound, authorityError                atomic.Int64
	deleted, covered, pruned                                                            atomic.Int64
	stalls, authorityTimeouts, newLogs                                                  atomic.Int64
}

func (c *counters) add(t tally) {
	c.consumed.Add(t.consumed)
	c.applied.Add(t.applied)
	c.deleted.Add(t.deleted)
	c.covered.Add(t.covered)
	c.stale.Add(t.stale)
	c.duplicates.Add(t.duplicates)
	c.conflicts.Add(t.conflicts)
	c.held.Add(t.held)
	c.quarantined.Add(t.quarantined)
	c.batches.Add(1)
}

func (c *counters) snapshot() Counters {
	return Counters{
		Consumed: c.consumed.Load(), Applied: c.applied.Load(), Stale: c.stale.Load(),
		Duplicates: c.duplicates.Load(), Conflicts: c.conflicts.Load(), Held: c.held.Load(),
		Quarantined: c.quarantined.Load(), Batches: c.batches.Load(), Fenced: c.fenced.Load(),
		ClosedByWait: c.closedWait.Load(), ClosedByReread: c.closedReread.Load(), ClosedBySnapshot: c.closedSnapshot.Load(),
		Lost: c.lost.Load(), Deleted: c.deleted.Load(), Covered: c.covered.Load(), TombstonesPruned: c.pruned.Load(),
		GapsOpened: c.gapsOpened.Load(), DatabaseErrors: c.dbErrors.Load(),
		AuthorityOK: c.authorityOK.Load(), AuthorityNotFound: c.authorityNotFound.Load(), AuthorityError: c.authorityError.Load(),
		AuthorityTimeouts: c.authorityTimeouts.Load(), Stalls: c.stalls.Load(), NewLogs: c.newLogs.Load(),
	}
}

// tally counts one batch's outcomes before they are committed.
type tally struct {
	consumed, applied, stale, duplicates, conflicts, held, quarantined int64
	deleted, covered                                                   int64
}

// PartitionStatus is one partition this instance works.
type PartitionStatus struct {
	Partition int `json:"partition"`
	// Position is the next offset to read, as committed in PostgreSQL
	// (-1: none yet); named next_offset everywhere outside Go.
	Position int64 `json:"next_offset"`
	// HighWatermark is the partition's end as last seen from the broker,
	// read at least every 5 s; LastStable its last stable offset, below
	// which every transaction has committed or aborted (the first offset
	// of the oldest one still open, else the high watermark).
	HighWatermark int64 `json:"high_watermark"`
	LastStable    int64 `json:"last_stable_offset"`
	// Lag is the records between Position and where this instance can
	// read to: the last stable offset reading committed (a transaction
	// still open is waited on, not lag), the high watermark reading
	// uncommitted ([Status] LagMeasuredTo).
	Lag int64 `json:"lag"`
	// LagUnknown says the lag could not be read (an SQS queue whose
	// counts are refused or failing): Lag and HighWatermark are 0 then,
	// and count as no lag.
	LagUnknown bool `json:"lag_unknown,omitempty"`
	// OpenTransaction, reading committed, is the transaction still open
	// the partition waits on: every record before it is projected.
	OpenTransaction *OpenTransaction `json:"open_transaction,omitempty"`
	Epoch           int64            `json:"epoch"`
	UpdatedAt       time.Time        `json:"updated_at"`
	// HeldJobs is how many jobs of the partition wait for missing
	// versions.
	HeldJobs int `json:"held_jobs"`
	// Held lists those of them that the status's page shows (see
	// [HeldPage]), oldest first.
	Held []HeldJob `json:"held"`

	// view is the partition's MaxHeldLimit oldest held jobs, sorted by
	// heldKey, as its worker last built them from viewOf held jobs; never
	// written once published.
	view   []HeldJob
	viewOf int
}

// HeldJob is one job the gap detector holds.
type HeldJob struct {
	JobID string `json:"job_id"`
	// Version is the row's version; Missing the versions it waits for.
	Version    int64   `json:"version"`
	Missing    []int64 `json:"missing"`
	HeldDeltas int     `json:"held_deltas"`
	// Since is when the job began to wait, or to wait again after it
	// moved forward but stayed held.
	Since       time.Time `json:"since"`
	Attempts    int       `json:"attempts"`
	NextAttempt time.Time `json:"next_attempt"`
	LastStep    string    `json:"last_step"`
	LastError   string    `json:"last_error,omitempty"`
}

// Status is what /status serves.
type Status struct {
	Topic      string            `json:"topic"`
	Group      string            `json:"group"`
	Owner      string            `json:"owner"`
	Generation int32             `json:"generation"`
	Ready      bool              `json:"ready"`
	Readiness  Health            `json:"readiness"`
	Partitions []PartitionStatus `json:"partitions"`
	Counters   Counters          `json:"counters"`
	// Source is kafka or sqs; SQS is the queue's view with Source sqs.
	Source string     `json:"source"`
	SQS    *SQSStatus `json:"sqs,omitempty"`
	// HeldPage says which held jobs the partitions' Held lists show.
	HeldPage HeldPage `json:"held_page"`
	// Isolation is how Kafka transactions are read (Config.Isolation);
	// LagMeasuredTo is what the partitions' lag is measured to:
	// last_stable_offset reading committed, high_watermark reading
	// uncommitted. Empty for SQS.
	Isolation     string `json:"isolation,omitempty"`
	LagMeasuredTo string `json:"lag_measured_to,omitempty"`
}

// What lag is measured to ([Status] LagMeasuredTo).
const (
	lagToStable        = "last_stable_offset"
	lagToHighWatermark = "high_watermark"
)

type partitionBook struct {
	mu    sync.Mutex
	parts map[int]PartitionStatus
	// owner is the worker that last published each partition, so a worker
	// of an ended generation cannot remove its successor's entry.
	owner map[int]any
	// queues are the entries of SQS queues ([partitionBook.setQueue]);
	// unknown those whose lag could not be read last time.
	queues, unknown map[int]bool
	// stable measures a partition's lag to its last stable offset (read
	// committed), not its high watermark; set before the book is used.
	stable bool
}

// setQueue marks entry id as an SQS queue's: its Position is the offset
// after the last message this instance committed (see
// [sqsMessage.Offset]), which moves with every batch but orders nothing;
// its HighWatermark and Lag are the queue's approximate visible plus
// in-flight messages ([partitionBook.setQueueLag]), which go down as well
// as up.
func (b *partitionBook) setQueue(id int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.queues == nil {
		b.queues = map[int]bool{}
	}
	b.queues[id] = true
}

func (b *partitionBook) set(p PartitionStatus, by any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.parts == nil {
		b.parts = make(map[int]PartitionStatus)
		b.owner = make(map[int]any)
	}
	b.owner[p.Partition] = by
	queue := b.queues[p.Partition]
	if old, ok := b.parts[p.Partition]; ok {
		if queue || old.HighWatermark > p.HighWatermark {
			p.HighWatermark = old.HighWatermark
		}
		p.LastStable = max(p.LastStable, old.LastStable)
	}
	p.Lag = b.lagOf(p, queue)
	p.LagUnknown = b.unknown[p.Partition]
	p.UpdatedAt = time.Now()
	b.parts[p.Partition] = p
}

func (b *partitionBook) lagOf(p PartitionStatus, queue bool) int64 {
	end := p.HighWatermark
	if b.stable && !queue {
		end = p.LastStable
	}
	if p.Position < 0 || queue {
		return end
	}
	return max(end-p.Position, 0)
}

// setEnds records the partitions' ends as read from the broker, for the
// partitions this instance works.
func (b *partitionBook) setEnds(ends map[int]LogEnd) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, p := range b.parts {
		e, ok := ends[id]
		if !ok || b.queues[id] {
			continue
		}
		p.HighWatermark = max(p.HighWatermark, e.HighWatermark)
		p.LastStable = max(p.LastStable, e.LastStable)
		p.Lag = b.lagOf(p, false)
		b.parts[id] = p
	}
}

// setQueueLag records a queue's approximate visible and in-flight
// messages as the lag of its entry.
func (b *partitionBook) setQueueLag(id int, lag int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.unknown, id)
	if p, ok := b.parts[id]; ok && b.queues[id] {
		p.HighWatermark = lag
		p.Lag = b.lagOf(p, true)
		p.LagUnknown = false
		b.parts[id] = p
	}
}

// setQueueLagUnknown records that a queue's counts could not be read: its
// lag is unknown, and counts as none, for the watchdog and ReadyMaxLag
// (neither may act on a figure that is no longer true).
func (b *partitionBook) setQueueLagUnknown(id int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.queues[id] {
		return
	}
	if b.unknown == nil {
		b.unknown = map[int]bool{}
	}
	b.unknown[id] = true
	if p, ok := b.parts[id]; ok {
		p.HighWatermark, p.Lag, p.LagUnknown = 0, 0, true
		b.parts[id] = p
	}
}

// lagUnknown reports whether the lag of an entry this instance works could
// not be read.
func (b *partitionBook) lagUnknown() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.parts {
		if p.LagUnknown {
			return true
		}
	}
	return false
}

// totalLag is the lag of every partition this instance works.
func (b *partitionBook) totalLag() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var n int64
	for _, p := range b.parts {
		n += p.Lag
	}
	return n
}

func (b *partitionBook) drop(p int, by any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.owner[p] == by {
		delete(b.parts, p)
		delete(b.owner, p)
	}
}

func (b *partitionBook) list() []PartitionStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]PartitionStatus, 0, len(b.parts))
	for _, p := range b.parts {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Partition < out[j].Partition })
	return out
}

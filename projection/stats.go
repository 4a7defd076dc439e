package projection

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/projector/projector/observe"
)

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

// The status's types, in package observe.
type (
	Counters        = observe.Counters
	PartitionStatus = observe.PartitionStatus
	HeldJob         = observe.HeldJob
	Status          = observe.Status
	OpenTransaction = observe.OpenTransaction
)

// tally counts one batch's outcomes before they are committed.
type tally struct {
	consumed, applied, stale, duplicates, conflicts, held, quarantined int64
	deleted, covered                                                   int64
}

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

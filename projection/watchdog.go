package projection

import (
	"time"

	"github.com/projector/projector/observe"
)

// ErrStalled ends [Projector.Run] when a partition this instance works has
// lag and its position has not moved for StallTimeout ([observe.ErrStalled]).
var ErrStalled = observe.ErrStalled

// swapWaitFresh is how long, beyond two claim lock bounds (a retry's
// wait), after a worker last found a rebuild's swap holding its partition
// the watchdog still counts the pause as the swap's.
const swapWaitFresh = 10 * time.Second

// watched is p as its stall watchdog sees it ([observe.Watched]).
type watched struct{ p *Projector }

func (w watched) Partitions() []PartitionStatus { return w.p.book.list() }

// Paused: an outage of PostgreSQL or the source (Kafka's brokers, the SQS
// queue) is not a wedge (nothing in the process is stuck, it is logged,
// /readyz says so), and a restart would not end it. A rebuild's swap
// pauses every partition's writes, for as long as it runs; the workers
// keep saying so (each retry, every few seconds), and the pause is not a
// stall.
func (w watched) Paused(now time.Time) bool {
	p := w.p
	fresh := swapWaitFresh + 2*p.cfg.Store.ClaimLockTimeout()
	swapping := now.Sub(time.Unix(0, p.swapWaitAt.Load())) < fresh
	return p.dbOutage.Failing() || p.sourceOutage.Failing() || swapping
}

func (w watched) ApplyBounded(partition int, now time.Time) bool {
	return w.p.applyBounded(partition, now)
}

// applyBounded reports whether partition's batch transaction is in flight
// and still within its own time limit (and the shutdown grace beyond it).
// Such a batch is not a wedge: PostgreSQL is making it wait (a lock, a
// slow trigger, a long statement) and it either commits or is given up
// and retried as a database failure, which the watchdog does not count
// either. Without this, the default --stall-timeout (2m), equal to the
// default batch limit (2m), would stop the instance in the middle of a
// batch that was allowed to run.
func (p *Projector) applyBounded(partition int, now time.Time) bool {
	v, ok := p.applying.Load(partition)
	if !ok {
		// Waiting for a batch slot is waiting for the holders' batches.
		return p.slots.bounded(partition, now, batchTimeout(p.cfg.Store)+shutdownGrace)
	}
	started := time.Unix(0, v.(int64))
	return now.Sub(started) < batchTimeout(p.cfg.Store)+shutdownGrace
}

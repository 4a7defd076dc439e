package projection

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// ErrStalled ends [Projector.Run] when a partition this instance works has
// lag and its position has not moved for StallTimeout: a wedged handler or
// connection that nothing inside the process will undo. kafka-go has no
// max-poll-interval of its own, so without this the partition would stay
// assigned to a member that never moves it. The process should exit
// non-zero and let its supervisor start it again; the partition's next
// owner, this one restarted or another, goes on from the stored position.
var ErrStalled = errors.New("projection: partition stalled")

// stallExitGrace bounds how long Run waits, after a stall, for the
// instance to stop cleanly: a wedged worker may never return, and the
// process must still exit.
const stallExitGrace = 20 * time.Second

// swapWaitFresh is how long, beyond two claim lock bounds (a retry's
// wait), after a worker last found a rebuild's swap holding its partition
// the watchdog still counts the pause as the swap's.
const swapWaitFresh = 10 * time.Second

// stallState is the stall, once found, for /healthz.
type stallState struct {
	err atomic.Pointer[error]
}

// progressMark is where a partition was, and since when.
type progressMark struct {
	epoch, position int64
	since           time.Time
}

// watchProgress calls stalled once, with an error wrapping [ErrStalled],
// when a partition of this instance has lag and its position has not
// moved for StallTimeout. A partition with no lag, or one claimed again,
// starts its clock afresh; so does every partition while PostgreSQL or
// the source (Kafka's brokers, the SQS queue) is failing: an outage is not
// a wedge (nothing in the process is stuck, it is logged, /readyz says
// so), and a restart would not end it.
func (p *Projector) watchProgress(ctx context.Context, stalled func(error)) {
	timeout := p.cfg.StallTimeout
	t := time.NewTicker(min(max(timeout/20, 10*time.Millisecond), time.Second))
	defer t.Stop()
	marks := map[int]progressMark{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		// A rebuild's swap pauses every partition's writes, for as long as
		// it runs; the workers keep saying so (each retry, every few
		// seconds), and the pause is not a stall.
		fresh := swapWaitFresh + 2*p.cfg.Store.ClaimLockTimeout()
		swapping := now.Sub(time.Unix(0, p.swapWaitAt.Load())) < fresh
		seen := map[int]bool{}
		outage := p.dbOutage.Failing() || p.sourceOutage.Failing()
		for _, ps := range p.book.list() {
			seen[ps.Partition] = true
			m, ok := marks[ps.Partition]
			if !ok || outage || swapping || p.applyBounded(ps.Partition, now) || ps.Lag == 0 || m.epoch != ps.Epoch || m.position != ps.Position {
				marks[ps.Partition] = progressMark{epoch: ps.Epoch, position: ps.Position, since: now}
				continue
			}
			if d := now.Sub(m.since); d >= timeout {
				err := fmt.Errorf("%w: partition %d has lag %d and its position %d has not moved for %s (stall timeout %s)",
					ErrStalled, ps.Partition, ps.Lag, ps.Position, d.Round(time.Second), timeout)
				p.stall.err.Store(&err)
				p.counters.stalls.Add(1)
				p.cfg.Logger.Error("partition stalled; stopping so that a supervisor starts the process again",
					"topic", p.cfg.Topic, "partition", ps.Partition, "lag", ps.Lag, "position", ps.Position,
					"no_progress_for", d.Round(time.Second), "stall_timeout", timeout)
				stalled(err)
				return
			}
		}
		for id := range marks {
			if !seen[id] {
				delete(marks, id)
			}
		}
	}
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
		return false
	}
	started := time.Unix(0, v.(int64))
	return now.Sub(started) < batchTimeout(p.cfg.Store)+shutdownGrace
}

// stallCheck is the progress check of /healthz.
func (p *Projector) stallCheck() Check {
	if e := p.stall.err.Load(); e != nil {
		return Check{Name: "progress", Detail: (*e).Error()}
	}
	return Check{Name: "progress", OK: true,
		Detail: fmt.Sprintf("no partition with lag has gone %s without progress", p.cfg.StallTimeout)}
}

// runWatched runs run(ctx) under the progress watchdog. On a stall it
// cancels run's context and returns the stall's error once run has
// returned, or after stallExitGrace if it does not: then run's goroutine
// is left behind on purpose, since the caller is expected to exit the
// process.
func (p *Projector) runWatched(ctx context.Context, run func(context.Context) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stalled := make(chan error, 1)
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		p.watchProgress(wctx, func(err error) {
			stalled <- err
			cancel(err)
		})
	})
	defer wg.Wait()
	defer stopWatch()
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	select {
	case err := <-done:
		if cause := context.Cause(ctx); errors.Is(cause, ErrStalled) {
			return cause
		}
		return err
	case err := <-stalled:
		t := time.NewTimer(stallExitGrace)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			p.cfg.Logger.Error("the stalled instance did not stop in time; returning without it", "waited", stallExitGrace)
		}
		return err
	}
}

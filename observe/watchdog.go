package observe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// ErrStalled ends the engine's Run when a partition this instance works
// has lag and its position has not moved for the stall timeout: a wedged
// handler or connection that nothing inside the process will undo.
// kafka-go has no max-poll-interval of its own, so without this the
// partition would stay assigned to a member that never moves it. The
// process should exit non-zero and let its supervisor start it again; the
// partition's next owner, this one restarted or another, goes on from the
// stored position.
var ErrStalled = errors.New("projection: partition stalled")

// StallExitGrace bounds how long Run waits, after a stall, for the
// instance to stop cleanly: a wedged worker may never return, and the
// process must still exit.
const StallExitGrace = 20 * time.Second

// Watched is the engine as the stall watchdog sees it.
type Watched interface {
	// Partitions are the partitions this instance works.
	Partitions() []PartitionStatus
	// Paused reports whether every partition is paused at now by what is
	// not a wedge: PostgreSQL or the source failing (an outage is logged,
	// /readyz says so, and a restart would not end it), or a rebuild's
	// swap holding the partitions' writes.
	Paused(now time.Time) bool
	// ApplyBounded reports whether partition's batch transaction is in
	// flight at now and still within its own time limit: PostgreSQL makes
	// it wait, and it either commits or is given up and retried.
	ApplyBounded(partition int, now time.Time) bool
}

// Watchdog stops the engine when a partition with lag makes no progress
// for Timeout, and says so on /healthz.
type Watchdog struct {
	Timeout time.Duration
	Topic   string
	Log     *slog.Logger
	Engine  Watched
	// Stalls counts the stalls found.
	Stalls *atomic.Int64

	// err is the stall, once found.
	err atomic.Pointer[error]
}

// progressMark is where a partition was, and since when.
type progressMark struct {
	epoch, position int64
	since           time.Time
}

// watch calls stalled once, with an error wrapping [ErrStalled], when a
// partition of this instance has lag and its position has not moved for
// Timeout. A partition with no lag, or one claimed again, starts its clock
// afresh; so does every partition while the engine is paused
// ([Watched].Paused), and a partition whose batch runs within its bound.
func (d *Watchdog) watch(ctx context.Context, stalled func(error)) {
	timeout := d.Timeout
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
		seen := map[int]bool{}
		paused := d.Engine.Paused(now)
		for _, ps := range d.Engine.Partitions() {
			seen[ps.Partition] = true
			m, ok := marks[ps.Partition]
			if !ok || paused || d.Engine.ApplyBounded(ps.Partition, now) || ps.Lag == 0 || m.epoch != ps.Epoch || m.position != ps.Position {
				marks[ps.Partition] = progressMark{epoch: ps.Epoch, position: ps.Position, since: now}
				continue
			}
			if since := now.Sub(m.since); since >= timeout {
				err := fmt.Errorf("%w: partition %d has lag %d and its position %d has not moved for %s (stall timeout %s)",
					ErrStalled, ps.Partition, ps.Lag, ps.Position, since.Round(time.Second), timeout)
				d.err.Store(&err)
				d.Stalls.Add(1)
				d.Log.Error("partition stalled; stopping so that a supervisor starts the process again",
					"topic", d.Topic, "partition", ps.Partition, "lag", ps.Lag, "position", ps.Position,
					"no_progress_for", since.Round(time.Second), "stall_timeout", timeout)
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

// Check is the progress check of /healthz.
func (d *Watchdog) Check() Check {
	if e := d.err.Load(); e != nil {
		return Check{Name: "progress", Detail: (*e).Error()}
	}
	return Check{Name: "progress", OK: true,
		Detail: fmt.Sprintf("no partition with lag has gone %s without progress", d.Timeout)}
}

// Run runs run(ctx) under the watchdog. On a stall it cancels run's
// context and returns the stall's error once run has returned, or after
// StallExitGrace if it does not: then run's goroutine is left behind on
// purpose, since the caller is expected to exit the process.
func (d *Watchdog) Run(ctx context.Context, run func(context.Context) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stalled := make(chan error, 1)
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		d.watch(wctx, func(err error) {
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
		t := time.NewTimer(StallExitGrace)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			d.Log.Error("the stalled instance did not stop in time; returning without it", "waited", StallExitGrace)
		}
		return err
	}
}

package snapshot

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The slow lane: a request in flight longer than SlowMedians times the
// median of recent answers (and at least SlowFloor) is slow.
const (
	// SlowMedians is how many median answer times a request runs before
	// it counts as slow.
	SlowMedians = 3
	// SlowFloor is the least time a request runs before it counts as
	// slow, so that an authority answering in a millisecond or two does
	// not send every request with a little jitter to the slow lane.
	SlowFloor = 50 * time.Millisecond
	// MovedThresholds is how many slow thresholds a request that moved
	// to the slow lane runs in all before it is cut.
	MovedThresholds = 3
	// slowSamples is how many recent answers the median is taken over;
	// until that many have been seen, no request counts as slow.
	slowSamples    = 64
	slowMinSamples = 8
)

// ErrSlow marks a request that ended without an answer because the
// authority was slow to give one: it ran past its timeout
// ([*TimeoutError]), or it moved to the slow lane and was still running at
// MovedThresholds times the slow threshold. The job's next request should
// start in the slow lane ([InSlowLane]), where it costs the prompt answers
// nothing.
var ErrSlow = errors.New("the authority is slow to answer this job")

// ErrSlowLaneFull marks a request cut at the slow threshold because the
// slow lane was full. It says nothing certain about the job (a prompt
// answer delayed by a busy moment is cut too): its next request starts in
// the main lane as before.
var ErrSlowLaneFull = errors.New("cut at the slow threshold with the slow lane full")

// slowError is a request cut by the lanes for slowness; it matches is
// ([ErrSlow] or [ErrSlowLaneFull]). A request cut by its timeout is a
// [*TimeoutError].
type slowError struct {
	msg string
	is  error
}

func (e *slowError) Error() string        { return e.msg }
func (e *slowError) Is(target error) bool { return target == e.is }

type slowLaneKey struct{}

// InSlowLane marks ctx so that the requests Fetch makes with it start in
// the slow lane: they wait for one of its slots rather than a main one,
// and run to their timeout there. It is for jobs whose last request ended with
// [ErrSlow]. Only half the slow lane (at least one slot) takes requests
// started there; the rest stays for requests moving over from the main
// lane. Without a slow lane it changes nothing.
func InSlowLane(ctx context.Context) context.Context {
	return context.WithValue(ctx, slowLaneKey{}, true)
}

// SlowStarts is how many requests started in a slow lane of slowCap slots
// may be in flight at once: half of it, at least one; 0 without one.
func SlowStarts(slowCap int) int {
	if slowCap <= 0 {
		return 0
	}
	return max(slowCap/2, 1)
}

func startsSlow(ctx context.Context) bool {
	s, _ := ctx.Value(slowLaneKey{}).(bool)
	return s
}

// lanes bound the requests in flight. A request starts in the main lane
// (MaxConcurrent slots), unless its job is known to be slow
// ([InSlowLane]). One still running past the slow threshold leaves the
// main lane: it moves to the slow lane (SlowConcurrent slots) when a slot
// is free there, and is cut if it is still running at MovedThresholds
// times the threshold; when the slow lane is full it is cut at once
// ([ErrSlowLaneFull]). Either way its main slot goes to the next request,
// so slow answers never hold the main lane longer than the threshold. A
// job found slow ([ErrSlow]: no answer in MovedThresholds times the
// threshold, or by its timeout) costs the main lane that much once: its
// next request starts in the slow lane, waits there for a slot if need be,
// and runs to its timeout. In flight there are never more than
// MaxConcurrent + SlowConcurrent requests.
type lanes struct {
	main chan struct{} // one token per request counted in the main lane
	// slow holds one token per request counted in the slow lane; starts
	// one per request started there, so that those never take all of it.
	slow   chan struct{}
	starts chan struct{}

	mu sync.Mutex
	// recent are the last answers' durations, a ring; median is theirs,
	// once there are slowMinSamples.
	recent []time.Duration
	next   int
	median time.Duration

	moved, full, cut, started atomic.Int64
}

func newLanes(mainCap, slowCap int) *lanes {
	l := &lanes{main: make(chan struct{}, mainCap)}
	if slowCap > 0 {
		l.slow = make(chan struct{}, slowCap)
		l.starts = make(chan struct{}, SlowStarts(slowCap))
	}
	return l
}

// flight is one request holding a slot.
type flight struct {
	l       *lanes
	timer   *time.Timer             // the next step of a main-lane request; guarded by l.mu
	cancel  context.CancelCauseFunc // ends the request
	slow    bool                    // counted in the slow lane
	started bool                    // started in the slow lane
	done    bool
}

// acquire waits for a slot, or for ctx to end: a slow one when ctx says
// so and there is a slow lane, else a main one. cancel ends the request
// when it is cut.
func (l *lanes) acquire(ctx context.Context, cancel context.CancelCauseFunc) (*flight, error) {
	f := &flight{l: l, cancel: cancel}
	if l.slow != nil && startsSlow(ctx) {
		select {
		case l.starts <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		select {
		case l.slow <- struct{}{}:
		case <-ctx.Done():
			<-l.starts
			return nil, ctx.Err()
		}
		f.slow, f.started = true, true
		l.started.Add(1)
		return f, nil
	}
	select {
	case l.main <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if after := l.slowAfter(); after > 0 {
		// Under the lock: overdue replaces the timer.
		l.mu.Lock()
		f.timer = time.AfterFunc(after, func() { f.overdue(after) })
		l.mu.Unlock()
	}
	return f, nil
}

// slowAfter is how long a request starting now runs before it is slow; 0
// when none is (no slow lane, or too few answers seen to know).
func (l *lanes) slowAfter() time.Duration {
	if l.slow == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.median == 0 {
		return 0
	}
	return max(SlowFloor, SlowMedians*l.median)
}

// overdue runs when the request has been in the main lane past the
// threshold: it moves to the slow lane, or is cut.
func (f *flight) overdue(after time.Duration) {
	l := f.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if f.done {
		return
	}
	select {
	case l.slow <- struct{}{}:
		f.slow = true
		<-l.main
		l.moved.Add(1)
		// A moved request is given MovedThresholds times the threshold
		// in all: enough for a prompt answer delayed by a busy moment,
		// not so long that slow answers fill the slow lane and the next
		// ones have to be cut. Its job's next request starts in the slow
		// lane and runs to its timeout.
		f.timer = time.AfterFunc((MovedThresholds-1)*after, func() { f.overstay(MovedThresholds * after) })
	default:
		l.full.Add(1)
		l.cut.Add(1)
		l.observeLocked(after)
		f.cancel(&slowError{msg: fmt.Sprintf("no answer within %s, the slow threshold, while the slow lane was full: cut", after.Round(time.Millisecond)), is: ErrSlowLaneFull})
	}
}

// overstay runs when a moved request has run MovedThresholds times the
// threshold: it is cut.
func (f *flight) overstay(total time.Duration) {
	l := f.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if f.done {
		return
	}
	l.cut.Add(1)
	f.cancel(&slowError{msg: fmt.Sprintf("no answer within %s, moved to the slow lane at the slow threshold: cut, the job is found slow", total.Round(time.Millisecond)), is: ErrSlow})
}

// release frees the request's slot.
func (f *flight) release() {
	l := f.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if f.timer != nil {
		f.timer.Stop()
	}
	f.done = true
	switch {
	case f.started:
		<-l.slow
		<-l.starts
	case f.slow:
		<-l.slow
	default:
		<-l.main
	}
}

// observe records how long an answered request took.
func (l *lanes) observe(d time.Duration) {
	if l.slow == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.observeLocked(d)
}

// observeLocked records an answer time. A request cut with the slow lane
// full counts too, at the threshold: its answer would have taken at least
// that long. So when the authority slows down as a whole, fills the slow
// lane and has most requests cut, the median rises with it and they stop
// being cut; counting answers alone, a median no answer came in under
// would stay put. (Moved requests cut later are jobs found slow: their
// next requests run to their timeout in the slow lane, and their answers
// count.)
func (l *lanes) observeLocked(d time.Duration) {
	if len(l.recent) < slowSamples {
		l.recent = append(l.recent, d)
	} else {
		l.recent[l.next] = d
		l.next = (l.next + 1) % slowSamples
	}
	if len(l.recent) < slowMinSamples {
		return
	}
	s := slices.Clone(l.recent)
	slices.Sort(s)
	l.median = s[len(s)/2]
}

// LaneStats is a snapshot of the client's request lanes.
type LaneStats struct {
	// Main and Slow are the requests in flight counted in each lane.
	Main, Slow int
	// SlowAfter is how long a request starting now runs before it leaves
	// the main lane: SlowMedians times the median of the last answers, at
	// least SlowFloor; 0 when none does (no slow lane, or too few answers
	// yet).
	SlowAfter time.Duration
	// Moved counts requests moved to the slow lane; Full counts requests
	// that ran past SlowAfter while the slow lane was full, and so were
	// cut; Cut counts every request cut, those and the moved ones that ran
	// MovedThresholds times SlowAfter; Started counts requests started in
	// the slow lane ([InSlowLane]).
	Moved, Full, Cut, Started int64
}

// Lanes reports the client's request lanes.
func (c *Client) Lanes() LaneStats {
	l := c.lanes()
	return LaneStats{Main: len(l.main), Slow: len(l.slow), SlowAfter: l.slowAfter(),
		Moved: l.moved.Load(), Full: l.full.Load(), Cut: l.cut.Load(), Started: l.started.Load()}
}

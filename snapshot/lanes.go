package snapshot

import (
	"context"
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
	// slowSamples is how many recent answers the median is taken over;
	// until that many have been seen, no request counts as slow.
	slowSamples    = 64
	slowMinSamples = 8
)

// lanes bound the requests in flight. Every request starts in the main
// lane (MaxConcurrent slots). One still running past the slow threshold
// moves to the slow lane (SlowConcurrent slots) and gives its main slot
// to the next request, so slow answers do not starve prompt ones; when
// the slow lane is full it keeps its main slot and moves as soon as a
// slow slot frees, the longest overdue first. A moved request still ends
// at the client's Timeout: only the slot it counts against changes. In
// flight there are never more than MaxConcurrent + SlowConcurrent
// requests.
type lanes struct {
	main    chan struct{} // one token per request counted in the main lane
	slowCap int

	mu sync.Mutex
	// slow counts the requests in the slow lane; overdue are requests
	// past the threshold still in the main lane for want of a slow slot,
	// longest overdue first.
	slow    int
	overdue []*flight
	// recent are the last answers' durations, a ring; median is theirs,
	// once there are slowMinSamples.
	recent []time.Duration
	next   int
	median time.Duration

	moved, kept atomic.Int64
}

func newLanes(mainCap, slowCap int) *lanes {
	return &lanes{main: make(chan struct{}, mainCap), slowCap: max(slowCap, 0)}
}

// flight is one request holding a slot.
type flight struct {
	l       *lanes
	timer   *time.Timer
	slow    bool // counted in the slow lane
	waiting bool // overdue, in l.overdue
	done    bool
}

// acquire waits for a main slot, or for ctx to end.
func (l *lanes) acquire(ctx context.Context) (*flight, error) {
	select {
	case l.main <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	f := &flight{l: l}
	if after := l.slowAfter(); after > 0 {
		f.timer = time.AfterFunc(after, f.overdue)
	}
	return f, nil
}

// slowAfter is how long a request starting now runs before it is slow; 0
// when none is (no slow lane, or too few answers seen to know).
func (l *lanes) slowAfter() time.Duration {
	if l.slowCap == 0 {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.median == 0 {
		return 0
	}
	return max(SlowFloor, SlowMedians*l.median)
}

// overdue runs when the request has been in flight past the threshold.
func (f *flight) overdue() {
	l := f.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if f.done {
		return
	}
	if l.slow < l.slowCap {
		l.moveLocked(f)
		return
	}
	f.waiting = true
	l.overdue = append(l.overdue, f)
	l.kept.Add(1)
}

// moveLocked counts f in the slow lane and frees its main slot.
func (l *lanes) moveLocked(f *flight) {
	l.slow++
	f.slow, f.waiting = true, false
	<-l.main
	l.moved.Add(1)
}

// release frees the request's slot; a freed slow slot goes to the longest
// overdue request still in the main lane.
func (f *flight) release() {
	if f.timer != nil {
		f.timer.Stop()
	}
	l := f.l
	l.mu.Lock()
	defer l.mu.Unlock()
	f.done = true
	if !f.slow {
		if f.waiting {
			if i := slices.Index(l.overdue, f); i >= 0 {
				l.overdue = slices.Delete(l.overdue, i, i+1)
			}
		}
		<-l.main
		return
	}
	l.slow--
	if len(l.overdue) > 0 {
		next := l.overdue[0]
		l.overdue = slices.Delete(l.overdue, 0, 1)
		l.moveLocked(next)
	}
}

// observe records how long an answered request took.
func (l *lanes) observe(d time.Duration) {
	if l.slowCap == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
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
	// SlowAfter is how long a request starting now runs before it moves
	// to the slow lane: SlowMedians times the median of the last answers,
	// at least SlowFloor; 0 when no request moves (no slow lane, or too
	// few answers yet).
	SlowAfter time.Duration
	// Moved counts requests moved to the slow lane; Kept counts requests
	// that ran past SlowAfter while the slow lane was full and so stayed
	// in the main lane, for as long as it stayed full.
	Moved, Kept int64
}

// Lanes reports the client's request lanes.
func (c *Client) Lanes() LaneStats {
	l := c.lanes()
	after := l.slowAfter()
	l.mu.Lock()
	slow := l.slow
	l.mu.Unlock()
	return LaneStats{Main: len(l.main), Slow: slow, SlowAfter: after, Moved: l.moved.Load(), Kept: l.kept.Load()}
}

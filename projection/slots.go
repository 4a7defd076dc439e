package projection

import (
	"context"
	"sync"
	"time"
)

// batchSlots bounds the batches an instance plans and writes at once
// ([Config.BatchesInFlight]), whatever its number of partitions: while a
// batch is planned and written it holds its records decoded, the rows it
// read, the states it decoded and encodes and pgx's encoded statement. A nil
// *batchSlots bounds nothing (BatchesInFlight -1).
//
// A worker waiting for a slot waits for another partition's transaction:
// it keeps its beat while the slots' holders are within their own time
// limit, and the stall watchdog counts the wait as a pause then
// ([batchSlots.bounded]). Fewer slots hold less memory but lengthen the
// tail of the latency under load (docs/performance.md).
type batchSlots struct {
	ch chan struct{}
	// waiting and holding map a partition to a token of when it began to
	// wait for a slot, or took one.
	waiting, holding sync.Map
}

// slotToken is one wait or one hold, told apart from the partition's next
// by its pointer.
type slotToken struct{ at time.Time }

func newBatchSlots(n int) *batchSlots {
	if n <= 0 {
		return nil
	}
	return &batchSlots{ch: make(chan struct{}, n)}
}

// acquire takes a slot for partition; false if ctx ended first. While it
// waits, beat runs every beatEvery as long as the holders are within limit
// ([batchSlots.bounded]). Waiters take the slots in the order they came.
func (s *batchSlots) acquire(ctx context.Context, partition int, beat func(), beatEvery, limit time.Duration) (*slotToken, bool) {
	if s == nil {
		return nil, true
	}
	select {
	case s.ch <- struct{}{}:
		return s.hold(partition), true
	default:
	}
	w := &slotToken{at: time.Now()}
	s.waiting.Store(partition, w)
	defer s.waiting.CompareAndDelete(partition, w)
	// The beat runs apart, so the send below keeps its place in the
	// channel's queue of senders.
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(beatEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				if s.bounded(partition, now, limit) {
					beat()
				}
			}
		}
	}()
	select {
	case s.ch <- struct{}{}:
		return s.hold(partition), true
	case <-ctx.Done():
		return nil, false
	}
}

func (s *batchSlots) hold(partition int) *slotToken {
	h := &slotToken{at: time.Now()}
	s.holding.Store(partition, h)
	return h
}

// release gives back the slot h holds for partition.
func (s *batchSlots) release(partition int, h *slotToken) {
	if s == nil {
		return
	}
	s.holding.CompareAndDelete(partition, h)
	<-s.ch
}

// bounded reports whether partition waits for a slot while every slot's
// holder took it less than limit ago: the wait is then another batch's,
// which its own time limit bounds, and not a wedge.
func (s *batchSlots) bounded(partition int, now time.Time, limit time.Duration) bool {
	if s == nil {
		return false
	}
	if _, ok := s.waiting.Load(partition); !ok {
		return false
	}
	ok := true
	s.holding.Range(func(_, v any) bool {
		if now.Sub(v.(*slotToken).at) >= limit {
			ok = false
		}
		return ok
	})
	return ok
}

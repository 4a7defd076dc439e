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
// *batchSlots bounds nothing (the default).
//
// A worker waiting for a slot waits for another partition's transaction:
// it keeps its beat, and the stall watchdog counts the wait as a pause as
// long as the slots' holders are within their own time limit
// ([batchSlots.bounded]). Fewer slots hold less memory but lengthen the
// tail of the latency under load (docs/performance.md).
type batchSlots struct {
	ch chan struct{}
	// waiting and holding map a partition to when it began to wait for
	// a slot, or took one (UnixNano).
	waiting, holding sync.Map
}

func newBatchSlots(n int) *batchSlots {
	if n <= 0 {
		return nil
	}
	return &batchSlots{ch: make(chan struct{}, n)}
}

// acquire takes a slot for partition, beating every beatEvery while it
// waits; false if ctx ended first.
func (s *batchSlots) acquire(ctx context.Context, partition int, beat func(), beatEvery time.Duration) bool {
	if s == nil {
		return true
	}
	select {
	case s.ch <- struct{}{}:
		s.holding.Store(partition, time.Now().UnixNano())
		return true
	default:
	}
	s.waiting.Store(partition, time.Now().UnixNano())
	defer s.waiting.Delete(partition)
	t := time.NewTicker(beatEvery)
	defer t.Stop()
	for {
		select {
		case s.ch <- struct{}{}:
			s.holding.Store(partition, time.Now().UnixNano())
			return true
		case <-t.C:
			beat()
		case <-ctx.Done():
			return false
		}
	}
}

// release gives partition's slot back.
func (s *batchSlots) release(partition int) {
	if s == nil {
		return
	}
	s.holding.Delete(partition)
	<-s.ch
}

// bounded reports whether partition waits for a slot while every slot's
// holder is within limit of taking it: the wait is then another batch's,
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
		if now.Sub(time.Unix(0, v.(int64))) >= limit {
			ok = false
		}
		return ok
	})
	return ok
}

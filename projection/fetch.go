package projection

import (
	"context"
	"time"
)

// fetch waits for the first record, or until a held gap falls due or a
// resolution arrives, then gathers more for up to the linger time or the
// batch size. It returns early when ctx ends.
func (w *worker) fetch(ctx context.Context) []Record {
	// An idle worker still wakes up every idleWake, so its beat shows it
	// alive.
	wait := idleWake
	if w.attempts != nil && w.attempts.busy() {
		// Answers join the next batch as soon as they are ready.
		wait = attemptPoll
	}
	// A job falling due wakes the worker only if it can be taken then:
	// while the attempts' queues are full, it waits for room like the
	// rest, rather than waking the worker every few milliseconds.
	if due, ok := w.detector.NextDue(); ok && time.Until(due) < wait && (w.attempts == nil || w.attempts.canTake()) {
		wait = max(time.Until(due), 10*time.Millisecond)
	}
	recs, err := w.src.Fetch(ctx, wait)
	if err != nil {
		w.sourceOutage.Failed(err, time.Second)
		sleep(ctx, time.Second)
		return nil
	}
	return recs
}

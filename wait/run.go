package wait

import (
	"context"
	"sync"
	"time"

	"github.com/projector/projector/store"
)

// finalCheck bounds the last check Run makes when it stops, so that the
// waiters it answers hear whether they were reached.
const finalCheck = 2 * time.Second

// Run listens on the projection's channel and answers waiters until ctx
// ends; then it checks them once more and answers every one left with
// [ErrStopped]. A lost connection is listened again after Config.Retry,
// and every waiter checked, since notifications may have been missed
// meanwhile. It returns nil once stopped.
func (w *Waiter) Run(ctx context.Context) error {
	defer w.stop()
	for ctx.Err() == nil {
		err := w.listen(ctx)
		if ctx.Err() != nil {
			break
		}
		w.log.Warn("waiters: listening failed; listening again", "err", err, "in", w.retry)
		if !sleep(ctx, w.retry) {
			break
		}
	}
	return nil
}

// listen serves waiters on one listening connection until it fails or ctx
// ends.
func (w *Waiter) listen(ctx context.Context) error {
	l, err := w.store.Listen(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		_ = l.Close(context.WithoutCancel(ctx))
	}()
	notes := make(chan struct{}, 1)
	failed := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if _, err := l.Next(ctx); err != nil {
				failed <- err
				return
			}
			select {
			case notes <- struct{}{}:
			default: // a check is due already: it reads this batch too
			}
		}
	}()
	// Listening now: whatever commits from here on is heard, so one check
	// of every waiter covers what was missed before.
	all, due := true, true
	var retry, later <-chan time.Time
	// nextAll paces the checks of every waiter: however fast batches
	// commit, the loop reads at most a share of the time (see pace).
	var nextAll time.Time
	for {
		if due {
			start := time.Now()
			err := w.check(ctx, all)
			if all {
				nextAll = time.Now().Add(pace(time.Since(start)))
			}
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				w.log.Warn("waiters: check failed; checking again", "err", err, "in", w.retry)
				retry = time.After(w.retry)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			return err
		case <-notes:
			if wait := time.Until(nextAll); wait > 0 {
				// Checked a moment ago: once the pause ends, one check
				// covers this batch and any that commit meanwhile.
				if later == nil {
					later = time.After(wait)
				}
				due = false
				continue
			}
			all, due = true, true
		case <-later:
			later, all, due = nil, true, true
		case <-w.kick:
			all, due = false, true
		case <-retry:
			retry, all, due = nil, true, true
		}
	}
}

// Pacing of the checks of every waiter after a notification: the next
// waits pauseFactor times as long as the last took, at most maxPause, so
// that waking waiters takes at most about 1/(1+pauseFactor) of a core and
// of a connection however fast batches commit. With few waiters a check
// takes well under a millisecond and the pause is nothing; with 10,000 it
// adds a few tens of milliseconds to an answer.
const (
	pauseFactor = 4
	maxPause    = 100 * time.Millisecond
)

func pace(took time.Duration) time.Duration { return min(pauseFactor*took, maxPause) }

// check reads the progress of the fresh waiters, or of all, in one query,
// and answers those reached.
func (w *Waiter) check(ctx context.Context, all bool) error {
	w.mu.Lock()
	var batch []*waiter
	if all {
		batch = make([]*waiter, 0, len(w.all))
		for wt := range w.all {
			batch = append(batch, wt)
		}
	} else {
		for _, wt := range w.fresh {
			if _, ok := w.all[wt]; ok {
				batch = append(batch, wt)
			}
		}
	}
	w.fresh = nil
	w.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	// What each job's waiters last saw: only the jobs that moved since
	// come back. Waiters of one job that saw different things (one new)
	// have it read in full.
	w.mu.Lock()
	seen := make(map[string]store.Seen)
	var parts []store.PositionKey
	seenPart := map[store.PositionKey]bool{}
	for _, wt := range batch {
		switch {
		case !wt.byJob:
			if !seenPart[wt.pos] {
				seenPart[wt.pos] = true
				parts = append(parts, wt.pos)
			}
		default:
			if sn, ok := seen[wt.job]; ok && sn != wt.seen {
				seen[wt.job] = store.Unseen
			} else if !ok {
				seen[wt.job] = wt.seen
			}
		}
	}
	w.mu.Unlock()
	jobs, positions, err := w.store.Reached(ctx, seen, parts)
	if err != nil {
		// The batch is checked again on the next wake-up (all waiters).
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, wt := range batch {
		if _, ok := w.all[wt]; !ok || wt.reached {
			continue
		}
		if wt.byJob {
			st, moved := jobs[wt.job]
			if !moved {
				continue
			}
			wt.state, wt.seen = st, store.Seen{Version: st.Version, Held: st.Held}
			wt.reached = st.Version >= wt.version
		} else {
			wt.position = positions[wt.pos]
			wt.reached = wt.position > wt.offset
		}
		if wt.reached {
			delete(w.all, wt)
			close(wt.done)
		}
	}
	return nil
}

// stop refuses new waiters, checks those held once more, and answers the
// rest with ErrStopped.
func (w *Waiter) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), finalCheck)
	defer cancel()
	if err := w.check(ctx, true); err != nil {
		w.log.Warn("waiters: last check failed", "err", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for wt := range w.all {
		delete(w.all, wt)
		close(wt.done)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

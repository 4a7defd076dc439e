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
	all := true
	var retry <-chan time.Time
	for {
		if err := w.check(ctx, all); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			w.log.Warn("waiters: check failed; checking again", "err", err, "in", w.retry)
			retry = time.After(w.retry)
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			return err
		case <-notes:
			all = true
		case <-w.kick:
			all = false
		case <-retry:
			retry, all = nil, true
		}
	}
}

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
	var ids []string
	var parts []store.PositionKey
	seenJob, seenPart := map[string]bool{}, map[store.PositionKey]bool{}
	for _, wt := range batch {
		if wt.byJob && !seenJob[wt.job] {
			seenJob[wt.job] = true
			ids = append(ids, wt.job)
		} else if !wt.byJob && !seenPart[wt.pos] {
			seenPart[wt.pos] = true
			parts = append(parts, wt.pos)
		}
	}
	jobs, positions, err := w.store.Reached(ctx, ids, parts)
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
			wt.state = jobs[wt.job]
			wt.reached = wt.state.Version >= wt.version
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

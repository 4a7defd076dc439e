package wait

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/projector/projector/store"
)

// finalCheck bounds the last check Run makes when it stops, so that the
// waiters it answers hear whether they were reached.
const finalCheck = 2 * time.Second

// Run holds the process's lease, listens on the projection's channel and
// answers waiters until ctx ends; then it checks them once more, releases
// the lease and answers every one left with [ErrStopped]. A lost
// connection (one that fails, or does not answer the heartbeat) is
// listened again after Config.Retry, and every waiter checked, since
// notifications may have been missed meanwhile. It returns nil once
// stopped; a Waiter runs once, and once stopped answers every new wait
// with [ErrStopped].
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
	// Bounded as a heartbeat is: a connection the pool hands out that is
	// already cut without a word (its ping, or LISTEN, never answered)
	// would hold Run, its checks and its poll, for ever.
	lctx, lcancel := context.WithTimeout(ctx, w.heartbeat)
	l, err := w.store.Listen(lctx)
	lcancel()
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
	// The lease first: from its commit on, every instance's batches are
	// announced; one that began before may commit unannounced, and the
	// poll below covers it.
	if err := w.beat(ctx, l); err != nil {
		return err
	}
	heard := &notices{ready: make(chan struct{}, 1)}
	failed := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		failed <- w.receive(ctx, l, heard)
	}()
	// Listening now: whatever is announced from here on is heard, so one
	// check of every waiter covers what was missed before.
	sel, due := selection{all: true}, true
	var retry, later <-chan time.Time
	poll := time.NewTicker(w.poll)
	defer poll.Stop()
	// nextNoticed paces the checks after notices: however fast batches
	// commit, the loop reads at most a share of the time (see pace).
	var nextNoticed time.Time
	for {
		if due {
			start := time.Now()
			// Bounded: a pooled connection cut without a word must not
			// hold the loop.
			cctx, cancel := context.WithTimeout(ctx, checkBeats*w.heartbeat)
			read, err := w.check(cctx, sel)
			cancel()
			if !sel.fresh {
				nextNoticed = time.Now().Add(pace(read, time.Since(start)))
			}
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				w.log.Warn("waiters: check failed; checking all again", "err", err, "in", w.retry)
				retry = time.After(w.retry)
			}
		}
		due = false
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			return err
		case <-heard.ready:
			if wait := time.Until(nextNoticed); wait > 0 {
				// Checked a moment ago: once the pause ends, one check
				// covers this batch and any that commit meanwhile.
				if later == nil {
					later = time.After(wait)
				}
				continue
			}
			sel, due = heard.take(), true
		case <-later:
			later, sel, due = nil, heard.take(), true
		case <-poll.C:
			// Whatever was announced or not: every waiter is read at
			// least this often. Paced as the checks after notices are.
			if time.Until(nextNoticed) > 0 {
				continue
			}
			heard.take()
			sel, due = selection{all: true}, true
		case <-w.kick:
			sel, due = selection{fresh: true}, true
		case <-retry:
			retry, sel, due = nil, selection{all: true}, true
		}
	}
}

// receive hands the notifications heard on l to heard until l fails or
// ctx ends. Every Heartbeat it renews the lease on l (or pings l): a
// connection that does not answer within a Heartbeat is lost, even one
// cut without a word, which would otherwise wait for ever.
func (w *Waiter) receive(ctx context.Context, l *store.Listener, heard *notices) error {
	for {
		beat := time.Now().Add(w.heartbeat)
		for {
			nctx, cancel := context.WithDeadline(ctx, beat)
			payload, err := l.Next(nctx)
			cancel()
			if err == nil {
				heard.add(payload)
				continue
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			break
		}
		if err := w.beat(ctx, l); err != nil {
			return err
		}
	}
}

// checkBeats bounds a check, in heartbeats.
const checkBeats = 2

// leaseBeats is a lease's life in heartbeats: a waiter missing a few
// renewals (a slow server) keeps its lease.
const leaseBeats = 6

// beat renews the lease on l, or pings l where the server refused the
// lease, within a Heartbeat.
func (w *Waiter) beat(ctx context.Context, l *store.Listener) error {
	ctx, cancel := context.WithTimeout(ctx, w.heartbeat)
	defer cancel()
	if !w.leaseRefused {
		err := l.HoldWaitLease(ctx, w.holder, leaseBeats*w.heartbeat)
		var refused *store.LeaseRefusedError
		if !errors.As(err, &refused) {
			return err
		}
		w.leaseRefused = true
		w.log.Warn("waiters: the lease was refused, so instances announce their batches only if started with --notify; waiters are read every poll meanwhile",
			"err", err, "poll", w.poll)
	}
	return l.Ping(ctx)
}

// Pacing of the checks after notices: after one that read at least
// paceAbove waiters, the next waits pauseFactor times as long as it took,
// at most maxPause, so that waking many waiters takes about
// 1/(1+pauseFactor) of a core and of a connection at most however fast
// batches commit (until a check takes longer than maxPause/4). A check of
// the few waiters a batch may concern is not paced: its time is mostly
// the round trip, and a pause would only delay the answer.
const (
	paceAbove   = 1000
	pauseFactor = 4
	maxPause    = 100 * time.Millisecond
)

func pace(read int, took time.Duration) time.Duration {
	if read < paceAbove {
		return 0
	}
	return min(pauseFactor*took, maxPause)
}

// selection says which waiters a check reads.
type selection struct {
	// fresh: the waiters not read yet; all: every waiter; else those the
	// notices may concern.
	fresh, all bool
	notices    []store.Notice
}

// wants reports whether the selection may concern wt (fresh apart).
func (sel selection) wants(wt *waiter) bool {
	if sel.all {
		return true
	}
	for _, n := range sel.notices {
		if n.All || wt.byJob && n.MayHaveChanged(wt.hash) {
			return true
		}
		if !wt.byJob && n.Topic == wt.pos.Topic && n.Partition == wt.pos.Partition {
			return true
		}
	}
	return false
}

// maxNotices bounds the notices kept between two checks; beyond, the next
// check reads every waiter.
const maxNotices = 64

// notices are those heard since the last check.
type notices struct {
	mu   sync.Mutex
	list []store.Notice
	all  bool
	// ready holds a signal while notices wait.
	ready chan struct{}
}

func (h *notices) add(payload string) {
	var n store.Notice
	h.mu.Lock()
	switch {
	case h.all:
	case len(h.list) >= maxNotices || json.Unmarshal([]byte(payload), &n) != nil:
		h.all, h.list = true, nil
	default:
		h.list = append(h.list, n)
	}
	h.mu.Unlock()
	select {
	case h.ready <- struct{}{}:
	default:
	}
}

func (h *notices) take() selection {
	h.mu.Lock()
	defer h.mu.Unlock()
	sel := selection{all: h.all, notices: h.list}
	h.all, h.list = false, nil
	return sel
}

// check reads the progress of the waiters sel selects in one query, and
// answers those reached. It returns how many waiters it read.
func (w *Waiter) check(ctx context.Context, sel selection) (int, error) {
	w.mu.Lock()
	var batch []*waiter
	if sel.fresh {
		for _, wt := range w.fresh {
			if _, ok := w.all[wt]; ok {
				batch = append(batch, wt)
			}
		}
		w.fresh = nil
	} else {
		for wt := range w.all {
			if sel.wants(wt) {
				batch = append(batch, wt)
			}
		}
		if sel.all {
			w.fresh = nil
		}
	}
	if len(batch) == 0 {
		w.mu.Unlock()
		return 0, nil
	}
	// What each job's waiters last saw: only the jobs that moved since
	// come back. Waiters of one job that saw different things (one new)
	// have it read in full.
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
		return len(batch), err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, wt := range batch {
		if _, ok := w.all[wt]; !ok || wt.reached {
			continue
		}
		wt.read = true
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
	return len(batch), nil
}

// stop refuses new waiters, checks those held once more, and answers the
// rest with ErrStopped.
func (w *Waiter) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), finalCheck)
	defer cancel()
	if _, err := w.check(ctx, selection{all: true}); err != nil {
		w.log.Warn("waiters: last check failed", "err", err)
	}
	if !w.leaseRefused {
		// Announcing for this process's waiters is no longer needed.
		if err := w.store.ReleaseWaitLease(ctx, w.holder); err != nil {
			w.log.Warn("waiters: releasing the lease failed; it expires by itself", "err", err)
		}
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

package observe

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// OutageLogEvery is the most often an outage in progress is logged again.
const OutageLogEvery = 30 * time.Second

// Outage turns the failures and successes of many goroutines talking to
// one service into few log lines: one when it starts failing, at most one
// per OutageLogEvery while it keeps failing (the error, the attempts so far,
// the next retry), and one when it answers again.
type Outage struct {
	Service string // "PostgreSQL", "Kafka", "SQS"
	Log     *slog.Logger

	mu       sync.Mutex
	since    time.Time // zero: no outage
	logged   time.Time
	attempts int
	lastErr  string
	// over is closed when the outage in progress ends, so retries
	// sleeping through their backoff go at once.
	over chan struct{}
}

// Failed records a failed attempt; next is when the caller retries.
func (o *Outage) Failed(err error, next time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	o.attempts++
	o.lastErr = err.Error()
	if o.since.IsZero() {
		o.since, o.logged = now, now
		o.over = make(chan struct{})
		o.Log.Error(o.Service+" is failing; retrying", "err", err, "attempt", o.attempts, "next_retry", next)
		return
	}
	if now.Sub(o.logged) >= OutageLogEvery {
		o.logged = now
		o.Log.Error(o.Service+" is still failing; retrying", "err", err, "attempt", o.attempts,
			"next_retry", next, "failing_for", now.Sub(o.since).Round(time.Millisecond))
	}
}

// Failing reports whether an outage is in progress.
func (o *Outage) Failing() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.since.IsZero()
}

// FailingFor is how long the outage in progress has lasted at now, and
// its last error; 0 when there is none.
func (o *Outage) FailingFor(now time.Time) (time.Duration, string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since.IsZero() {
		return 0, ""
	}
	return now.Sub(o.since), o.lastErr
}

// OK records a success; it ends an outage in progress.
func (o *Outage) OK() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since.IsZero() {
		return
	}
	o.Log.Info(o.Service+" answers again", "failed_for", time.Since(o.since).Round(time.Millisecond),
		"failed_attempts", o.attempts, "last_err", o.lastErr)
	o.since, o.attempts, o.lastErr = time.Time{}, 0, ""
	close(o.over)
	o.over = nil
}

// Wait sleeps for d, or less if ctx ends or the outage in progress ends
// (another caller succeeded: the service answers again).
func (o *Outage) Wait(ctx context.Context, d time.Duration) {
	o.mu.Lock()
	over := o.over
	o.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-over: // nil when no outage: never ready
	}
}

// Sampler rate-limits a kind of log line: at most burst lines per window;
// the lines it holds back are counted and reported with the next line shown
// or by Flush.
type Sampler struct {
	Window time.Duration
	Burst  int

	mu     sync.Mutex
	start  time.Time
	shown  int
	hidden int
}

// Allow reports whether a line may be logged now, and how many were held
// back before it (to report with it).
func (s *Sampler) Allow(now time.Time) (ok bool, held int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.start) >= s.Window {
		s.start, s.shown = now, 0
	}
	if s.shown < s.Burst {
		s.shown++
		held, s.hidden = s.hidden, 0
		return true, held
	}
	s.hidden++
	return false, 0
}

// Flush returns, and forgets, the count of lines held back once their
// window has ended.
func (s *Sampler) Flush(now time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hidden == 0 || now.Sub(s.start) < s.Window {
		return 0
	}
	n := s.hidden
	s.hidden = 0
	return n
}

// AttemptsSoFar is the failed attempts of the outage in progress.
func (o *Outage) AttemptsSoFar() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.attempts
}

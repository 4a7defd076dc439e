package projection

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// outageLogEvery is the most often an outage in progress is logged again.
const outageLogEvery = 30 * time.Second

// outage turns the failures and successes of many goroutines talking to
// one service into few log lines: one when it starts failing, at most one
// per outageLogEvery while it keeps failing (the error, the attempts so far,
// the next retry), and one when it answers again.
type outage struct {
	service string // "PostgreSQL", "Kafka", "SQS"
	log     *slog.Logger

	mu       sync.Mutex
	since    time.Time // zero: no outage
	logged   time.Time
	attempts int
	lastErr  string
	// over is closed when the outage in progress ends, so retries
	// sleeping through their backoff go at once.
	over chan struct{}
}

// failed records a failed attempt; next is when the caller retries.
func (o *outage) failed(err error, next time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	o.attempts++
	o.lastErr = err.Error()
	if o.since.IsZero() {
		o.since, o.logged = now, now
		o.over = make(chan struct{})
		o.log.Error(o.service+" is failing; retrying", "err", err, "attempt", o.attempts, "next_retry", next)
		return
	}
	if now.Sub(o.logged) >= outageLogEvery {
		o.logged = now
		o.log.Error(o.service+" is still failing; retrying", "err", err, "attempt", o.attempts,
			"next_retry", next, "failing_for", now.Sub(o.since).Round(time.Millisecond))
	}
}

// failing reports whether an outage is in progress.
func (o *outage) failing() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.since.IsZero()
}

// failingFor is how long the outage in progress has lasted at now, and
// its last error; 0 when there is none.
func (o *outage) failingFor(now time.Time) (time.Duration, string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since.IsZero() {
		return 0, ""
	}
	return now.Sub(o.since), o.lastErr
}

// ok records a success; it ends an outage in progress.
func (o *outage) ok() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since.IsZero() {
		return
	}
	o.log.Info(o.service+" answers again", "failed_for", time.Since(o.since).Round(time.Millisecond),
		"failed_attempts", o.attempts, "last_err", o.lastErr)
	o.since, o.attempts, o.lastErr = time.Time{}, 0, ""
	close(o.over)
	o.over = nil
}

// wait sleeps for d, or less if ctx ends or the outage in progress ends
// (another caller succeeded: the service answers again).
func (o *outage) wait(ctx context.Context, d time.Duration) {
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

// sampler rate-limits a kind of log line: at most burst lines per window;
// the lines it holds back are counted and reported with the next line shown
// or by flush.
type sampler struct {
	window time.Duration
	burst  int

	mu     sync.Mutex
	start  time.Time
	shown  int
	hidden int
}

// allow reports whether a line may be logged now, and how many were held
// back before it (to report with it).
func (s *sampler) allow(now time.Time) (ok bool, held int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.start) >= s.window {
		s.start, s.shown = now, 0
	}
	if s.shown < s.burst {
		s.shown++
		held, s.hidden = s.hidden, 0
		return true, held
	}
	s.hidden++
	return false, 0
}

// flush returns, and forgets, the count of lines held back once their
// window has ended.
func (s *sampler) flush(now time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hidden == 0 || now.Sub(s.start) < s.window {
		return 0
	}
	n := s.hidden
	s.hidden = 0
	return n
}

// attemptsSoFar is the failed attempts of the outage in progress.
func (o *outage) attemptsSoFar() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.attempts
}

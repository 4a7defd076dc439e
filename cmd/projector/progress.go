package main

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"
)

// progress shows how far a long job (a rebuild) has come: records read of
// the target, the rate and an estimate of the time left. On a terminal it
// is one line rewritten in place a few times a second; otherwise (a log
// file, a pipe, a container's stdout) it is a log line every logEvery.
type progress struct {
	what     string
	target   int64
	tty      io.Writer // nil: not a terminal
	log      *slog.Logger
	logEvery time.Duration

	mu       sync.Mutex
	start    time.Time
	startAt  int64
	shown    time.Time
	lastDone int64
	lineLen  int
}

// progressLogEvery is how often progress is logged when not on a terminal.
const progressLogEvery = 10 * time.Second

// newProgress reports to w if it is a terminal, else to logger.
func newProgress(w io.Writer, logger *slog.Logger, what string, target int64) *progress {
	p := &progress{what: what, target: target, log: logger, logEvery: progressLogEvery, start: time.Now(), startAt: -1}
	if isTerminal(w) {
		p.tty = w
	}
	return p
}

// update reports done records of the target; it may be called often.
func (p *progress) update(done int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.startAt < 0 {
		// A resumed rebuild starts part way: the rate counts this run only.
		p.start, p.startAt = now, done
	}
	p.lastDone = done
	every := p.logEvery
	if p.tty != nil {
		every = 250 * time.Millisecond
	}
	if now.Sub(p.shown) < every {
		return
	}
	p.shown = now
	p.show(now, done)
}

// finish prints the final state and ends the live line.
func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.startAt < 0 {
		return
	}
	p.show(time.Now(), p.lastDone)
	if p.tty != nil {
		fmt.Fprintln(p.tty)
	}
}

func (p *progress) show(now time.Time, done int64) {
	elapsed := now.Sub(p.start)
	rate := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rate = float64(done-p.startAt) / s
	}
	eta := "unknown"
	left := max(p.target-done, 0)
	switch {
	case left == 0:
		eta = "0s"
	case rate > 0:
		eta = time.Duration(float64(left) / rate * float64(time.Second)).Round(time.Second).String()
	}
	pct := 100.0
	if p.target > 0 {
		pct = 100 * float64(min(done, p.target)) / float64(p.target)
	}
	if p.tty != nil {
		line := fmt.Sprintf("%s: %d/%d records (%.1f%%), %.0f records/s, %s left", p.what, done, p.target, pct, rate, eta)
		pad := max(p.lineLen-len(line), 0)
		p.lineLen = len(line)
		fmt.Fprintf(p.tty, "\r%s%*s", line, pad, "")
		return
	}
	p.log.Info(p.what+" progress", "read", done, "target", p.target, "percent", fmt.Sprintf("%.1f", pct),
		"rate_per_second", int64(rate), "eta", eta, "elapsed", elapsed.Round(time.Second))
}

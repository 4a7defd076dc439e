package projection

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/projector/projector/source"
)

// Health timings. A PostgreSQL answer (a commit, a claim, or the
// background ping) older than databaseFresh makes the instance not ready;
// with a ping every databasePingEvery bounded by databasePingTimeout, a
// cut-off database turns /readyz non-200 within about 7 s.
const (
	databaseFresh       = 5 * time.Second
	databasePingEvery   = time.Second
	databasePingTimeout = 2 * time.Second
	// progressEvery is how often catch-up progress is logged while the
	// lag is at least progressMinLag, and progressCheckEvery how often
	// that is looked at.
	progressCheckEvery = 5 * time.Second
	progressEvery      = 10 * time.Second
	progressMinLag     = 1000
)

// health is what /healthz and /readyz answer from.
type health struct {
	// dbAt is when PostgreSQL last answered (unix nanoseconds); dbErr the
	// last failure since.
	dbAt  atomic.Int64
	dbErr atomic.Pointer[string]

	mu    sync.Mutex
	loops map[*beat]string
}

// beat is a loop's sign of life. floor is the longest silence the loop
// keeps by design (its own wait and bound per turn): a loop is wedged only
// when silent for longer than both floor and StallTimeout, so a short
// StallTimeout does not make a monitor that turns every few seconds
// look wedged between two turns.
type beat struct {
	at    atomic.Int64
	floor time.Duration
}

func (b *beat) now() { b.at.Store(time.Now().UnixNano()) }

// loop registers a loop under name; it is alive while it beats at least
// once per StallTimeout, or per floor when that is longer. done removes it.
func (h *health) loop(name string, floor time.Duration) (b *beat, done func()) {
	b = &beat{floor: floor}
	b.now()
	h.mu.Lock()
	if h.loops == nil {
		h.loops = map[*beat]string{}
	}
	h.loops[b] = name
	h.mu.Unlock()
	return b, func() {
		h.mu.Lock()
		delete(h.loops, b)
		h.mu.Unlock()
	}
}

func (h *health) databaseAnswered() {
	h.dbAt.Store(time.Now().UnixNano())
	h.dbErr.Store(nil)
}

func (h *health) databaseFailed(err error) {
	s := err.Error()
	h.dbErr.Store(&s)
}

// Check is one condition of readiness or liveness ([source.Check]).
type Check = source.Check

// Health is what /healthz and /readyz serve: OK and, check by check, why.
type Health struct {
	OK     bool    `json:"ok"`
	Checks []Check `json:"checks"`
}

func healthOf(checks []Check) Health {
	h := Health{OK: true, Checks: checks}
	for _, c := range checks {
		h.OK = h.OK && c.OK
	}
	return h
}

// Liveness reports whether every loop of the instance still beats: a
// partition worker, or a health monitor, silent for longer than
// StallTimeout is wedged.
func (p *Projector) Liveness() Health {
	now := time.Now()
	p.health.mu.Lock()
	checks := make([]Check, 0, len(p.health.loops))
	for b, name := range p.health.loops {
		ago := now.Sub(time.Unix(0, b.at.Load()))
		limit := max(p.cfg.StallTimeout, b.floor)
		c := Check{Name: name, OK: ago <= limit, Detail: fmt.Sprintf("last sign of life %s ago", ago.Round(time.Millisecond))}
		if !c.OK {
			c.Detail = fmt.Sprintf("wedged: no sign of life for %s (stall timeout %s)", ago.Round(time.Second), limit)
		}
		checks = append(checks, c)
	}
	p.health.mu.Unlock()
	checks = append(checks, p.stallCheck())
	sort.Slice(checks, func(i, j int) bool { return checks[i].Name < checks[j].Name })
	return healthOf(checks)
}

// Readiness reports whether the instance does its work: the topic exists,
// the instance is in a consumer group generation, PostgreSQL answered in
// the last few seconds, and (with ReadyMaxLag) the lag is small enough.
func (p *Projector) Readiness() Health {
	h := &p.health
	checks := p.src.Checks()
	db := Check{Name: "database"}
	if at := h.dbAt.Load(); at == 0 {
		db.Detail = "PostgreSQL has not answered yet"
	} else {
		ago := time.Since(time.Unix(0, at))
		db.OK = ago <= databaseFresh
		db.Detail = fmt.Sprintf("PostgreSQL answered %s ago", ago.Round(time.Millisecond))
		if !db.OK {
			db.Detail = fmt.Sprintf("PostgreSQL has not answered for %s", ago.Round(time.Second))
		}
	}
	if e := h.dbErr.Load(); e != nil && !db.OK {
		db.Detail += ": " + *e
	}
	checks = append(checks, db)
	if p.cfg.ReadyMaxLag > 0 {
		lag := p.book.totalLag()
		c := Check{Name: "lag", OK: lag <= p.cfg.ReadyMaxLag,
			Detail: fmt.Sprintf("total lag %d records (ready at %d or less)", lag, p.cfg.ReadyMaxLag)}
		if p.book.lagUnknown() {
			// The queue's counts cannot be read: not a reason to stop
			// routing to an instance that receives.
			c.Detail = fmt.Sprintf("lag unknown: the queue's counts cannot be read (ready at %d or less when known)", p.cfg.ReadyMaxLag)
		}
		checks = append(checks, c)
	}
	return healthOf(checks)
}

// Ready reports whether [Projector.Readiness] is all OK.
func (p *Projector) Ready() bool { return p.Readiness().OK }

// watchDatabase pings PostgreSQL in the background, so readiness follows
// the database even when no batch is committed.
func (p *Projector) watchDatabase(ctx context.Context) {
	// A turn: a ping bounded by databasePingTimeout, then the next tick.
	b, done := p.health.loop("database monitor", 2*(databasePingEvery+databasePingTimeout))
	defer done()
	t := time.NewTicker(databasePingEvery)
	defer t.Stop()
	for {
		b.now()
		pctx, cancel := context.WithTimeout(ctx, databasePingTimeout)
		err := p.cfg.Store.Ping(pctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			p.databaseFailed(err, databasePingEvery)
		default:
			p.databaseAnswered()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *Projector) databaseAnswered() {
	p.health.databaseAnswered()
	p.dbOutage.OK()
}

func (p *Projector) databaseFailed(err error, next time.Duration) {
	p.counters.dbErrors.Add(1)
	p.health.databaseFailed(err)
	p.dbOutage.Failed(err, next)
}

// logProgress logs catch-up progress while the lag is large, and the
// count of quarantine lines held back, whichever the source.
func (p *Projector) logProgress(ctx context.Context) {
	t := time.NewTicker(progressCheckEvery)
	defer t.Stop()
	progress := progressLog{at: time.Now(), consumed: p.counters.consumed.Load()}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Within half a turn of the interval: ticks drift by a few
		// milliseconds, and a strict test would log every 15 s instead.
		if now := time.Now(); now.Sub(progress.at) >= progressEvery-progressCheckEvery/2 {
			progress.log(p, now)
			if n := p.quarantineLog.Flush(now); n > 0 {
				p.cfg.Logger.Warn("quarantined records not logged (rate limit); projector status lists them", "not_shown", n)
			}
		}
	}
}

// progressLog logs the catch-up rate, lag and ETA while the lag is large,
// and once when it is caught up.
type progressLog struct {
	at         time.Time
	consumed   int64
	catchingUp bool
}

func (l *progressLog) log(p *Projector, now time.Time) {
	consumed := p.counters.consumed.Load()
	rate := float64(consumed-l.consumed) / now.Sub(l.at).Seconds()
	l.at, l.consumed = now, consumed
	lag := p.book.totalLag()
	if lag < progressMinLag {
		if l.catchingUp {
			p.cfg.Logger.Info("caught up", "lag", lag)
		}
		l.catchingUp = false
		return
	}
	l.catchingUp = true
	args := []any{"lag", lag, "rate_per_second", int64(rate)}
	if rate > 0 {
		args = append(args, "eta", time.Duration(float64(lag)/rate*float64(time.Second)).Round(time.Second))
	} else {
		args = append(args, "eta", "unknown (no progress)")
	}
	p.cfg.Logger.Info("catching up", args...)
}

// retryDatabase runs op until it succeeds or ctx ends, beating and
// reporting each failure to the database outage log; a retry waiting out
// its backoff goes at once when PostgreSQL answers again.
func (w *worker) retryDatabase(ctx context.Context, op func() error) error {
	bo := retryPolicy()
	for {
		w.beat.now()
		err := op()
		if err == nil {
			w.databaseAnswered()
			return nil
		}
		var perm *backoff.PermanentError
		if errors.As(err, &perm) {
			return perm.Err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d := bo.NextBackOff()
		w.databaseFailed(fmt.Errorf("%s/%d: %w", w.topic, w.partition, err), d)
		w.dbOutage.Wait(ctx, d)
	}
}

// logQuarantined logs a quarantined record, at most 10 per 10 s per
// instance; the count of those not shown goes with the next line shown, or
// into a line of its own.
func (w *worker) logQuarantined(partition int, offset int64, reason string) {
	ok, notShown := w.quarantineLog.Allow(time.Now())
	if !ok {
		return
	}
	args := []any{"topic", w.topic, "partition", partition, "offset", offset, "reason", reason}
	if notShown > 0 {
		args = append(args, "not_shown_before", notShown)
	}
	w.instanceLog.Warn("record quarantined", args...)
}

// idleWake is the longest a worker waits for a record before it goes
// round its loop (and beats) again.
const idleWake = time.Second

package projection

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/projector/projector/observe"
)

// Health timings. With a ping every databasePingEvery bounded by
// databasePingTimeout, and readiness wanting an answer within
// [observe.DatabaseFresh], a cut-off database turns /readyz non-200 within
// about 7 s.
const (
	databasePingEvery   = time.Second
	databasePingTimeout = 2 * time.Second
	// progressEvery is how often catch-up progress is logged while the
	// lag is at least progressMinLag, and progressCheckEvery how often
	// that is looked at.
	progressCheckEvery = 5 * time.Second
	progressEvery      = 10 * time.Second
	progressMinLag     = 1000
)

// health is what /healthz and /readyz answer from: the loops that beat,
// and when PostgreSQL last answered.
type health struct {
	observe.Loops
	db observe.Database
}

// Check is one condition of readiness or liveness ([source.Check]).
type Check = observe.Check

// Health is what /healthz and /readyz serve: OK and, check by check, why.
type Health = observe.Health

// Liveness reports whether every loop of the instance still beats: a
// partition worker, or a health monitor, silent for longer than
// StallTimeout is wedged.
func (p *Projector) Liveness() Health {
	checks := p.health.Checks(time.Now(), p.cfg.StallTimeout)
	return observe.Liveness(append(checks, p.watchdog.Check())...)
}

// Readiness reports whether the instance does its work: the topic exists,
// the instance is in a consumer group generation, PostgreSQL answered in
// the last few seconds, and (with ReadyMaxLag) the lag is small enough.
func (p *Projector) Readiness() Health {
	checks := append(p.src.Checks(), p.health.db.Check())
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
	return observe.HealthOf(checks)
}

// Ready reports whether [Projector.Readiness] is all OK.
func (p *Projector) Ready() bool { return p.Readiness().OK }

// watchDatabase pings PostgreSQL in the background, so readiness follows
// the database even when no batch is committed.
func (p *Projector) watchDatabase(ctx context.Context) {
	// A turn: a ping bounded by databasePingTimeout, then the next tick.
	b, done := p.health.Loop("database monitor", 2*(databasePingEvery+databasePingTimeout))
	defer done()
	t := time.NewTicker(databasePingEvery)
	defer t.Stop()
	for {
		b.Now()
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
	p.health.db.Answered()
	p.dbOutage.OK()
}

func (p *Projector) databaseFailed(err error, next time.Duration) {
	p.counters.dbErrors.Add(1)
	p.health.db.Failed(err)
	p.dbOutage.Failed(err, next)
}

// logProgress logs catch-up progress while the lag is large, the count of
// quarantine lines held back, whichever the source, and a live heap near
// the memory limit.
func (p *Projector) logProgress(ctx context.Context) {
	t := time.NewTicker(progressCheckEvery)
	defer t.Stop()
	progress := progressLog{at: time.Now(), consumed: p.counters.consumed.Load()}
	memory := newMemoryWatch()
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
			memory.check(p.cfg.Logger, now)
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
		w.beat.Now()
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

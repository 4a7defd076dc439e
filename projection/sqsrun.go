package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/aws/smithy-go"

	sqssrc "github.com/projector/projector/source/sqs"
	"github.com/projector/projector/store"
)

// sqsState is an SQS-fed engine's queue side: its client, its reader, the
// queue's last counts, and when the queue last answered. The receiver's
// failures are the instance's source outage ([Projector] sourceOutage),
// which only a receive that answers ends: the counts are read on another
// path, whose failures say nothing about receiving (a role without
// sqs:GetQueueAttributes receives fine; a queue whose KMS key refuses the
// role still answers its counts).
type sqsState struct {
	client *sqssrc.Client
	reader *sqssrc.Reader
	// counts are the queue's approximate counts as last read, nil while
	// unknown (not read yet, or the last read failed: countsErr says why).
	counts    atomic.Pointer[SQSCounts]
	countsErr atomic.Pointer[string]
	// answeredAt is when SQS last answered this instance (unix
	// nanoseconds): a receive, or a read of the counts, even one SQS
	// refused. It tells a queue that is silent (a connection that hangs)
	// from one that answers; whether receiving works is the outage's say.
	answeredAt atomic.Int64
	// noKeep, set by a test before Run, turns the visibility keeper off, so
	// messages come back to other consumers while their batch is in flight.
	noKeep bool
	// adoptEvery is how often the worker adopts other instances' held
	// deltas: heldAdoptEvery, shorter in tests.
	adoptEvery time.Duration
}

// queuePollEvery is how often the queue's counts are read, for the lag.
const queuePollEvery = 5 * time.Second

// queueFresh is how recently the queue must have answered for /readyz,
// and queueFailingFor how long the receives may fail before /readyz
// fails: a failed receive has already been retried by the SDK, and the
// receiver retries it within a second or so, so a passing error does not
// reach readiness; PostgreSQL is given as long (databaseFresh).
const (
	queueFresh      = 30 * time.Second
	queueFailingFor = 5 * time.Second
)

// runSQS runs one engine on an SQS queue until ctx ends. There are no
// partitions and no owners: any number of engines may receive from the
// queue at once, and a message may reach two of them (a visibility
// timeout ran out, a delete failed). Every batch is committed unfenced;
// the conditional writes alone decide what applies, so a message applied
// twice is dropped as a duplicate or stale the second time.
func (p *Projector) runSQS(ctx context.Context) error {
	cfg := p.cfg
	q := p.sqs
	q.reader.Failed = p.sourceOutage.failed
	q.reader.OK = func() {
		q.answeredAt.Store(time.Now().UnixNano())
		p.sourceOutage.ok()
	}
	if q.noKeep {
		q.reader.Keep = 0
	}
	b, alive := p.health.loop("queue worker", 0)
	defer alive()
	w := &worker{
		workerDeps: p.workerDeps(), beat: b, topic: cfg.Topic, partition: 0, position: -1, stored: -1,
		log:        cfg.Logger.With("queue", cfg.SQS.QueueURL),
		cache:      newJobCache(p.budget),
		committed:  func(int, int64) {},
		lane:       sqssrc.NewLane(cfg.Topic, q.reader, cfg.BatchSize, cfg.BatchLinger),
		adoptEvery: q.adoptEvery,
	}
	p.book.setQueue(0)
	defer p.book.drop(0, w)
	p.health.inGroup.Store(true)
	defer p.health.inGroup.Store(false)
	w.log.Info("receiving from the queue", "visibility", cfg.SQS.Visibility.String(), "wait", cfg.SQS.Wait.String(), "max_messages", cfg.SQS.MaxMessages)
	return w.run(ctx)
}

// heldAdoptEvery is how often a queue worker compares the held deltas it
// knows with the queue's: other instances on the queue hold deltas too,
// and release them.
const heldAdoptEvery = 30 * time.Second

// adoptHeld brings the worker's held deltas in line with the queue's
// stored ones. It takes on those it does not hold yet, held by another
// instance (alive or gone), so their gaps run here too; two instances
// resolving one gap is safe, the conditional writes and the release by key
// decide. And it reads again the jobs of held deltas it knows that are
// stored no more: another instance released them (applied or covered),
// and this worker's view of those jobs, their rows and their gaps, is out
// of date.
func (w *worker) adoptHeld(ctx context.Context) error {
	held, err := w.store.LoadHeldIndex(ctx, w.topic, w.partition)
	if err != nil {
		return err
	}
	stored := make(map[store.HeldKey]bool, len(held))
	for _, h := range held {
		stored[store.HeldKey{JobID: h.JobID, Version: h.Version}] = true
	}
	var gone []string
	reread := map[string]bool{}
	for _, g := range w.detector.Gaps() {
		j, ok := w.cache.peek(g.JobID)
		if !ok {
			continue
		}
		for v := range j.Held {
			if !stored[store.HeldKey{JobID: g.JobID, Version: v}] {
				gone = append(gone, g.JobID)
				reread[g.JobID] = true
				break
			}
		}
	}
	var fresh []store.Held
	jobs := map[string]bool{}
	for _, h := range held {
		if reread[h.JobID] {
			continue // read again whole below
		}
		if j, ok := w.cache.peek(h.JobID); ok {
			if _, known := j.Held[h.Version]; known {
				continue
			}
		}
		fresh = append(fresh, h)
		jobs[h.JobID] = true
	}
	if len(gone) > 0 {
		w.log.Info("held deltas this instance knew were released by another instance; reading their jobs again", "jobs", len(gone), "first", gone[0])
		if _, err := w.resync(ctx, gone); err != nil {
			return err
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	w.log.Info("adopting held deltas of the queue that other instances held", "deltas", len(fresh), "jobs", len(jobs))
	// A job cached without held deltas may be cached at an older row:
	// its row is read with the held deltas instead.
	for id := range jobs {
		w.cache.forget(id)
	}
	// fresh is ordered by job, as restoreChunk wants it.
	return w.restoreChunk(ctx, fresh)
}

// watchQueue reads the queue's approximate counts every queuePollEvery:
// visible and in-flight messages are the lag. A read that fails leaves the
// lag unknown and is warned of ([countsFailures]); it is no outage, and
// readiness does not follow it: receiving is what the instance does.
func (p *Projector) watchQueue(ctx context.Context) {
	b, done := p.health.loop("queue monitor", 2*(queuePollEvery+queuePollEvery))
	defer done()
	t := time.NewTicker(queuePollEvery)
	defer t.Stop()
	progress := progressLog{at: time.Now(), consumed: p.counters.consumed.Load()}
	var failures countsFailures
	for {
		b.now()
		qctx, cancel := context.WithTimeout(ctx, queuePollEvery)
		n, err := p.sqs.client.Counts(qctx)
		cancel()
		now := time.Now()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			var api smithy.APIError
			if errors.As(err, &api) {
				p.sqs.answeredAt.Store(now.UnixNano())
			}
			msg := err.Error()
			p.sqs.counts.Store(nil)
			p.sqs.countsErr.Store(&msg)
			p.book.setQueueLagUnknown(0)
			failures.failed(p.cfg.Logger, err, now)
		default:
			p.sqs.answeredAt.Store(now.UnixNano())
			p.sqs.counts.Store(&n)
			p.sqs.countsErr.Store(nil)
			p.book.setQueueLag(0, n.Visible+n.InFlight)
			failures.ok(p.cfg.Logger, now)
			if p.sourceOutage.failing() {
				p.sqs.reader.Nudge()
			}
		}
		if now.Sub(progress.at) >= progressEvery-queuePollEvery/2 {
			progress.log(p, now)
			p.quarantineLog.flush(now)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// countsFailures turns the failed reads of the queue's counts into few
// warnings: one when they start failing, at most one per outageLogEvery
// while they go on, and one line when a read answers again. One goroutine
// uses it (watchQueue).
type countsFailures struct {
	since, logged time.Time // zero since: the last read answered
	n             int
}

func (f *countsFailures) failed(log *slog.Logger, err error, now time.Time) {
	f.n++
	switch {
	case f.since.IsZero():
		f.since, f.logged = now, now
	case now.Sub(f.logged) >= outageLogEvery:
		f.logged = now
	default:
		return
	}
	msg := "cannot read the queue's counts; its lag is unknown until they are read again (receiving goes on)"
	if sqssrc.AsAuthError(err) != nil {
		msg = "cannot read the queue's counts: SQS refused them (grant sqs:GetQueueAttributes on the queue); its lag is unknown (receiving goes on)"
	}
	log.Warn(msg, "err", err, "failed_reads", f.n, "failing_for", now.Sub(f.since).Round(time.Millisecond))
}

func (f *countsFailures) ok(log *slog.Logger, now time.Time) {
	if f.since.IsZero() {
		return
	}
	log.Info("the queue's counts are read again", "failed_for", now.Sub(f.since).Round(time.Millisecond), "failed_reads", f.n)
	f.since, f.logged, f.n = time.Time{}, time.Time{}, 0
}

// queueCheck is the readiness of the queue: its receives have not been
// failing for queueFailingFor, and it answered within queueFresh. The
// counts do not count here beyond that answer: a read of them that fails
// leaves the lag unknown, not the instance unready.
func (p *Projector) queueCheck() Check {
	url := p.cfg.SQS.QueueURL
	now := time.Now()
	if d, why := p.sourceOutage.failingFor(now); d >= queueFailingFor {
		return Check{Name: "queue", Detail: fmt.Sprintf("receives from queue %s have been failing for %s: %s", url, d.Round(time.Second), why)}
	}
	at := p.sqs.answeredAt.Load()
	if at == 0 {
		return Check{Name: "queue", Detail: fmt.Sprintf("queue %s has not answered yet", url)}
	}
	ago := now.Sub(time.Unix(0, at))
	c := Check{Name: "queue", OK: ago <= queueFresh, Detail: fmt.Sprintf("queue %s answered %s ago", url, ago.Round(time.Millisecond))}
	if !c.OK {
		c.Detail = fmt.Sprintf("queue %s has not answered for %s", url, ago.Round(time.Second))
	}
	return c
}

// SQSStatus is an SQS-fed engine's view of its queue, in /status.
type SQSStatus struct {
	QueueURL string `json:"queue_url"`
	// Counts are the queue's approximate counts as last read (every 5 s);
	// nil while unknown: before the first read, or since a read failed,
	// with CountsError saying why.
	Counts      *SQSCounts  `json:"counts"`
	CountsError string      `json:"counts_error,omitempty"`
	Counters    SQSCounters `json:"counters"`
}

func (p *Projector) sqsStatus() *SQSStatus {
	if p.sqs == nil {
		return nil
	}
	s := &SQSStatus{QueueURL: p.cfg.SQS.QueueURL, Counts: p.sqs.counts.Load()}
	if e := p.sqs.countsErr.Load(); e != nil {
		s.CountsError = *e
	}
	if r := p.sqs.reader; r != nil {
		s.Counters = r.Counters()
	}
	return s
}

// sqsCoordinate is the SQS message c names, for a held or quarantine row; zero for
// a Kafka record.
func sqsCoordinate(c Coord) store.Coordinate {
	return store.Coordinate{MessageID: c.MessageID, SequenceNumber: c.Sequence}
}

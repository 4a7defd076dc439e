package sqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/aws/smithy-go"

	"github.com/projector/projector/source"
	"github.com/projector/projector/source/sqs/sqscfg"
)

// QueueConfig is an SQS FIFO queue read as one lane.
type QueueConfig struct {
	Config
	// Scope names the lane's rows in the store (the queue's name).
	Scope string
	// Owner names this instance in logs.
	Owner string
	// BatchSize and Linger bound one batch.
	BatchSize int
	Linger    time.Duration
}

// Queue is an SQS queue as a [source.Source]: one shared lane for as long
// as the instance runs. There are no partitions and no owners: any number
// of instances may receive from the queue at once, and a message may reach
// two of them (a visibility timeout ran out, a delete failed); the engine
// commits every batch unfenced and the conditional writes decide.
//
// The receiver's failures reach the engine through the lane's Fetch; its
// successes end the source's outage (Host.Answered). The queue's counts
// are read on another path, whose failures say nothing about receiving (a
// role without sqs:GetQueueAttributes receives fine; a queue whose KMS key
// refuses the role still answers its counts): they leave the lag unknown
// and are warned of, and are no outage.
type Queue struct {
	c      QueueConfig
	client *Client
	reader *Reader
	log    *slog.Logger

	// counts are the queue's approximate counts as last read, nil while
	// unknown (not read yet, or the last read failed: countsErr says why).
	counts    atomic.Pointer[Counts]
	countsErr atomic.Pointer[string]
	// answeredAt is when SQS last answered this instance (unix
	// nanoseconds): a receive, or a read of the counts, even one SQS
	// refused. It tells a queue that is silent (a connection that hangs)
	// from one that answers.
	answeredAt atomic.Int64
	// failing is the source's outage as the engine keeps it (set by Run,
	// read by Checks from any goroutine).
	failing atomic.Pointer[func(now time.Time) (time.Duration, string)]
	// receiving says the lane is being served.
	receiving atomic.Bool
}

var _ source.Source = (*Queue)(nil)

// Timings of the queue's background work and readiness.
const (
	// countsEvery is how often the queue's counts are read, for the lag.
	countsEvery = 5 * time.Second
	// queueFresh is how recently the queue must have answered for
	// readiness, and failingFor how long the receives may fail before
	// readiness fails: a failed receive has already been retried by the
	// SDK, and the receiver retries it within a second or so, so a
	// passing error does not reach readiness.
	queueFresh = 30 * time.Second
	failingFor = 5 * time.Second
	// countsLogEvery is the most often failing reads of the counts are
	// warned of.
	countsLogEvery = 30 * time.Second
	// ownerSettle is how long an instance that tagged the queue as its
	// projection's waits before it reads the tag again: two projections
	// that start at once both tag it, and the one whose tag did not last
	// is refused.
	ownerSettle = 2 * time.Second
)

// NewQueue builds the queue's client (its region and credential chain)
// and receiver; the queue is first asked at [Queue.Run].
func NewQueue(ctx context.Context, c QueueConfig, log *slog.Logger) (*Queue, error) {
	if log == nil {
		log = slog.Default()
	}
	client, err := Connect(ctx, c.Config)
	if err != nil {
		return nil, err
	}
	return &Queue{c: c, client: client, reader: NewReader(client, log, c.BatchSize), log: log}, nil
}

// Client is the queue's client.
func (q *Queue) Client() *Client { return q.client }

// Reader is the queue's receiver: its Keep may be changed before Run.
func (q *Queue) Reader() *Reader { return q.reader }

// Run records the queue as the projection's, checks that no other
// projection reads it, and serves its lane until ctx ends. See
// [source.Source].
func (q *Queue) Run(ctx context.Context, host source.Host) error {
	defer q.client.Close()
	url := q.c.QueueURL
	// The counts first: the lag (which the stall watchdog reads) is known
	// by the time the lane is served.
	mctx, stop := context.WithCancel(ctx)
	var monitor sync.WaitGroup
	monitor.Go(func() { q.watchCounts(mctx, host) })
	defer monitor.Wait()
	defer stop()
	rec, err := host.Record(ctx, source.Consumer{Kind: source.ConsumerQueue, Explicit: url})
	var ce *source.ConflictError
	if errors.As(err, &ce) {
		ce.Tag = OwnerTag
	}
	if err != nil {
		return err
	}
	if rec.Previous != "" {
		q.log.Warn("the projection reads another queue than the one it recorded", "queue", rec.Name, "recorded_queue", rec.Previous)
	}
	if err := q.claim(ctx, rec); err != nil {
		return err
	}
	q.log.Info("projector started", "source", "sqs", "queue", url, "owner", q.c.Owner, "projection", rec.Projection)

	// The receiver reports its failures as they happen (a hung receive is
	// cut and reported at once; the lane's Fetch returns the error only
	// once nothing is left to take), and a receive that answers ends the
	// outage. Readiness reads the outage back from the engine.
	failing := host.Failing
	q.failing.Store(&failing)
	q.reader.Failed = host.Failed
	q.reader.OK = func() {
		q.answeredAt.Store(time.Now().UnixNano())
		host.Answered()
	}
	q.receiving.Store(true)
	defer q.receiving.Store(false)
	q.log.Info("receiving from the queue", "queue", url, "visibility", q.c.Visibility.String(), "wait", q.c.Wait.String(), "max_messages", q.c.MaxMessages)
	return host.Serve(ctx, NewLane(q.c.Scope, q.reader, q.c.BatchSize, q.c.Linger))
}

// failingFor is how long the receives have been failing at now, and
// why: the engine's outage of this source.
func (q *Queue) failingFor(now time.Time) (time.Duration, string) {
	f := q.failing.Load()
	if f == nil {
		return 0, ""
	}
	return (*f)(now)
}

// Status is a queue's report in /status ([sqscfg.Status]).
type Status = sqscfg.Status

// Rereader is nil: a queue cannot be read again. See [source.Source].
func (q *Queue) Rereader() source.Rereader { return nil }

// Status is the queue's counts and the receiver's counters. See
// [source.Source].
func (q *Queue) Status() source.Status {
	s := &Status{QueueURL: q.c.QueueURL, Counts: q.counts.Load(), Counters: q.reader.Counters()}
	if e := q.countsErr.Load(); e != nil {
		s.CountsError = *e
	}
	return source.Status{Queue: s}
}

// Checks are the queue's readiness: its receives have not been failing
// for failingFor, it answered within queueFresh, and the lane is served.
// The counts do not count here beyond that answer: a read of them that
// fails leaves the lag unknown, not the instance unready. See
// [source.Source].
func (q *Queue) Checks() []source.Check {
	checks := []source.Check{q.queueCheck()}
	if !q.receiving.Load() {
		checks = append(checks, source.Check{Name: "worker", Detail: "not receiving from the queue"})
	}
	return checks
}

func (q *Queue) queueCheck() source.Check {
	url := q.c.QueueURL
	now := time.Now()
	if d, why := q.failingFor(now); d >= failingFor {
		return source.Check{Name: "queue", Detail: fmt.Sprintf("receives from queue %s have been failing for %s: %s", url, d.Round(time.Second), why)}
	}
	at := q.answeredAt.Load()
	if at == 0 {
		return source.Check{Name: "queue", Detail: fmt.Sprintf("queue %s has not answered yet", url)}
	}
	ago := now.Sub(time.Unix(0, at))
	c := source.Check{Name: "queue", OK: ago <= queueFresh, Detail: fmt.Sprintf("queue %s answered %s ago", url, ago.Round(time.Millisecond))}
	if !c.OK {
		c.Detail = fmt.Sprintf("queue %s has not answered for %s", url, ago.Round(time.Second))
	}
	return c
}

// watchCounts reads the queue's approximate counts every countsEvery:
// visible and in-flight messages are the lag. A read that fails leaves the
// lag unknown and is warned of ([countsFailures]); it is no outage, and
// readiness does not follow it: receiving is what the instance does.
func (q *Queue) watchCounts(ctx context.Context, host source.Host) {
	beat, done := host.Alive("queue monitor", 2*(countsEvery+countsEvery))
	defer done()
	t := time.NewTicker(countsEvery)
	defer t.Stop()
	var failures countsFailures
	for {
		beat()
		qctx, cancel := context.WithTimeout(ctx, countsEvery)
		n, err := q.client.Counts(qctx)
		cancel()
		now := time.Now()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			var api smithy.APIError
			if errors.As(err, &api) {
				q.answeredAt.Store(now.UnixNano())
			}
			msg := err.Error()
			q.counts.Store(nil)
			q.countsErr.Store(&msg)
			host.QueueLag(0, false)
			failures.failed(q.log, err, now)
		default:
			q.answeredAt.Store(now.UnixNano())
			q.counts.Store(&n)
			q.countsErr.Store(nil)
			host.QueueLag(n.Visible+n.InFlight, true)
			failures.ok(q.log, now)
			if d, _ := q.failingFor(now); d > 0 {
				q.reader.Nudge()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// countsFailures turns the failed reads of the queue's counts into few
// warnings: one when they start failing, at most one per countsLogEvery
// while they go on, and one line when a read answers again. One goroutine
// uses it (watchCounts).
type countsFailures struct {
	since, logged time.Time // zero since: the last read answered
	n             int
}

func (f *countsFailures) failed(log *slog.Logger, err error, now time.Time) {
	f.n++
	switch {
	case f.since.IsZero():
		f.since, f.logged = now, now
	case now.Sub(f.logged) >= countsLogEvery:
		f.logged = now
	default:
		return
	}
	msg := "cannot read the queue's counts; its lag is unknown until they are read again (receiving goes on)"
	if AsAuthError(err) != nil {
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

// claim makes sure no other projection reads the queue: the queue carries
// the projection that reads it in its OwnerTag tag. A queue tagged for
// another projection refuses this instance (*source.ConflictError); an
// untagged one is tagged. A queue whose tags cannot be read or written (no
// permission, or SQS not answering at start) is not checked, with a
// warning that says which permissions check it.
func (q *Queue) claim(ctx context.Context, rec source.Recorded) error {
	ours := ownerTag(rec.ID, rec.Projection)
	tagged := false
	for {
		owner, err := q.client.Owner(ctx)
		if err != nil {
			return q.ownerUnchecked(err)
		}
		switch {
		case owner != "" && owner != ours:
			return &source.ConflictError{Group: q.c.QueueURL, Queue: true, Tag: OwnerTag, Ours: rec.Projection, Theirs: ownerName(owner)}
		case owner == ours && tagged:
			q.log.Info("the queue is tagged as this projection's", "tag", OwnerTag, "projection", rec.Projection)
			return nil
		case owner == ours:
			return nil
		}
		if err := q.client.SetOwner(ctx, ours); err != nil {
			return q.ownerUnchecked(err)
		}
		tagged = true
		t := time.NewTimer(ownerSettle)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// ownerUnchecked warns that the queue's tag could not be used, and goes
// on: an SQS that does not answer is waited out and reported by the
// receiver.
func (q *Queue) ownerUnchecked(err error) error {
	q.log.Warn("cannot check that no other projection reads this queue: its tags cannot be read or written (grant sqs:ListQueueTags and sqs:TagQueue on the queue to have it checked)",
		"queue", q.c.QueueURL, "err", err)
	return nil
}

// maxTagValue is the longest tag value SQS takes: 256 characters. A value
// of at most 256 bytes is within it however SQS counts.
const maxTagValue = 256

// ownerTag is the value of OwnerTag for a projection: its ID, then its
// name, cut to maxTagValue bytes on a character boundary (SQS refuses a
// value that is not UTF-8, and a refused tag turns the check off).
func ownerTag(id, name string) string {
	v := id + " " + name
	if len(v) <= maxTagValue {
		return v
	}
	n := maxTagValue
	for n > 0 && !utf8.RuneStart(v[n]) {
		n--
	}
	return v[:n]
}

// ownerName is the projection an OwnerTag value names.
func ownerName(tag string) string {
	id, name, ok := strings.Cut(tag, " ")
	if !ok || name == "" {
		return id
	}
	return name + " (" + id + ")"
}

// Ends and Starts: a queue is not a log ([source.ErrNoLog]).
func (q *Queue) Ends(context.Context) (map[int]source.LogEnd, error) { return nil, source.ErrNoLog }

func (q *Queue) Starts(context.Context, []int) (map[int]int64, error) { return nil, source.ErrNoLog }

func init() {
	source.Register("sqs", func(s source.Settings) (source.Source, error) {
		// Builds the client only (the region and credential chain): the
		// queue is first asked at Run.
		return NewQueue(context.Background(), QueueConfig{Config: s.SQS, Scope: s.Topic, Owner: s.Owner,
			BatchSize: s.BatchSize, Linger: s.Linger}, s.Logger)
	})
}

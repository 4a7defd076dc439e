package sqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/projector/projector/event"
	"github.com/projector/projector/source"
	"github.com/projector/projector/source/sqs/sqscfg"
)

// Reader receives from one queue for one engine. A receiver goroutine
// long-polls and queues what it receives, at most about a batch ahead; the
// engine takes batches from the queue ([Reader.take]) and, once the
// batch's transaction committed, deletes its messages
// ([Reader.ack]). From receipt until deletion a message is in flight:
// a keeper goroutine extends the visibility of every message in flight
// before it runs out, so no other consumer receives it while its batch is
// planned and written. A message whose extension or deletion fails is
// delivered again, to this engine or another: that is safe, since every
// write is conditional on the job's version.
type Reader struct {
	c   *Client
	log *slog.Logger
	// ahead bounds the messages received and not yet taken.
	queue chan Message
	// failed reports receive failures (an SQS outage), and ok a receive
	// that answered: only that ends the outage.
	Failed func(err error, next time.Duration)
	OK     func()
	// failing is the last receive's error while the receives fail (an
	// outage), nil once one answers: [Source.Fetch] reports it.
	failing atomic.Pointer[error]
	// retry cuts the receiver's backoff short ([Reader.nudge]).
	retry chan struct{}
	// refused is closed, and refusal set, when SQS refused the
	// credentials: the receiver stopped for good.
	refused chan struct{}
	refusal *AuthError

	mu sync.Mutex
	// inFlight are the messages received and not yet deleted, by message
	// id, with the latest receipt handle (a message received again while
	// in flight has a new one; only the latest deletes it).
	inFlight map[string]Message

	// keep is how often the visibility of the messages in flight is
	// extended: a third of the visibility timeout. 0 turns the keeper off
	// (tests that let messages come back while their batch runs).
	Keep time.Duration

	stats stats
}

// sqsStats count what the SQS source saw, for the status and metrics.
type stats struct {
	received      atomic.Int64
	redelivered   atomic.Int64 // received more than once
	groupMismatch atomic.Int64 // MessageGroupId is not the job id
	deleted       atomic.Int64
	deleteFailed  atomic.Int64
	extendFailed  atomic.Int64
}

// Counters are the receiver's counters ([sqscfg.Counters]).
type Counters = sqscfg.Counters

func (s *stats) snapshot() Counters {
	return Counters{
		Received: s.received.Load(), Redelivered: s.redelivered.Load(), GroupNotJobID: s.groupMismatch.Load(),
		Deleted: s.deleted.Load(), DeleteFailed: s.deleteFailed.Load(), VisibilityFailures: s.extendFailed.Load(),
	}
}

func NewReader(c *Client, log *slog.Logger, ahead int) *Reader {
	return &Reader{
		c: c, log: log, queue: make(chan Message, max(ahead, c.cfg.MaxMessages)),
		inFlight: map[string]Message{}, Keep: c.cfg.Visibility / 3,
		Failed: func(error, time.Duration) {}, OK: func() {}, retry: make(chan struct{}, 1), refused: make(chan struct{}),
	}
}

// run receives and keeps messages invisible until ctx ends.
func (r *Reader) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	kept := make(chan struct{})
	if r.Keep > 0 {
		wg.Go(func() {
			defer close(kept)
			r.keepInvisible(ctx)
		})
	} else {
		close(kept)
	}
	bo := source.Backoff(10 * time.Second)
	for ctx.Err() == nil {
		msgs, err := r.receive(ctx, kept)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if ae := AsAuthError(err); ae != nil {
				r.refusal = ae
				close(r.refused)
				return
			}
			d := bo.NextBackOff()
			r.failing.Store(&err)
			r.Failed(err, d)
			r.backoff(ctx, d)
			continue
		}
		bo.Reset()
		r.failing.Store(nil)
		r.OK()
		r.mu.Lock()
		for _, m := range msgs {
			r.inFlight[m.ID] = m
		}
		r.mu.Unlock()
		for _, m := range msgs {
			r.received(m)
			select {
			case r.queue <- m:
			case <-ctx.Done():
				return
			}
		}
	}
}

// releaseMargin is how long past the end of its long poll a receive open
// at the stop is waited for once it was handed what the stop released.
const releaseMargin = 2 * time.Second

// receive is one receive that outlives ctx just long enough not to hide
// what the stop releases. A long poll cut short on the client stays open
// on the server, and would take the messages released at the stop and
// hide them for their visibility timeout; so would a cut that lands while
// the server's answer is on its way. So when ctx ends with messages in
// flight, they are released while the receive is still ours and the
// receive is left to finish: the server answers by the end of its long
// poll, with the released messages if it hands them to it, and Run keeps
// what it returns in flight for [Reader.Release] to release again. It is
// cut releaseMargin after its long poll should have ended (a server that
// does not answer), and at once when nothing can have become visible to
// lose (nothing was in flight, or SQS refused every release).
//
// kept closes when the keeper of the messages in flight has stopped: the
// release waits for it, so that an extension sent at the stop cannot land
// after the release and hide the messages again.
func (r *Reader) receive(ctx context.Context, kept <-chan struct{}) ([]Message, error) {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	started := time.Now()
	answered, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-answered:
			return
		case <-ctx.Done():
		}
		<-kept
		if visible, _ := r.releaseInFlight(); visible {
			// Already past (the release itself took that long): the
			// receive is cut at once, as its long poll should be over.
			t := time.NewTimer(time.Until(started.Add(r.c.pollWait() + releaseMargin)))
			defer t.Stop()
			select {
			case <-answered:
			case <-t.C:
			}
		}
		cancel()
	}()
	msgs, err := r.c.receive(rctx)
	close(answered)
	<-watched
	if err != nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return msgs, err
}

// backoff waits d between two failed receives, or less if ctx ends or
// the receiver is nudged.
func (r *Reader) backoff(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-r.retry:
	}
}

// nudge makes a receiver waiting out its backoff try again at once: the
// queue answered another request (its counts), so a receive may work
// again. It ends no outage: only a receive that answers does.
func (r *Reader) Nudge() {
	select {
	case r.retry <- struct{}{}:
	default:
	}
}

// err is why the receiver stopped for good (SQS refused the
// credentials), or nil.
func (r *Reader) Err() error {
	select {
	case <-r.refused:
		return r.refusal
	default:
		return nil
	}
}

// received counts m and says when its group is not its job: order is then
// not guaranteed for that job (the version rules still hold).
func (r *Reader) received(m Message) {
	r.stats.received.Add(1)
	if m.Receives > 1 {
		r.stats.redelivered.Add(1)
	}
	ev, err := event.DecodeValue(m.Body)
	if err != nil || ev.JobID == m.Group {
		return // a bad record is quarantined by the plan
	}
	if n := r.stats.groupMismatch.Add(1); n <= 10 || n%1000 == 0 {
		r.log.Warn("message group is not the job id: SQS does not keep this job's messages in order (the version rules still apply); publish with MessageGroupId = job_id",
			"message_id", m.ID, "group", m.Group, "job_id", ev.JobID, "messages_so_far", n)
	}
}

// take waits up to wait for a first message, then gathers more for up to
// linger or until max are taken: with no linger, those already received.
func (r *Reader) take(ctx context.Context, maxMsgs int, wait, linger time.Duration) []Message {
	t := time.NewTimer(wait)
	defer t.Stop()
	var first Message
	select {
	case first = <-r.queue:
	case <-t.C:
		return nil
	case <-r.refused:
		return nil
	case <-ctx.Done():
		return nil
	}
	msgs := []Message{first}
	l := time.NewTimer(linger)
	defer l.Stop()
	for len(msgs) < maxMsgs {
		// What has arrived is taken first; with no linger, that is all.
		select {
		case m := <-r.queue:
			msgs = append(msgs, m)
			continue
		default:
		}
		if linger <= 0 {
			return msgs
		}
		select {
		case m := <-r.queue:
			msgs = append(msgs, m)
		case <-l.C:
			return msgs
		case <-ctx.Done():
			return msgs
		}
	}
	return msgs
}

// ack deletes the messages ids name, whose batch committed, and stops
// keeping them invisible. A message not deleted comes back later and is
// dropped as a duplicate or stale then.
func (r *Reader) ack(ctx context.Context, ids []string) {
	msgs := r.forget(ids)
	if len(msgs) == 0 {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	failed, err := r.c.deleteMessages(dctx, msgs)
	r.stats.deleted.Add(int64(len(msgs) - len(failed)))
	if len(failed) > 0 {
		r.stats.deleteFailed.Add(int64(len(failed)))
		r.log.Warn("messages of a committed batch could not be deleted: they will be delivered again and dropped as duplicates",
			"failed", len(failed), "of", len(msgs), "err", errString(err), "first", firstFailure(failed))
	}
}

// forget stops keeping the messages ids name invisible and returns them
// (those still in flight).
func (r *Reader) forget(ids []string) []Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Message
	for _, id := range ids {
		if m, ok := r.inFlight[id]; ok {
			out = append(out, m)
			delete(r.inFlight, id)
		}
	}
	return out
}

// Release makes every message still in flight visible again at once, for
// another consumer (or this one, later) to receive: the engine stops. It
// is best effort: a failed release leaves them to come back after their
// visibility timeout. (A long poll open at the stop is kept from taking
// them: see [Reader.receive].)
func (r *Reader) Release() {
	// What was received and not taken yet is released with the rest: a
	// reader opened later must not take it from the queue with a receipt
	// that no longer holds, beside the same message received again.
	for drained := false; !drained; {
		select {
		case <-r.queue:
		default:
			drained = true
		}
	}
	if _, left := r.releaseInFlight(); left > 0 {
		r.log.Warn("messages in flight at the stop could not be made visible again; they come back after their visibility timeout",
			"messages", left, "visibility", r.c.cfg.Visibility)
	}
}

// releaseInFlight makes the messages in flight visible again. visible
// says some may now be: it released some, or a request failed that SQS
// may have applied all the same; false when there were none or SQS
// refused every one. left is how many were not known to be released:
// they stay in flight, for [Reader.Release] to try again; what is not
// released at all comes back after its visibility timeout.
func (r *Reader) releaseInFlight() (visible bool, left int) {
	r.mu.Lock()
	msgs := make([]Message, 0, len(r.inFlight))
	for _, m := range r.inFlight {
		msgs = append(msgs, m)
	}
	clear(r.inFlight)
	r.mu.Unlock()
	if len(msgs) == 0 {
		return false, 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	failed, err := r.c.changeVisibility(ctx, msgs, 0)
	if len(failed) > 0 {
		r.log.Debug("releasing messages in flight failed for some; they are tried again at the close, else come back after their visibility timeout",
			"failed", len(failed), "of", len(msgs), "first", firstFailure(failed), "err", err)
		r.mu.Lock()
		for _, m := range msgs {
			if _, ok := failed[m.ID]; ok {
				r.inFlight[m.ID] = m
			}
		}
		r.mu.Unlock()
	}
	return err != nil || len(failed) < len(msgs), len(failed)
}

// keepInvisible extends, every keep, the visibility of every message in
// flight.
func (r *Reader) keepInvisible(ctx context.Context) {
	t := time.NewTicker(r.Keep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		msgs := make([]Message, 0, len(r.inFlight))
		for _, m := range r.inFlight {
			msgs = append(msgs, m)
		}
		r.mu.Unlock()
		if len(msgs) == 0 {
			continue
		}
		ectx, cancel := context.WithTimeout(ctx, r.Keep)
		failed, err := r.c.changeVisibility(ectx, msgs, r.c.cfg.Visibility)
		cancel()
		if errors.Is(err, context.Canceled) {
			continue // the receiver stops: the release follows
		}
		if err != nil {
			r.log.Warn("extending the visibility of messages in flight failed; they may be delivered again (safe: duplicates are dropped)", "messages", len(failed), "of", len(msgs), "err", err)
			r.stats.extendFailed.Add(int64(len(failed)))
			continue
		}
		if len(failed) > 0 {
			r.stats.extendFailed.Add(int64(len(failed)))
			r.log.Warn("the visibility of some messages in flight could not be extended; they may be delivered again (safe: duplicates are dropped)",
				"failed", len(failed), "of", len(msgs), "first", firstFailure(failed))
		}
	}
}

// Source is an SQS queue as the engine reads it: unordered, acknowledged by
// deleting the messages.
type Source struct {
	r         *Reader
	batchSize int
	linger    time.Duration
}

// Fetch takes up to a batch of received messages as records: the body is
// the value, with no key (the job id is in the body), and the coordinate
// names the message. With nothing to take while the receives fail, it
// returns the last receive's error: the queue is unreachable, as a
// Kafka partition's Fetch says when its brokers are.
func (s *Source) Fetch(ctx context.Context, wait time.Duration) ([]source.Record, error) {
	msgs := s.r.take(ctx, s.batchSize, wait, s.linger)
	if len(msgs) == 0 {
		if err := s.r.failing.Load(); err != nil && ctx.Err() == nil {
			return nil, *err
		}
		return nil, nil
	}
	recs := make([]source.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = source.Record{Value: m.Body, Time: m.Sent,
			Coord: source.Coord{Partition: -1, Offset: m.Offset(), MessageID: m.ID, Sequence: m.Sequence, Group: m.Group}}
	}
	return recs, nil
}

// Ack deletes the messages of a committed batch.
func (s *Source) Ack(ctx context.Context, recs []source.Record) error {
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.Coord.MessageID
	}
	s.r.ack(ctx, ids)
	return nil
}

// Ordered is false: no positions, no owners; the store alone arbitrates.
func (s *Source) Ordered() bool { return false }

// Lag is the queue's approximate visible and in-flight messages.
func (s *Source) Lag(ctx context.Context) (int64, error) {
	n, err := s.r.c.Counts(ctx)
	return n.Visible + n.InFlight, err
}

// Ends are -1: a queue is no log.
func (s *Source) Ends() (hwm, stable int64) { return -1, -1 }

// Err is the receiver's refusal of the credentials, which ends the queue
// for this instance; nil while it receives.
func (s *Source) Err() error { return s.r.Err() }

// Close makes what is still in flight visible again.
func (s *Source) Close() error {
	s.r.Release()
	return nil
}

func firstFailure(f batchFailure) string {
	for id, why := range f {
		return id + ": " + why
	}
	return ""
}

// OwnerTag is the queue tag that names the projection whose queue it is
// ([sqscfg.OwnerTag]).
const OwnerTag = sqscfg.OwnerTag

// Owner is the queue's OwnerTag value, empty when untagged.
func (c *Client) Owner(ctx context.Context) (string, error) {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := c.client.ListQueueTags(qctx, &awssqs.ListQueueTagsInput{QueueUrl: aws.String(c.cfg.QueueURL)})
	if err != nil {
		return "", fmt.Errorf("tags of %s: %w", c.cfg.QueueURL, err)
	}
	return out.Tags[OwnerTag], nil
}

// SetOwner tags the queue with v as its OwnerTag value.
func (c *Client) SetOwner(ctx context.Context, v string) error {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := c.client.TagQueue(qctx, &awssqs.TagQueueInput{QueueUrl: aws.String(c.cfg.QueueURL), Tags: map[string]string{OwnerTag: v}})
	if err != nil {
		return fmt.Errorf("tag %s: %w", c.cfg.QueueURL, err)
	}
	return nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Counters are what the reader saw so far.
func (r *Reader) Counters() Counters { return r.stats.snapshot() }

// NewSource is r as a source of records: batches of up to batchSize
// messages, gathered for up to linger after the first.
func NewSource(r *Reader, batchSize int, linger time.Duration) *Source {
	return &Source{r: r, batchSize: batchSize, linger: linger}
}

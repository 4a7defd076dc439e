package projection

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/projector/projector/event"
	"github.com/projector/projector/store"
)

// sqsReader receives from one queue for one engine. A receiver goroutine
// long-polls and queues what it receives, at most about a batch ahead; the
// engine takes batches from the queue ([sqsReader.take]) and, once the
// batch's transaction committed, deletes its messages
// ([sqsReader.ack]). From receipt until deletion a message is in flight:
// a keeper goroutine extends the visibility of every message in flight
// before it runs out, so no other consumer receives it while its batch is
// planned and written. A message whose extension or deletion fails is
// delivered again, to this engine or another: that is safe, since every
// write is conditional on the job's version.
type sqsReader struct {
	c   *sqsClient
	log *slog.Logger
	// ahead bounds the messages received and not yet taken.
	queue chan sqsMessage
	// failed reports receive failures (an SQS outage), and ok a receive
	// that answered: only that ends the outage.
	failed func(err error, next time.Duration)
	ok     func()
	// retry cuts the receiver's backoff short ([sqsReader.nudge]).
	retry chan struct{}
	// refused is closed, and refusal set, when SQS refused the
	// credentials: the receiver stopped for good.
	refused chan struct{}
	refusal *SQSAuthError

	mu sync.Mutex
	// inFlight are the messages received and not yet deleted, by message
	// id, with the latest receipt handle (a message received again while
	// in flight has a new one; only the latest deletes it).
	inFlight map[string]sqsMessage

	// keep is how often the visibility of the messages in flight is
	// extended: a third of the visibility timeout. 0 turns the keeper off
	// (tests that let messages come back while their batch runs).
	keep time.Duration

	stats sqsStats
}

// sqsStats count what the SQS source saw, for the status and metrics.
type sqsStats struct {
	received      atomic.Int64
	redelivered   atomic.Int64 // received more than once
	groupMismatch atomic.Int64 // MessageGroupId is not the job id
	deleted       atomic.Int64
	deleteFailed  atomic.Int64
	extendFailed  atomic.Int64
}

// SQSCounters are the SQS source's counters.
type SQSCounters struct {
	Received           int64 `json:"received"`
	Redelivered        int64 `json:"redelivered"`
	GroupNotJobID      int64 `json:"group_not_job_id"`
	Deleted            int64 `json:"deleted"`
	DeleteFailed       int64 `json:"delete_failed"`
	VisibilityFailures int64 `json:"visibility_extend_failed"`
}

func (s *sqsStats) snapshot() SQSCounters {
	return SQSCounters{
		Received: s.received.Load(), Redelivered: s.redelivered.Load(), GroupNotJobID: s.groupMismatch.Load(),
		Deleted: s.deleted.Load(), DeleteFailed: s.deleteFailed.Load(), VisibilityFailures: s.extendFailed.Load(),
	}
}

func newSQSReader(c *sqsClient, log *slog.Logger, ahead int) *sqsReader {
	return &sqsReader{
		c: c, log: log, queue: make(chan sqsMessage, max(ahead, c.cfg.MaxMessages)),
		inFlight: map[string]sqsMessage{}, keep: c.cfg.Visibility / 3,
		failed: func(error, time.Duration) {}, ok: func() {}, retry: make(chan struct{}, 1), refused: make(chan struct{}),
	}
}

// run receives and keeps messages invisible until ctx ends.
func (r *sqsReader) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	if r.keep > 0 {
		wg.Go(func() { r.keepInvisible(ctx) })
	}
	bo := retryPolicy()
	bo.MaxInterval = 10 * time.Second
	for ctx.Err() == nil {
		msgs, err := r.c.receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if ae := sqsAuthError(err); ae != nil {
				r.refusal = ae
				close(r.refused)
				return
			}
			d := bo.NextBackOff()
			r.failed(err, d)
			r.backoff(ctx, d)
			continue
		}
		bo.Reset()
		r.ok()
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

// backoff waits d between two failed receives, or less if ctx ends or
// the receiver is nudged.
func (r *sqsReader) backoff(ctx context.Context, d time.Duration) {
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
func (r *sqsReader) nudge() {
	select {
	case r.retry <- struct{}{}:
	default:
	}
}

// err is why the receiver stopped for good (SQS refused the
// credentials), or nil.
func (r *sqsReader) err() error {
	select {
	case <-r.refused:
		return r.refusal
	default:
		return nil
	}
}

// received counts m and says when its group is not its job: order is then
// not guaranteed for that job (the version rules still hold).
func (r *sqsReader) received(m sqsMessage) {
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
// linger or until max are taken.
func (r *sqsReader) take(ctx context.Context, maxMsgs int, wait, linger time.Duration) []sqsMessage {
	t := time.NewTimer(wait)
	defer t.Stop()
	var first sqsMessage
	select {
	case first = <-r.queue:
	case <-t.C:
		return nil
	case <-r.refused:
		return nil
	case <-ctx.Done():
		return nil
	}
	msgs := []sqsMessage{first}
	l := time.NewTimer(linger)
	defer l.Stop()
	for len(msgs) < maxMsgs {
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
func (r *sqsReader) ack(ctx context.Context, ids []string) {
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
func (r *sqsReader) forget(ids []string) []sqsMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []sqsMessage
	for _, id := range ids {
		if m, ok := r.inFlight[id]; ok {
			out = append(out, m)
			delete(r.inFlight, id)
		}
	}
	return out
}

// release makes every message still in flight visible again at once, for
// another consumer (or this one, later) to receive: the engine stops. It
// is best effort: a long poll cut short by the stop may still be open on
// the server for up to its wait and take them, and they then come back
// after their visibility timeout.
func (r *sqsReader) release() {
	r.mu.Lock()
	msgs := make([]sqsMessage, 0, len(r.inFlight))
	for _, m := range r.inFlight {
		msgs = append(msgs, m)
	}
	clear(r.inFlight)
	r.mu.Unlock()
	if len(msgs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := r.c.changeVisibility(ctx, msgs, 0); err != nil {
		r.log.Debug("releasing messages in flight failed; they come back after their visibility timeout", "messages", len(msgs), "err", err)
	}
}

// keepInvisible extends, every keep, the visibility of every message in
// flight.
func (r *sqsReader) keepInvisible(ctx context.Context) {
	t := time.NewTicker(r.keep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		msgs := make([]sqsMessage, 0, len(r.inFlight))
		for _, m := range r.inFlight {
			msgs = append(msgs, m)
		}
		r.mu.Unlock()
		if len(msgs) == 0 {
			continue
		}
		ectx, cancel := context.WithTimeout(ctx, r.keep)
		failed, err := r.c.changeVisibility(ectx, msgs, r.c.cfg.Visibility)
		cancel()
		if err != nil && !errors.Is(err, context.Canceled) {
			r.log.Warn("extending the visibility of messages in flight failed; they may be delivered again (safe: duplicates are dropped)", "messages", len(msgs), "err", err)
			r.stats.extendFailed.Add(int64(len(msgs)))
			continue
		}
		if len(failed) > 0 {
			r.stats.extendFailed.Add(int64(len(failed)))
			r.log.Warn("the visibility of some messages in flight could not be extended; they may be delivered again (safe: duplicates are dropped)",
				"failed", len(failed), "of", len(msgs), "first", firstFailure(failed))
		}
	}
}

var _ Source = (*sqsSource)(nil)

// sqsSource is an SQS queue as a [Source]: unordered, acknowledged by
// deleting the messages.
type sqsSource struct {
	r         *sqsReader
	batchSize int
	linger    time.Duration
}

// Fetch takes up to a batch of received messages as records: the body is
// the value, with no key (the job id is in the body), and the coordinate
// names the message.
func (s *sqsSource) Fetch(ctx context.Context, wait time.Duration) ([]Record, error) {
	msgs := s.r.take(ctx, s.batchSize, wait, s.linger)
	if len(msgs) == 0 {
		return nil, nil
	}
	recs := make([]Record, len(msgs))
	for i, m := range msgs {
		recs[i] = Record{Value: m.Body, Time: m.Sent,
			Coord: Coord{Partition: -1, Offset: m.Offset(), MessageID: m.ID, Sequence: m.Sequence, Group: m.Group}}
	}
	return recs, nil
}

// Ack deletes the messages of a committed batch.
func (s *sqsSource) Ack(ctx context.Context, recs []Record) error {
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.Coord.MessageID
	}
	s.r.ack(ctx, ids)
	return nil
}

// Ordered is false: no positions, no owners; the store alone arbitrates.
func (s *sqsSource) Ordered() bool { return false }

// Lag is the queue's approximate visible and in-flight messages.
func (s *sqsSource) Lag(ctx context.Context) (int64, error) {
	n, err := s.r.c.counts(ctx)
	return n.Visible + n.InFlight, err
}

// Close makes what is still in flight visible again.
func (s *sqsSource) Close() error {
	s.r.release()
	return nil
}

// sqsCoordinate is the SQS message c names, for a held or quarantine row; zero for
// a Kafka record.
func sqsCoordinate(c Coord) store.Coordinate {
	return store.Coordinate{MessageID: c.MessageID, SequenceNumber: c.Sequence}
}

func firstFailure(f batchFailure) string {
	for id, why := range f {
		return id + ": " + why
	}
	return ""
}

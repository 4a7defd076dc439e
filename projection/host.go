package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/projector/projector/source"
	"github.com/projector/projector/store"
)

// host is the engine as its source sees it ([source.Host]): the source
// hands it lanes and tells it of its outages and its logs' ends.
type host struct{ p *Projector }

var _ source.Host = host{}

func (h host) Logger() *slog.Logger { return h.p.cfg.Logger }

func (h host) Failed(err error, retryIn time.Duration) { h.p.sourceOutage.Failed(err, retryIn) }

func (h host) Answered() { h.p.sourceOutage.OK() }

func (h host) Failing(now time.Time) (time.Duration, string) { return h.p.sourceOutage.FailingFor(now) }

func (h host) Ends(ends map[int]source.LogEnd) { h.p.book.setEnds(ends) }

func (h host) QueueLag(n int64, known bool) {
	if known {
		h.p.book.setQueueLag(0, n)
	} else {
		h.p.book.setQueueLagUnknown(0)
	}
}

func (h host) Alive(name string, floor time.Duration) (beat func(), done func()) {
	b, done := h.p.health.Loop(name, floor)
	return b.Now, done
}

// Record records what the source consumes as in the store, waiting out
// the database, and sets the projection's identity.
func (h host) Record(ctx context.Context, c source.Consumer) (source.Recorded, error) {
	p := h.p
	kind := store.KafkaGroup
	if c.Kind == source.ConsumerQueue {
		kind = store.SQSQueue
	}
	var rec store.Consumer
	err := p.retryDatabase(ctx, func() error {
		var err error
		rec, err = p.cfg.Store.RecordConsumer(ctx, kind, c.Explicit, c.Fresh, c.Legacy)
		var taken *store.ConsumerTakenError
		if errors.As(err, &taken) {
			ge := &GroupConflictError{Group: taken.Consumer, Ours: taken.Identity.Name, Theirs: taken.Projection, Queue: kind == store.SQSQueue}
			if !ge.Queue {
				ge.Suggest = p.ownGroup()
			}
			return backoff.Permanent(ge)
		}
		return err
	})
	if err != nil {
		return source.Recorded{}, err
	}
	return source.Recorded{Name: rec.Name, Previous: rec.Previous, Legacy: rec.Legacy,
		ID: rec.Identity.ID, Projection: rec.Identity.Name, Suggest: p.ownGroup()}, nil
}

// Serve runs one lane's worker until ctx ends, the lane is fenced, or it
// cannot go on.
func (h host) Serve(ctx context.Context, lane source.Lane) error {
	p := h.p
	cfg := p.cfg
	topic, partition := lane.Scope()
	caps := lane.Caps()
	name, log := fmt.Sprintf("partition %d worker", partition), cfg.Logger.With("topic", topic, "partition", partition)
	if !caps.Log {
		name, log = "queue worker", cfg.Logger.With("queue", topic)
		p.book.setQueue(partition)
	}
	b, alive := p.health.Loop(name, 0)
	defer alive()
	w := &worker{
		workerDeps: p.workerDeps(),
		beat:       b,
		topic:      topic,
		partition:  partition,
		log:        log,
		cache:      newJobCache(p.budget),
		position:   -1,
		stored:     -1,
		lane:       lane,
		adoptEvery: p.adoptEvery,
	}
	defer p.book.drop(partition, w)
	err := w.run(ctx)
	switch {
	case err == nil || errors.Is(err, context.Canceled) || ctx.Err() != nil:
		return nil
	case errors.Is(err, errFenced):
		// Said when the fence was met; a new owner or a rebuild's swap
		// took the partition. The generation ends, and the instance
		// joins the group again and claims anew.
		w.log.Info("partition worker stopped: fenced; joining the group again")
		return nil
	}
	return err
}

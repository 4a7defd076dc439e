package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/segmentio/kafka-go"

	"github.com/projector/projector/store"
)

// worker owns one partition for one generation: nothing else reads its
// records or writes under its epoch.
type worker struct {
	p         *Projector
	topic     string
	partition int
	epoch     int64
	log       *slog.Logger
	cache     *versionCache
	position  int64
	hwm       int64
	committed func(partition int, next int64)
}

// applyTimeout bounds one batch transaction.
const applyTimeout = 2 * time.Minute

// errFenced stops a worker whose partition was claimed by another owner.
var errFenced = errors.New("partition fenced")

// testHookBeforeApply, when set by a test, runs before each batch commit.
var testHookBeforeApply func(partition int)

func (w *worker) run(ctx context.Context) error {
	cfg := w.p.cfg
	claim, err := w.claim(ctx)
	if err != nil {
		return err
	}
	w.epoch = claim.Epoch
	w.position = claim.NextOffset
	w.log = w.log.With("epoch", w.epoch)
	w.publish()

	start := claim.NextOffset
	if start < 0 {
		start = kafka.FirstOffset
		if cfg.Start == "latest" {
			start = kafka.LastOffset
		}
	}
	w.log.Info("partition claimed", "next_offset", claim.NextOffset)
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:     cfg.Brokers,
		Topic:       w.topic,
		Partition:   w.partition,
		MinBytes:    1,
		MaxBytes:    16 << 20,
		MaxWait:     cfg.MaxWait,
		Dialer:      w.p.dialer,
		ErrorLogger: kafka.LoggerFunc(func(msg string, args ...any) { w.log.Debug(fmt.Sprintf(msg, args...)) }),
	})
	defer r.Close()
	if err := r.SetOffset(start); err != nil {
		return fmt.Errorf("projection: %s/%d: set offset %d: %w", w.topic, w.partition, start, err)
	}

	for {
		msgs, hwm := w.fetch(ctx, r)
		if hwm > w.hwm {
			w.hwm = hwm
			w.publish()
		}
		if len(msgs) > 0 {
			if err := w.commit(ctx, msgs); err != nil {
				return err
			}
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

func (w *worker) claim(ctx context.Context) (store.Claim, error) {
	var claim store.Claim
	op := func() error {
		var err error
		claim, err = w.p.cfg.Store.Claim(ctx, w.topic, w.partition, w.p.cfg.Owner)
		if err != nil {
			w.log.Warn("claim failed, retrying", "err", err)
		}
		return err
	}
	err := backoff.Retry(op, backoff.WithContext(retryPolicy(), ctx))
	return claim, err
}

// fetch blocks for the first record, then gathers more for up to the
// linger time or the batch size. It returns early when ctx ends.
func (w *worker) fetch(ctx context.Context, r *kafka.Reader) ([]kafka.Message, int64) {
	cfg := w.p.cfg
	var msgs []kafka.Message
	var hwm int64
	m, err := r.FetchMessage(ctx)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("fetch failed", "err", err)
			sleep(ctx, time.Second)
		}
		return nil, 0
	}
	msgs = append(msgs, m)
	hwm = m.HighWaterMark
	lctx, cancel := context.WithTimeout(ctx, cfg.BatchLinger)
	defer cancel()
	for len(msgs) < cfg.BatchSize {
		m, err := r.FetchMessage(lctx)
		if err != nil {
			break
		}
		msgs = append(msgs, m)
		hwm = m.HighWaterMark
	}
	return msgs, hwm
}

// commit plans and applies one batch, retrying transient failures until
// it lands, the partition is fenced, or ctx ends. An attempt already
// running when ctx ends is finished (its work is done, only the commit
// remains); a batch that never landed is abandoned, to be read again by
// whoever owns the partition next.
func (w *worker) commit(ctx context.Context, msgs []kafka.Message) error {
	bo := retryPolicy()
	for {
		b, t := w.plan(msgs)
		if testHookBeforeApply != nil {
			testHookBeforeApply(w.partition)
		}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), applyTimeout)
		res, err := w.p.cfg.Store.Apply(actx, b)
		cancel()
		if err == nil {
			w.settle(b, res, &t)
			w.p.counters.add(t)
			w.position = b.NextOffset
			w.publish()
			w.committed(w.partition, b.NextOffset)
			return nil
		}
		w.cache.reset()
		var stale *store.StaleError
		switch {
		case errors.Is(err, store.ErrFenced):
			w.p.counters.fenced.Add(1)
			w.log.Warn("fenced: another owner claimed this partition; its batch was rolled back and the partition stopped",
				"batch_first_offset", msgs[0].Offset, "records", len(msgs))
			return errFenced
		case errors.As(err, &stale):
			w.log.Info("rows moved under the batch; reloading", "jobs", len(stale.Jobs))
			continue
		}
		if ctx.Err() != nil {
			w.log.Warn("batch abandoned at shutdown; it will be read again", "err", err, "first_offset", msgs[0].Offset)
			return nil
		}
		d := bo.NextBackOff()
		w.log.Error("batch failed; retrying", "err", err, "retry_in", d)
		sleep(ctx, d)
	}
}

func (w *worker) publish() {
	w.p.book.set(PartitionStatus{Partition: w.partition, Position: w.position, HighWatermark: w.hwm, Epoch: w.epoch})
}

// retryPolicy never gives up by itself: a projection that stops retrying
// loses its place; the caller's context ends it.
func retryPolicy() *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 200 * time.Millisecond
	bo.MaxInterval = 30 * time.Second
	bo.MaxElapsedTime = 0
	return bo
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

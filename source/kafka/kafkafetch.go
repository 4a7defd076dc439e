package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/projector/projector/source"
)

// The fetcher's limits.
const (
	// fetchMaxBytes bounds one fetch response.
	fetchMaxBytes = 16 << 20
	// fetchReadTimeout is how long a fetch's answer may take beyond the
	// broker's wait, and how long reading the offsets of a new connection
	// may take; a broker silent for longer is dialled again.
	fetchReadTimeout = 10 * time.Second
	// fetchAttempts is how many connection attempts in a row (or
	// connections that fail before any fetch is answered) fail in silence
	// before each failure is reported to the source (kafka-go's reader
	// default): a leader moving or a broker restarting is not an outage.
	fetchAttempts = 3
	// fetchBackoffMin and fetchBackoffMax bound the wait before a retry.
	fetchBackoffMin = 100 * time.Millisecond
	fetchBackoffMax = time.Second
)

// fetched is what a [partitionFetcher] hands over: records in offset
// order, with where the log goes on after them, or an error.
type fetched struct {
	recs []source.Record
	// next is where reading goes on: past the chunk's last record, and
	// past the offsets after it that hold nothing to hand over
	// (transaction markers, records of aborted transactions, records
	// compacted away). A chunk may hold no record and only move next.
	next int64
	// first, in the first chunk after the fetcher started, is the offset
	// of the first entry of the log it found at or after its start (a
	// record, handed over or not, or a marker); -1 in the others.
	first int64
	err   error
	// ready is when the chunk was offered: one taken long after was
	// waiting for its worker, and the records that came meanwhile are
	// already in the log (see [Partition.Fetch]).
	ready time.Time
}

// fetcherConfig is what a [partitionFetcher] reads and how.
type fetcherConfig struct {
	dialer    *kafkago.Dialer
	brokers   []string
	topic     string
	partition int
	// maxWait is how long the broker holds a fetch with nothing to return.
	maxWait time.Duration
	// chunk is the most records handed over at once: the batch size.
	chunk int
	// readCommitted reads committed: nothing past the last stable
	// offset, no record of an aborted transaction.
	readCommitted bool
	log           *slog.Logger
}

// partitionFetcher reads one partition from its leader in the background,
// whole fetch responses over a [logConn], and hands the records over a
// chunk at a time on out. It replaces kafka-go's Reader, which hands each
// message over on a channel and sets a read deadline per message: about a
// fifth of the CPU of a rebuild went there. Here a channel operation moves
// a chunk, and the read deadline is set once per fetch.
//
// It reads as cfg.readCommitted says ([logFetch]); each chunk says where the
// log goes on after it, and a chunk with no records says that reading
// passed offsets that hold none (a transaction's markers, an aborted
// transaction), so that the position moves past them.
//
// While the partition is behind, a chunk is a whole batch; at the
// partition's end it is what was read. A full chunk waits for the source
// to take it, so about one batch is read ahead: the next batch is fetched
// while the current one is written. It is two when the source holds a
// chunk that did not fit in the batch it returned ([Partition.held]).
//
// The error handling is kafka-go's reader's: a new leader or a broken
// connection dials again, with a backoff; a failure to connect is reported
// from the fetchAttempts-th attempt in a row on; a Kafka error code other
// than those is reported and the fetch retried. An offset out of range is
// reported and ends the fetcher: the source decides where to go on from
// ([Partition.outOfRange]) and starts another.
type partitionFetcher struct {
	cfg fetcherConfig
	out chan fetched
	// hwm and stable are the partition's end and its last stable offset
	// as last answered by a fetch.
	hwm, stable atomic.Int64
	cancel      context.CancelFunc
	done        chan struct{}

	// The run goroutine's own: pending is the chunk being filled, and
	// lastLen the length of the last one handed over, which sizes the
	// next (growing a chunk to a whole batch copied each record about
	// twice); next is where the log goes on after what was read, handed
	// where it went on after the last chunk handed over; first is the
	// first entry read at or after the start, until the first chunk
	// reports it.
	pending  []source.Record
	lastLen  int
	next     int64
	handed   int64
	first    int64
	reported bool
}

// startPartitionFetcher starts reading at offset, an offset or
// kafkago.FirstOffset or kafkago.LastOffset.
func startPartitionFetcher(cfg fetcherConfig, offset int64) *partitionFetcher {
	ctx, cancel := context.WithCancel(context.Background())
	f := &partitionFetcher{cfg: cfg, out: make(chan fetched), cancel: cancel, done: make(chan struct{}), first: -1}
	go f.run(ctx, offset)
	return f
}

// stop ends the fetcher, closing its connection so that a fetch in flight
// returns at once, and waits for it.
func (f *partitionFetcher) stop() {
	f.cancel()
	<-f.done
}

func (f *partitionFetcher) run(ctx context.Context, offset int64) {
	defer close(f.done)
	stalled := 0 // connections in a row that read nothing before failing
	connected := false
	for attempt := 0; ; attempt++ {
		// What was read is handed over before waiting to connect again.
		if attempt > 0 && (!f.handOver(ctx) || !f.pause(ctx, attempt)) {
			return
		}
		conn, release, start, err := f.connect(ctx, offset)
		switch {
		case ctx.Err() != nil:
			if conn != nil {
				release()
			}
			return
		case errors.Is(err, kafkago.OffsetOutOfRange):
			f.fail(ctx, err)
			return
		case err != nil:
			if attempt >= fetchAttempts {
				if !f.fail(ctx, err) {
					return
				}
			} else {
				f.debug("connecting failed", "offset", offset, "attempt", attempt+1, "err", err)
			}
			continue
		}
		// Connected: a failure from now on starts the backoff again.
		attempt = 0
		if !connected {
			// Where the start offset was resolved (the log start, or
			// its end) is where the handing over starts.
			connected, f.next, f.handed = true, start, start
		}
		var answered bool
		offset, answered, err = f.read(ctx, conn, start)
		release()
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, kafkago.OffsetOutOfRange):
			f.fail(ctx, err)
			return
		}
		// A connection that fails before any fetch is answered, again and
		// again (a codec kafka-go does not know, a broker that breaks
		// every connection), is reported as a failure to connect is,
		// rather than dialled again in silence for ever. One that was
		// answered (records, or an empty answer on a quiet partition)
		// and then dropped starts the count again.
		if answered || offset > start {
			stalled = 0
		} else {
			stalled++
		}
		if stalled >= fetchAttempts {
			if !f.fail(ctx, fmt.Errorf("reading %s/%d at offset %d failed %d times in a row: %w", f.cfg.topic, f.cfg.partition, offset, stalled, err)) {
				return
			}
			continue
		}
		f.debug("reading failed; connecting again", "offset", offset, "err", err)
	}
}

// connect dials the partition's leader, through the projector's dialer
// (its TLS and SASL), and resolves offset against the partition's bounds.
// release closes the connection; it is also closed when ctx ends, so that
// a read in progress returns.
func (f *partitionFetcher) connect(ctx context.Context, offset int64) (conn *LogConn, release func(), start int64, err error) {
	cfg := f.cfg
	// Bounded: a broker that accepts the connection and then says nothing
	// would hold the partition for ever.
	dctx, cancel := context.WithTimeout(ctx, 2*fetchReadTimeout)
	conn, err = DialLog(dctx, cfg.dialer, cfg.brokers, cfg.topic, cfg.partition)
	cancel()
	if err != nil {
		return nil, nil, 0, err
	}
	// The connection as dialled: conn is this function's result, which a
	// return on failure sets to nil while ctx's AfterFunc may still run.
	c := conn
	stop := context.AfterFunc(ctx, func() { c.Close() })
	release = func() {
		stop()
		c.Close()
	}
	_ = conn.SetDeadline(time.Now().Add(fetchReadTimeout))
	// A position up to the high watermark is in the log, also past the
	// last stable offset: it is read once the transactions before it end.
	first, last, err := conn.Bounds(false)
	if err == nil && offset == kafkago.LastOffset && cfg.readCommitted {
		// The latest a read-committed reader starts at is the last
		// stable offset: what an open transaction wrote is read once it
		// commits.
		last, err = conn.offset(kafkago.LastOffset, true)
	}
	if err != nil {
		release()
		return nil, nil, 0, fmt.Errorf("offsets of %s/%d: %w", cfg.topic, cfg.partition, err)
	}
	switch {
	case offset == kafkago.FirstOffset:
		offset = first
	case offset == kafkago.LastOffset:
		offset = last
	case offset < first || offset > last:
		// kafka-go's reader moves to the log start without a word; the
		// source must know, to count what was lost.
		release()
		return nil, nil, 0, fmt.Errorf("offset %d is outside %s/%d's log (%d to %d): %w", offset, cfg.topic, cfg.partition, first, last, kafkago.OffsetOutOfRange)
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, release, offset, nil
}

// read fetches from conn from offset on until the connection must be
// replaced (the error says why) or ctx ends; it returns the offset to go
// on from, and whether any fetch on conn was answered.
func (f *partitionFetcher) read(ctx context.Context, conn *LogConn, offset int64) (int64, bool, error) {
	errs := 0
	answered := false // a fetch on conn was answered
	for {
		if errs > 0 {
			// What was read is handed over before waiting.
			if !f.handOver(ctx) || !f.pause(ctx, errs) {
				return offset, answered, ctx.Err()
			}
		}
		next, end, read, err := f.fetch(ctx, conn, offset)
		offset = next
		if err == nil || errors.Is(err, kafkago.RequestTimedOut) {
			// The connection works: a failure after this is not one in
			// a row with those before it.
			answered = true
		}
		switch {
		case err == nil:
			errs = 0
			// At the partition's end (the last stable offset, reading
			// committed), what was read goes at once rather than wait
			// for a whole batch; so it does after a response without
			// records (transaction markers, an aborted transaction),
			// lest it wait for records that are not coming.
			if (offset >= end || read == 0) && !f.handOver(ctx) {
				return offset, answered, ctx.Err()
			}
			continue
		case ctx.Err() != nil:
			return offset, answered, ctx.Err()
		case errors.Is(err, kafkago.RequestTimedOut):
			// The broker's own timeout: ask again.
			errs = 0
			if !f.handOver(ctx) {
				return offset, answered, ctx.Err()
			}
			continue
		case errors.Is(err, kafkago.NotLeaderForPartition), errors.Is(err, kafkago.UnknownTopicOrPartition),
			errors.Is(err, kafkago.LeaderNotAvailable), errors.Is(err, kafkago.OffsetOutOfRange):
			// A new leader, a topic going away, or an offset the source
			// decides about.
			return offset, answered, err
		}
		var kerr kafkago.Error
		if !errors.As(err, &kerr) {
			// The connection is broken, or an answer did not decode
			// (the connection is then out of step): dial again.
			return offset, answered, err
		}
		// Any other error code is reported, and asked again after a while.
		if !f.fail(ctx, err) {
			return offset, answered, ctx.Err()
		}
		errs++
	}
}

// fetch reads one fetch response from offset into the pending chunk,
// handing each full chunk over as it fills. It returns the offset to
// fetch next, the partition's end for this reader as the response gave it
// (its last stable offset reading committed, else its high watermark),
// and how many records it read.
func (f *partitionFetcher) fetch(ctx context.Context, conn *LogConn, offset int64) (next, end int64, read int, err error) {
	// One deadline for the whole fetch: the broker holds it up to maxWait,
	// then the response has fetchReadTimeout to arrive and be read.
	_ = conn.SetReadDeadline(time.Now().Add(f.cfg.maxWait + fetchReadTimeout))
	lf, err := conn.Fetch(offset, fetchMaxBytes, f.cfg.maxWait, f.cfg.readCommitted)
	if err != nil {
		return offset, 0, 0, err
	}
	end = lf.HighWatermark
	if f.cfg.readCommitted {
		end = lf.LastStable
	}
	if lf.HighWatermark > f.hwm.Load() {
		f.hwm.Store(lf.HighWatermark)
	}
	if lf.LastStable > f.stable.Load() {
		f.stable.Store(lf.LastStable)
	}
	for {
		m, ok, rerr := lf.Next()
		f.note(lf)
		if rerr != nil {
			err = rerr
			break
		}
		if !ok {
			break
		}
		read++
		if f.pending == nil {
			f.pending = make([]source.Record, 0, min(max(f.lastLen, 64), f.cfg.chunk))
		}
		f.pending = append(f.pending, m)
		if len(f.pending) >= f.cfg.chunk {
			if !f.handOver(ctx) {
				break
			}
			// The source took its time (a whole batch's write): the rest
			// of the response gets a deadline of its own.
			_ = conn.SetReadDeadline(time.Now().Add(fetchReadTimeout))
		}
	}
	if cerr := lf.Close(); err == nil {
		err = cerr
	}
	// Past the records read, and past what the response passed after
	// them: markers, aborted transactions, records compacted away.
	return max(offset, f.next), end, read, err
}

// note records how far lf read, and the first entry it found.
func (f *partitionFetcher) note(lf *LogFetch) {
	f.next = max(f.next, lf.next)
	if f.first < 0 && !f.reported {
		f.first = lf.first
	}
}

// handOver hands the pending chunk to the source, waiting for it to take
// it: its records, or only where the log goes on when reading passed
// offsets that hold none since the last chunk. False when ctx ended first.
func (f *partitionFetcher) handOver(ctx context.Context) bool {
	if len(f.pending) == 0 && f.next <= f.handed {
		return true
	}
	c := fetched{recs: f.pending, next: f.next, first: -1, ready: time.Now()}
	if !f.reported {
		c.first = f.first
		if c.first < 0 {
			// Only offsets whose records were compacted away: the first
			// entry is past them.
			c.first = f.next
		}
	}
	select {
	case f.out <- c:
		f.lastLen, f.pending, f.handed, f.reported = len(f.pending), nil, f.next, true
		return true
	case <-ctx.Done():
		return false
	}
}

// fail hands what was read over, then err; false when ctx ended first.
func (f *partitionFetcher) fail(ctx context.Context, err error) bool {
	if !f.handOver(ctx) {
		return false
	}
	select {
	case f.out <- fetched{err: err, first: -1, ready: time.Now()}:
		return true
	case <-ctx.Done():
		return false
	}
}

// pause waits before a retry, longer after each failure in a row (as
// kafka-go's reader does); false when ctx ended first.
func (f *partitionFetcher) pause(ctx context.Context, failures int) bool {
	sleep(ctx, min(time.Duration(failures*failures)*fetchBackoffMin, fetchBackoffMax))
	return ctx.Err() == nil
}

func (f *partitionFetcher) debug(msg string, args ...any) {
	f.cfg.log.Debug("kafka: "+msg, append([]any{"topic", f.cfg.topic, "partition", f.cfg.partition}, args...)...)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

package wait

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/projector/projector/store"
)

// ErrTooManyWaiters is returned at once when the [Waiter] already holds
// [Config.MaxWaiters] waiters.
var ErrTooManyWaiters = errors.New("wait: too many waiters")

// ErrUnavailable is returned, wrapping the database's error, by a wait
// whose time ended unreached and whose last read failed: the answer would
// say nothing true of the job or the partition.
var ErrUnavailable = errors.New("wait: the database is unavailable")

// ErrStopped is returned to the waiters of a [Waiter] whose Run returned
// before their version or offset was reached.
var ErrStopped = errors.New("wait: stopped")

// Config sets up a [Waiter].
type Config struct {
	Store *store.Store
	// MaxWaiters bounds the waiters held at once. Default
	// [DefaultMaxWaiters].
	MaxWaiters int
	// Retry is how long Run waits before listening again after the
	// connection failed, or checking again after a check failed.
	// Default 1s.
	Retry time.Duration
	// Heartbeat is how often Run renews its lease (see [store.Store.HoldWaitLease])
	// on the listening connection, or, where the role may not, pings it;
	// a connection that does not answer within Heartbeat is taken for
	// lost and listened again. The lease lasts 6 Heartbeats. Default 5s.
	Heartbeat time.Duration
	// Poll is how often Run reads every waiter whether or not a
	// notification came: the bound on a wait's answer when a write was
	// not announced (an instance whose batch began before the lease was
	// recorded, notifications lost, a lease the role may not write).
	// Default 1s.
	Poll time.Duration
	// Holder names this process's lease; default host/pid/random.
	Holder string
	Logger *slog.Logger
}

// DefaultMaxWaiters is the default bound on waiters.
const DefaultMaxWaiters = 10_000

// WithDefaults returns c with empty fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.MaxWaiters == 0 {
		c.MaxWaiters = DefaultMaxWaiters
	}
	if c.Retry == 0 {
		c.Retry = time.Second
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = 5 * time.Second
	}
	if c.Poll == 0 {
		c.Poll = time.Second
	}
	if c.Holder == "" {
		c.Holder = defaultHolder()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports settings a Waiter cannot take.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("Store: required"))
	}
	if c.MaxWaiters < 1 {
		errs = append(errs, fmt.Errorf("MaxWaiters %d: must be at least 1", c.MaxWaiters))
	}
	if c.Retry < 0 {
		errs = append(errs, fmt.Errorf("Retry %s: must not be negative", c.Retry))
	}
	if c.Heartbeat < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("Heartbeat %s: must be at least 10ms", c.Heartbeat))
	}
	if c.Poll < time.Millisecond {
		errs = append(errs, fmt.Errorf("Poll %s: must be at least 1ms", c.Poll))
	}
	return errors.Join(errs...)
}

// JobState is a job's progress as a waiter on it was last told.
type JobState struct {
	Reached bool `json:"reached"`
	store.JobState
}

// PositionState is a partition's progress as a waiter on it was last told.
type PositionState struct {
	Reached   bool   `json:"reached"`
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	// Offset is the offset waited for.
	Offset int64 `json:"offset"`
	// Position is the partition's stored next offset; -1 when the
	// partition has none yet.
	Position int64 `json:"position"`
}

// Waiter holds the waiters of one process. Run must be running for any
// of them to be answered.
type Waiter struct {
	store     *store.Store
	max       int
	retry     time.Duration
	heartbeat time.Duration
	poll      time.Duration
	holder    string
	log       *slog.Logger
	metrics   *metrics

	// leaseRefused: the server refused the lease once (the role may not
	// write it); Run pings instead, and said so once. Run's alone.
	leaseRefused bool

	// finals are the waits over, unreached, whose state is read once
	// more, together (see reread).
	finals finals

	// kick wakes Run to check fresh waiters; one pending kick is enough.
	kick chan struct{}

	mu      sync.Mutex
	all     map[*waiter]struct{}
	fresh   []*waiter
	stopped bool
}

// waiter is one caller's wait, a few hundred bytes.
type waiter struct {
	byJob   bool
	job     string
	hash    store.JobHash
	version int64
	pos     store.PositionKey
	offset  int64
	// read says a check has read the waiter's rows once.
	read bool
	// done is closed once the wait is over: reached, or stopped.
	done chan struct{}

	// Under Waiter.mu. state is what the last read found, seen its
	// summary (store.Unseen before the first read).
	state    store.JobState
	seen     store.Seen
	position int64
	reached  bool
}

// New returns a Waiter; it answers no one until [Waiter.Run].
func New(cfg Config) (*Waiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("wait: %w", err)
	}
	cfg = cfg.WithDefaults()
	return &Waiter{
		store:     cfg.Store,
		max:       cfg.MaxWaiters,
		retry:     cfg.Retry,
		heartbeat: cfg.Heartbeat,
		poll:      cfg.Poll,
		holder:    cfg.Holder,
		log:       cfg.Logger,
		metrics:   newMetrics(),
		kick:      make(chan struct{}, 1),
		all:       make(map[*waiter]struct{}),
	}, nil
}

// Unread is how many of the waiters held now no check has read yet.
func (w *Waiter) Unread() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for wt := range w.all {
		if !wt.read {
			n++
		}
	}
	return n
}

// Waiting is the number of waiters held now.
func (w *Waiter) Waiting() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.all)
}

// WaitJob waits until job's row is at version or above, or the job is
// deleted at or above it. The state returned is read when the wait ends:
// with ctx's error when ctx ended first, [ErrStopped] when Run returned
// first, [ErrUnavailable] (and the state last read) when that read
// failed, [ErrTooManyWaiters] (and no state) when the bound is reached.
// A job deleted longer ago than the projection's tombstone retention
// reads as one never written (version 0): a wait for its delete times
// out.
func (w *Waiter) WaitJob(ctx context.Context, job string, version int64) (JobState, error) {
	if job == "" || version < 1 {
		return JobState{}, fmt.Errorf("wait: job %q at version %d: a job id and a version of at least 1 are needed", job, version)
	}
	wt := &waiter{byJob: true, job: job, hash: store.HashJob(job), version: version, state: store.JobState{JobID: job, Missing: []int64{}}, seen: store.Unseen}
	err := w.wait(ctx, wt)
	w.mu.Lock()
	defer w.mu.Unlock()
	return JobState{Reached: wt.reached, JobState: wt.state}, err
}

// WaitPosition waits until the stored position of topic's partition has
// passed offset (its next offset is above it), whatever became of the
// record there (applied, a duplicate, quarantined). Results as for
// [Waiter.WaitJob].
func (w *Waiter) WaitPosition(ctx context.Context, topic string, partition int, offset int64) (PositionState, error) {
	if topic == "" || partition < 0 || offset < 0 {
		return PositionState{}, fmt.Errorf("wait: %s/%d@%d: a topic, a partition and an offset, neither negative, are needed", topic, partition, offset)
	}
	wt := &waiter{pos: store.PositionKey{Topic: topic, Partition: partition}, offset: offset, position: -1}
	err := w.wait(ctx, wt)
	w.mu.Lock()
	defer w.mu.Unlock()
	return PositionState{Reached: wt.reached, Topic: topic, Partition: partition, Offset: offset, Position: wt.position}, err
}

func (w *Waiter) wait(ctx context.Context, wt *waiter) error {
	start := time.Now()
	wt.done = make(chan struct{})
	w.mu.Lock()
	switch {
	case w.stopped:
		w.mu.Unlock()
		w.metrics.observe(outcomeStopped, 0)
		return ErrStopped
	case len(w.all) >= w.max:
		w.mu.Unlock()
		w.metrics.observe(outcomeRefused, 0)
		return ErrTooManyWaiters
	}
	w.all[wt] = struct{}{}
	if len(w.fresh) >= 2*w.max {
		// Run is not checking: keep only the waiters still held.
		w.fresh = slices.DeleteFunc(w.fresh, func(f *waiter) bool { _, ok := w.all[f]; return !ok })
	}
	w.fresh = append(w.fresh, wt)
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	select {
	case <-wt.done:
	case <-ctx.Done():
	}
	w.mu.Lock()
	delete(w.all, wt)
	reached, stopped := wt.reached, w.stopped
	w.mu.Unlock()
	var readErr error
	if !reached {
		// What the answer says is read now, not at the last check: a
		// timed-out wait reports where the job or partition is at its end.
		reached, readErr = w.reread(ctx, wt)
	}
	switch {
	case reached:
		w.metrics.observe(outcomeReached, time.Since(start))
		return nil
	case ctx.Err() == nil && stopped:
		w.metrics.observe(outcomeStopped, time.Since(start))
		return ErrStopped
	case readErr != nil:
		w.metrics.observe(outcomeUnavailable, time.Since(start))
		return fmt.Errorf("%w: %w", ErrUnavailable, readErr)
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		w.metrics.observe(outcomeTimeout, time.Since(start))
	default:
		w.metrics.observe(outcomeCancelled, time.Since(start))
	}
	return ctx.Err()
}

// lastReadTimeout bounds the last read of a wait.
const lastReadTimeout = time.Second

// finals gathers the last reads of waits that end at about the same time
// (10,000 timing out together) into few queries: the first to come reads
// for every one queued meanwhile, then hands the next queue over (see
// maxLeadRounds) so that its own caller is not kept.
type finals struct {
	mu      sync.Mutex
	queue   []*final
	reading bool
	// handovers counts the leads handed over, for tests.
	handovers int
}

type final struct {
	wt *waiter
	// done receives the read's error, or errLead: read for the queue
	// (this one included).
	done chan error
}

var errLead = errors.New("lead")

// maxLeadRounds is 1: a reader reads once, for every wait queued then
// (its own among them), and hands the waits queued meanwhile to the first
// of them. More rounds saved nothing (each round reads the whole queue
// anyway) and kept the reader's own caller, answered in its first round,
// for the others' reads: up to lastReadTimeout each while the database
// did not answer, after a timeout the caller had asked to be kept to.
const maxLeadRounds = 1

// reread reads wt once more, with the waits that end meanwhile, in one
// query; the wait is over, so the connection is held for that query only.
func (w *Waiter) reread(ctx context.Context, wt *waiter) (reached bool, err error) {
	f := &final{wt: wt, done: make(chan error, 1)}
	w.finals.mu.Lock()
	w.finals.queue = append(w.finals.queue, f)
	lead := !w.finals.reading
	w.finals.reading = true
	w.finals.mu.Unlock()
	if !lead {
		err = <-f.done
	}
	if lead || errors.Is(err, errLead) {
		w.readFinals(ctx)
		err = <-f.done
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return wt.reached, err
}

// readFinals reads the queued waits, for at most maxLeadRounds queries,
// then hands the rest to the first of them.
func (w *Waiter) readFinals(ctx context.Context) {
	for round := 0; ; round++ {
		w.finals.mu.Lock()
		batch := w.finals.queue
		switch {
		case len(batch) == 0:
			w.finals.reading = false
			w.finals.mu.Unlock()
			return
		case round == maxLeadRounds:
			// The first queued leads on; it stays queued, so that it
			// reads itself too.
			w.finals.handovers++
			w.finals.mu.Unlock()
			batch[0].done <- errLead
			return
		}
		w.finals.queue = nil
		w.finals.mu.Unlock()
		err := w.readLast(ctx, batch)
		for _, f := range batch {
			f.done <- err
		}
	}
}

// readLast reads the waits of batch in one query and records what it
// found in each.
func (w *Waiter) readLast(ctx context.Context, batch []*final) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lastReadTimeout)
	defer cancel()
	seen := map[string]store.Seen{}
	var parts []store.PositionKey
	for _, f := range batch {
		if f.wt.byJob {
			seen[f.wt.job] = store.Unseen
		} else {
			parts = append(parts, f.wt.pos)
		}
	}
	jobs, positions, err := w.store.Reached(ctx, seen, parts)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, f := range batch {
		wt := f.wt
		if wt.byJob {
			wt.state = jobs[wt.job]
			wt.reached = wt.state.Version >= wt.version
		} else {
			wt.position = positions[wt.pos]
			wt.reached = wt.position > wt.offset
		}
	}
	return nil
}

// defaultHolder names this process's lease: host, process id and a
// random suffix (two Waiters of one process hold two leases).
func defaultHolder() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%x", host, os.Getpid(), b)
}

package projection

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/projector/projector/store"
)

// Rebuild projects the topic from its earliest offsets into a shadow of a
// live read model, with its own consumer group, and swaps the shadow in
// once it caught up (`projector rebuild`; docs/guide/rebuild.md). The live
// model keeps serving meanwhile, and is untouched by a rebuild that stops
// before the swap: a later one continues from the shadow's positions.
type Rebuild struct {
	// Live is the live read model.
	Live *store.Store
	// Config is the rebuild's projection; its Store is set to the shadow.
	Config Config
	// KeepOld keeps a copy of the previous model; Restart discards what an
	// unfinished rebuild stored; DryRun reports the drift and never swaps.
	KeepOld, Restart, DryRun bool
	// HeldWait is how long, once caught up, held gaps may close before the
	// swap; Timeout gives up when not caught up within it (0: never).
	HeldWait, Timeout time.Duration
	// DriftSample is how many job ids a dry run's drift names per kind.
	DriftSample int
	// Out receives what the rebuild says it does, a line each.
	Out io.Writer
	// Started, when set, is given the shadow's projector before it runs
	// (to serve its health, status and metrics); its stop is called when
	// the rebuild returns.
	Started func(p *Projector) (stop func(), err error)
	// Progress, when set, is given the records to read before the shadow
	// reads them; update is told how many were read, finish when reading
	// is done.
	Progress func(total int64) (update func(read int64), finish func())
}

// RebuildResult is what a rebuild did.
type RebuildResult struct {
	// Counters are the rebuild's projection's, for this run.
	Counters Counters
	// Swap is what the swap changed; zero for a dry run.
	Swap store.SwapResult
	// Drift is how the live model differs from the rebuilt one, for a dry
	// run.
	Drift store.Drift
}

// RebuildSetupError is a rebuild that cannot start as asked: the operator
// must change how it is run. Nothing was changed.
type RebuildSetupError struct{ Msg string }

func (e *RebuildSetupError) Error() string { return e.Msg }

// causedError is a message of its own that still wraps its cause, for
// errors.Is.
type causedError struct {
	msg string
	err error
}

func (e *causedError) Error() string { return e.msg }

func (e *causedError) Unwrap() error { return e.err }

// rebuildCatchUpBound is how long the swap, holding the live positions,
// waits for the shadow to read as far as they say.
const rebuildCatchUpBound = 30 * time.Second

// rebuildPoll is how often the rebuild reads the shadow's positions while
// it waits for them to reach a target: a few small queries each time, and
// a finished rebuild waits half an interval on average before it moves on
// (at a tenth of a second, 50 ms of a 3 s rebuild of 2,000,000 events).
const rebuildPoll = 25 * time.Millisecond

// rebuildHeldPoll is how often, once caught up, the rebuild counts the
// shadow's held jobs: a count over the held table, not to be run 40 times
// a second beside the writes that close the gaps.
const rebuildHeldPoll = 100 * time.Millisecond

// rebuildMaxWait is the shadow's fetch wait, unless the config sets one.
// Once a partition is read to its end, the broker holds each fetch for up
// to this long. It was chosen for kafka-go's Reader, whose stop waited for
// the fetch in flight (with the one second of `projector run`, stopping
// the shadow before the swap took 0.5 to 0.7 s of a 7 s rebuild) and which
// gave up on an answer a quarter of the wait after the broker could send
// it. The partition fetcher that replaced it closes its connection to stop
// and gives an answer the wait plus fetchReadTimeout; the value stayed.
const rebuildMaxWait = 500 * time.Millisecond

// Run rebuilds, checking every precondition before anything is reset: one
// rebuild of the table at a time (*store.ErrRebuildRunning), the topic, and
// what is attached to the live table.
func (r *Rebuild) Run(ctx context.Context) (RebuildResult, error) {
	var res RebuildResult
	cfg := r.Config
	live := r.Live
	if cfg.From != nil {
		// The shadow reads through a source of its own (its own group),
		// and the live log's ends are asked of another: a source is run
		// once, by one engine.
		return res, &RebuildSetupError{Msg: "rebuild: Config.From is set; a rebuild builds its sources from the configuration (Source and its settings)"}
	}
	began := time.Now()
	release, err := live.LockRebuild(ctx)
	if errors.Is(err, store.ErrRebuildRunning) {
		return res, &causedError{err: err, msg: fmt.Sprintf("nothing was changed: another rebuild of %s.%s is running (it holds the shadow %s); wait for it to end, or stop it",
			live.Schema(), live.Projection(), r.shadowName())}
	}
	if err != nil {
		return res, err
	}
	defer release()
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	// The target is where the shadow can read to: reading committed, the
	// last stable offsets (a transaction open now is read once it ends,
	// after the swap), past the markers at the logs' ends.
	log, err := cfg.WithDefaults().source()
	if err != nil {
		cancel()
		return res, fmt.Errorf("nothing was changed: %w", err)
	}
	ends, err := log.Ends(hctx)
	cancel()
	if err != nil {
		return res, fmt.Errorf("nothing was changed: %w", err)
	}
	target := make(map[int]int64, len(ends))
	for id, e := range ends {
		target[id] = e.End
	}
	if err := live.CheckRebuild(ctx); err != nil {
		var refused *store.RebuildRefusedError
		if errors.As(err, &refused) {
			return res, fmt.Errorf("nothing was changed: %s.%s has what a rebuild cannot keep:\n  %s", live.Schema(), live.Projection(), strings.Join(refused.Problems, "\n  "))
		}
		return res, err
	}
	shadow, err := live.Shadow()
	if err != nil {
		return res, &RebuildSetupError{fmt.Sprintf("--table: %v", err)}
	}
	fresh, err := r.prepareShadow(ctx, shadow, target)
	if err != nil {
		return res, err
	}
	phase := r.phases(began)
	phase("shadow prepared")

	cfg.Store = shadow
	if cfg.MaxWait == 0 {
		cfg.MaxWait = rebuildMaxWait
	}
	p, err := New(cfg)
	if err != nil {
		return res, &RebuildSetupError{err.Error()}
	}
	if fresh {
		// Only this process writes the shadow, which started empty: a
		// job it has not written is not there to read.
		p.written = newWrittenSet()
	}
	if r.Started != nil {
		stop, err := r.Started(p)
		if err != nil {
			return res, err
		}
		defer stop()
	}
	rctx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	runDone := make(chan struct{})
	var runErr error
	go func() {
		defer close(runDone)
		runErr = p.Run(rctx)
	}()
	// stopShadow stops the rebuild's projection and waits for it: its
	// batch in flight commits or is dropped, its positions stay true.
	stopShadow := func() error {
		cancelRun()
		<-runDone
		return runErr
	}
	defer stopShadow()
	update, finish := func(int64) {}, func() {}
	if r.Progress != nil {
		update, finish = r.Progress(sum(target))
	}
	waitErr := r.waitRebuilt(ctx, shadow, target, runDone, update)
	finish()
	if waitErr == nil {
		phase("caught up")
	}
	if r.DryRun || waitErr != nil {
		if err := stopShadow(); err != nil {
			return res, err
		}
	}
	if waitErr != nil {
		return res, fmt.Errorf("rebuild stopped before the swap, the live read model is untouched (the shadow %s stays; run again to continue from it): %w", r.shadowName(), waitErr)
	}
	if r.DryRun {
		d, err := live.Diff(ctx, shadow, r.DriftSample)
		if err != nil {
			return res, err
		}
		res.Drift, res.Counters = d, p.Status().Counters
		return res, nil
	}
	// The shadow keeps reading until the swap holds the live positions
	// and it has read as far as they say, so the swap hands over rows
	// no older than what live instances had projected.
	catchUp := func(ctx context.Context, livePos []store.PartitionPosition) error {
		phase("live positions held")
		reached := shadowReaches(ctx, shadow, cfg.Topic, livePos, runDone)
		if err := stopShadow(); err != nil {
			return err
		}
		phase("shadow stopped at the live positions")
		return reached
	}
	// A live partition the shadow never read is read again from its log's
	// start after the swap: where that is, asked while the swap holds the
	// positions.
	logStarts := func(ctx context.Context, topic string, partitions []int) (map[int]int64, error) {
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		of := log
		if topic != cfg.Topic {
			// Positions of another topic than the one rebuilt (the
			// projection read it before): its own log is asked.
			other := cfg.WithDefaults()
			other.Topic = topic
			var err error
			if of, err = other.source(); err != nil {
				return nil, err
			}
		}
		starts, err := of.Starts(lctx, partitions)
		if err == nil && cfg.Logger != nil {
			cfg.Logger.Warn("rebuild: partitions the rebuild did not read are read again from their log's start after the swap",
				"topic", topic, "partitions", fmt.Sprint(partitions))
		}
		return starts, err
	}
	// The planner's statistics of the shadow, for the swap's comparison,
	// before the swap takes the locks live writers wait for.
	if err := shadow.AnalyzeForSwap(ctx); err != nil {
		if cfg.Logger != nil {
			cfg.Logger.Warn("rebuild: the shadow's statistics were not gathered; the swap compares the tables on the planner's guesses, which may be slower", "err", err)
		}
	} else {
		phase("shadow analyzed")
	}
	swap, err := live.SwapCaughtUp(ctx, shadow, r.KeepOld, catchUp, logStarts)
	if err == nil {
		phase("swapped")
		if swap.ComparedInOneProcess != "" && cfg.Logger != nil {
			cfg.Logger.Warn("rebuild: the swap compared the tables in one process: the server could not give parallel workers their shared memory (give the database container a larger /dev/shm, or skip the attempt with options=-c%20max_parallel_workers_per_gather%3D0 in the rebuild's DATABASE_URL)",
				"postgres_error", swap.ComparedInOneProcess)
		}
	}
	if serr := stopShadow(); err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		return res, fmt.Errorf("the live read model is untouched (the shadow %s stays; run again to swap it): %w", r.shadowName(), err)
	}
	res.Swap, res.Counters = swap, p.Status().Counters
	return res, nil
}

// phases returns a logger of the rebuild's phases at Info, each with how
// long it took and the time since began: where a slow rebuild spends its
// time.
func (r *Rebuild) phases(began time.Time) func(name string) {
	last := began
	log := r.Config.Logger
	return func(name string) {
		now := time.Now()
		if log != nil {
			log.Info("rebuild: "+name, "took", now.Sub(last).Round(time.Millisecond).String(),
				"since_start", now.Sub(began).Round(time.Millisecond).String())
		}
		last = now
	}
}

// shadowName is the rebuild table as people write it: schema.table.
func (r *Rebuild) shadowName() string {
	return r.Live.Schema() + "." + store.ShadowName(r.Live.Projection())
}

// say writes one line to Out.
func (r *Rebuild) say(format string, args ...any) {
	if r.Out != nil {
		fmt.Fprintf(r.Out, format+"\n", args...)
	}
}

// prepareShadow continues from what an earlier rebuild stored in the
// shadow, or starts it over (Restart, or nothing to continue from), and
// says which; fresh reports that the shadow is new and empty.
func (r *Rebuild) prepareShadow(ctx context.Context, shadow *store.Store, target map[int]int64) (fresh bool, err error) {
	topic, schema, table := r.Config.Topic, r.Live.Schema(), r.Live.Projection()
	prog, err := shadow.Progress(ctx, topic)
	if err != nil {
		return false, err
	}
	if len(prog.OtherTopics) > 0 && !r.Restart {
		return false, &RebuildSetupError{fmt.Sprintf("the shadow %s holds an unfinished rebuild of topic %s, not %s: pass --restart to discard it and start over",
			r.shadowName(), strings.Join(prog.OtherTopics, ", "), topic)}
	}
	if !r.Restart && prog.TableExists && prog.Read() > 0 {
		if err := shadow.Migrate(ctx); err != nil {
			return false, err
		}
		r.say("resuming the rebuild of %s.%s from the shadow's stored positions: %d of %d records already read (--restart starts over)",
			schema, table, prog.Read(), sum(target))
		return false, r.copyChecks(ctx, shadow)
	}
	if err := shadow.Reset(ctx); err != nil {
		return false, err
	}
	if err := shadow.Migrate(ctx); err != nil {
		return false, err
	}
	how := "starting"
	if r.Restart && prog.Read() > 0 {
		how = fmt.Sprintf("starting over (--restart discarded %d records read earlier):", prog.Read())
	}
	r.say("%s the rebuild of %s.%s from the start of %s into %s (%d partitions, %d records to read)",
		how, schema, table, topic, r.shadowName(), len(target), sum(target))
	return true, r.copyChecks(ctx, shadow)
}

// copyChecks gives the shadow the checks users put on the live table, so
// records that break them are quarantined in the replay, as live.
func (r *Rebuild) copyChecks(ctx context.Context, shadow *store.Store) error {
	names, err := r.Live.CopyChecks(ctx, shadow)
	if err != nil {
		return err
	}
	if len(names) > 0 {
		r.say("the shadow checks rows as %s.%s does: %s", r.Live.Schema(), r.Live.Projection(), strings.Join(names, ", "))
	}
	return nil
}

// waitRebuilt waits until the shadow's positions reach target, then up to
// HeldWait for held gaps to close.
func (r *Rebuild) waitRebuilt(ctx context.Context, shadow *store.Store, target map[int]int64, stopped <-chan struct{}, update func(read int64)) error {
	start := time.Now()
	var caughtUp, heldChecked time.Time
	tick := time.NewTicker(rebuildPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stopped:
			return errors.New("the rebuild's projection stopped (see the log above)")
		case <-tick.C:
		}
		if caughtUp.IsZero() {
			prog, err := shadow.Progress(ctx, r.Config.Topic)
			if err != nil {
				return err
			}
			done := true
			var read int64
			for part, h := range target {
				if h > 0 && prog.Positions[part] < h {
					done = false
				}
				read += min(max(prog.Positions[part], 0), h)
			}
			update(read)
			if done {
				caughtUp = time.Now()
			} else if r.Timeout > 0 && time.Since(start) > r.Timeout {
				return fmt.Errorf("not caught up within --timeout %s", r.Timeout)
			}
			continue
		}
		if time.Since(heldChecked) < rebuildHeldPoll && time.Since(caughtUp) < r.HeldWait {
			continue
		}
		heldChecked = time.Now()
		_, held, err := shadow.HeldJobs(ctx, 0)
		if err != nil {
			return err
		}
		if held == 0 || time.Since(caughtUp) >= r.HeldWait {
			return nil
		}
	}
}

// shadowReaches waits until the shadow's positions of topic are at least
// the live ones, for at most rebuildCatchUpBound, or until the shadow's
// projection stopped. What it did not reach, the live instances read again
// after the swap.
func shadowReaches(ctx context.Context, shadow *store.Store, topic string, live []store.PartitionPosition, stopped <-chan struct{}) error {
	deadline := time.Now().Add(rebuildCatchUpBound)
	for {
		prog, err := shadow.Progress(ctx, topic)
		if err != nil {
			return err
		}
		behind := false
		for _, p := range live {
			if p.Topic == topic && p.Next > max(prog.Positions[p.Partition], 0) {
				behind = true
			}
		}
		if !behind || time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stopped:
			return nil
		case <-time.After(rebuildPoll):
		}
	}
}

func sum(m map[int]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

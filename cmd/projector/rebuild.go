package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/projector/projector/projection"
	"github.com/projector/projector/store"
)

type rebuildOpts struct {
	runOpts
	// groupSet says --group (or PROJECTOR_GROUP) was given, so an empty
	// one is a mistake rather than "derive it".
	groupSet bool
	keepOld  bool
	restart  bool
	dryRun   bool
	heldWait time.Duration
	timeout  time.Duration
	progress *progress
}

// driftSample is how many job ids --dry-run shows per kind of drift.
const driftSample = 10

var rebuildCommand = &command{
	name:    "rebuild",
	summary: "rebuild the read model from the start of the log into a shadow table and swap it in atomically",
	usage: `projector rebuild projects --topic from its earliest offsets into a shadow
table (projector_rebuild_<table>) with its own consumer group, while the live
read model stays in place and keeps serving. Once every partition reaches the
end it saw when it started, it swaps the rebuilt contents in, in one
transaction: the live table's rows are made equal to the shadow's (only rows
that differ are written), so views, grants, row-level security policies,
indexes, triggers and comments on the table stay in place and readers are
never blocked. The shadow's positions and held deltas become the live ones,
its quarantine is merged into the live one (never deleted), and every
partition's epoch moves on, which fences any 'projector run' still working
the old model (it claims again and continues from the rebuilt positions).
The swap first holds the live positions and lets the shadow read as far as
they say, so no record a live instance projected is rolled back. Writes of
'projector run' pause for the whole swap (they log that they wait for it);
its length grows with the table and the share of rows that differ.

One rebuild of a table runs at a time: a second one exits 1, changing
nothing.

Before reading anything it checks the topic and what is attached to the
table; what a swap could not keep (rules, a column added NOT NULL without a
default, forced row-level security) is refused, naming it, and nothing is
changed. CHECK constraints users added to the table are put on the shadow, so
a record that breaks one is quarantined in the replay, as 'projector run' does.

A rebuild stopped or killed part way leaves the live model untouched; run it
again and it continues from the shadow's stored positions (--restart starts
over). --dry-run builds the shadow and reports how the live model differs
from it (missing, behind, ahead, differs, extra) without swapping.

Example:
  DATABASE_URL=postgres://app@db:5432/app projector rebuild --brokers kafka-1:9092 --snapshot-url http://authority:8080`,
	flags: func(fs *flag.FlagSet) any {
		o := &rebuildOpts{}
		o.register(fs, "", "off")
		group := fs.Lookup("group")
		group.Usage = "the rebuild's Kafka consumer group (default projector-rebuild-<schema>-<table>,\nso rebuilds of different tables never share one)"
		group.Value = setTracker{Value: group.Value, set: &o.groupSet}
		o.start = "earliest"
		fs.BoolVar(&o.keepOld, "keep-old", false, "keep a copy of the previous read model as projector_old_<table>_<n>")
		fs.BoolVar(&o.restart, "restart", false, "discard what an earlier, unfinished rebuild stored and start over from the start of the log")
		fs.BoolVar(&o.dryRun, "dry-run", false, "build the shadow and report how the live model differs from it, without swapping")
		fs.DurationVar(&o.heldWait, "held-wait", 30*time.Second, "after catching up, how long to let held gaps close before swapping anyway")
		fs.DurationVar(&o.timeout, "timeout", 0, "give up (and leave the live model untouched) if not caught up within this long; 0 waits for ever")
		return o
	},
	run: func(ctx context.Context, env *cmdEnv, opts any) error {
		o := opts.(*rebuildOpts)
		logger, err := o.log.logger(env.stderr)
		if err != nil {
			return err
		}
		if o.groupSet && o.group == "" {
			return usagef("--group is empty (from the flag or PROJECTOR_GROUP): name a consumer group, e.g. --group projector-rebuild-%s-%s, or leave it out for that default", o.schema, o.table)
		}
		if o.group == "" {
			o.group = "projector-rebuild-" + o.schema + "-" + o.table
		}
		if err := o.validate(); err != nil {
			return err
		}
		if o.heldWait < 0 || o.timeout < 0 {
			return usagef("--held-wait and --timeout must not be negative")
		}
		if name := store.ShadowName(o.table); len(name) > 63 {
			return usagef("--table %q: too long for its rebuild table %q (PostgreSQL names have at most 63 bytes)", o.table, name)
		}
		if o.keepOld && !store.KeptNameFits(o.table) {
			return usagef("--table %q: too long to keep the old model under projector_old_%s_<n> (PostgreSQL names have at most 63 bytes); drop --keep-old", o.table, o.table)
		}
		if o.dryRun && o.keepOld {
			return usagef("--dry-run never swaps, so --keep-old has nothing to keep: pass one of them")
		}
		// Every precondition before anything is reset: the database (whose
		// live tables are only created if missing), then the topic.
		live, err := openProjection(ctx, o.databaseURL, o.storeConfig(), migrated)
		if err != nil {
			return err
		}
		defer live.Close()
		release, err := live.LockRebuild(ctx)
		if errors.Is(err, store.ErrRebuildRunning) {
			return fmt.Errorf("nothing was changed: another rebuild of %s.%s is running (it holds the shadow %s); wait for it to end, or stop it", o.schema, o.table, shadowName(o))
		}
		if err != nil {
			return err
		}
		defer release()
		hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		target, err := projection.HighWatermarks(hctx, o.kafkaConfig(), o.topic)
		cancel()
		if err != nil {
			return fmt.Errorf("nothing was changed: %w", err)
		}
		if err := live.CheckRebuild(ctx); err != nil {
			var refused *store.RebuildRefusedError
			if errors.As(err, &refused) {
				return fmt.Errorf("nothing was changed: %s.%s has what a rebuild cannot keep:\n  %s", o.schema, o.table, strings.Join(refused.Problems, "\n  "))
			}
			return err
		}
		shadow, err := live.Shadow()
		if err != nil {
			return usagef("--table: %v", err)
		}
		if err := prepareShadow(ctx, env.stdout, live, shadow, o, target); err != nil {
			return err
		}

		p, err := projection.New(o.config(shadow, logger))
		if err != nil {
			return &usageError{err.Error()}
		}
		stop, err := o.serve(ctx, p, logger)
		if err != nil {
			return err
		}
		defer stop()
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
		o.progress = newProgress(env.stderr, logger, "rebuild", sum(target))
		waitErr := waitRebuilt(ctx, shadow, target, o, runDone)
		o.progress.finish()
		if o.dryRun || waitErr != nil {
			if err := stopShadow(); err != nil {
				return err
			}
		}
		if waitErr != nil {
			return fmt.Errorf("rebuild stopped before the swap, the live read model is untouched (the shadow %s stays; run again to continue from it): %w", shadowName(o), waitErr)
		}
		if o.dryRun {
			d, err := live.Diff(ctx, shadow, driftSample)
			if err != nil {
				return err
			}
			printDrift(env.stdout, o, d, p.Status().Counters)
			return nil
		}
		// The shadow keeps reading until the swap holds the live positions
		// and it has read as far as they say, so the swap hands over rows
		// no older than what live instances had projected.
		catchUp := func(ctx context.Context, livePos []store.PartitionPosition) error {
			reached := shadowReaches(ctx, shadow, o.topic, livePos, runDone)
			if err := stopShadow(); err != nil {
				return err
			}
			return reached
		}
		res, err := live.SwapCaughtUp(ctx, shadow, o.keepOld, catchUp)
		if serr := stopShadow(); err == nil && serr != nil {
			err = serr
		}
		if err != nil {
			return fmt.Errorf("the live read model is untouched (the shadow %s stays; run again to swap it): %w", shadowName(o), err)
		}
		c := p.Status().Counters
		fmt.Fprintf(env.stdout, "swapped: %s.%s is the rebuilt read model (this run: %d records read, %d applied, %d quarantined; %d held jobs carried over; rows changed: %d updated, %d inserted, %d deleted)\n",
			o.schema, o.table, c.Consumed, c.Applied, c.Quarantined, c.HeldJobs, res.Updated, res.Inserted, res.Deleted)
		if res.OldTable != "" {
			fmt.Fprintf(env.stdout, "the previous read model is kept as %s\n", res.OldTable)
		}
		if res.Reread > 0 {
			fmt.Fprintf(env.stdout, "live instances had projected %d records past the rebuilt positions: they read them again from those positions, and until they have, the jobs they change read at their rebuilt version\n", res.Reread)
		}
		return nil
	},
}

// prepareShadow continues from what an earlier rebuild stored in the
// shadow, or starts it over (--restart, or nothing to continue from), and
// says which.
func prepareShadow(ctx context.Context, stdout io.Writer, live, shadow *store.Store, o *rebuildOpts, target map[int]int64) error {
	prog, err := shadow.Progress(ctx, o.topic)
	if err != nil {
		return err
	}
	if len(prog.OtherTopics) > 0 && !o.restart {
		return usagef("the shadow %s holds an unfinished rebuild of topic %s, not %s: pass --restart to discard it and start over",
			shadowName(o), strings.Join(prog.OtherTopics, ", "), o.topic)
	}
	if !o.restart && prog.TableExists && prog.Read() > 0 {
		if err := shadow.Migrate(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "resuming the rebuild of %s.%s from the shadow's stored positions: %d of %d records already read (--restart starts over)\n",
			o.schema, o.table, prog.Read(), sum(target))
		return copyChecks(ctx, stdout, live, shadow, o)
	}
	if err := shadow.Reset(ctx); err != nil {
		return err
	}
	if err := shadow.Migrate(ctx); err != nil {
		return err
	}
	how := "starting"
	if o.restart && prog.Read() > 0 {
		how = fmt.Sprintf("starting over (--restart discarded %d records read earlier):", prog.Read())
	}
	fmt.Fprintf(stdout, "%s the rebuild of %s.%s from the start of %s into %s (%d partitions, %d records to read)\n",
		how, o.schema, o.table, o.topic, shadowName(o), len(target), sum(target))
	return copyChecks(ctx, stdout, live, shadow, o)
}

// copyChecks gives the shadow the checks users put on the live table, so
// records that break them are quarantined in the replay, as live.
func copyChecks(ctx context.Context, stdout io.Writer, live, shadow *store.Store, o *rebuildOpts) error {
	names, err := live.CopyChecks(ctx, shadow)
	if err != nil {
		return err
	}
	if len(names) > 0 {
		fmt.Fprintf(stdout, "the shadow checks rows as %s.%s does: %s\n", o.schema, o.table, strings.Join(names, ", "))
	}
	return nil
}

// printDrift reports how the live model differs from the rebuilt one.
func printDrift(w io.Writer, o *rebuildOpts, d store.Drift, c projection.Counters) {
	var total int64
	for _, n := range d.Counts {
		total += n
	}
	fmt.Fprintf(w, "dry run: the live model %s.%s differs from the rebuilt one in %d jobs (this run: %d records read, %d applied, %d quarantined)\n",
		o.schema, o.table, total, c.Consumed, c.Applied, c.Quarantined)
	for _, kind := range store.DriftKinds {
		fmt.Fprintf(w, "  %-8s %d", kind, d.Counts[kind])
		if ids := d.Samples[kind]; len(ids) > 0 {
			quoted := make([]string, len(ids))
			for i, id := range ids {
				quoted[i] = fmt.Sprintf("%q", id)
			}
			fmt.Fprintf(w, "  %s", strings.Join(quoted, " "))
			if int64(len(ids)) < d.Counts[kind] {
				fmt.Fprint(w, " ...")
			}
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "not swapped (--dry-run): the shadow %s stays; 'projector rebuild' without --dry-run continues from it and swaps\n",
		shadowName(o))
}

func sum(m map[int]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// waitRebuilt waits until the shadow's positions reach target, then up to
// --held-wait for held gaps to close.
func waitRebuilt(ctx context.Context, shadow *store.Store, target map[int]int64, o *rebuildOpts, stopped <-chan struct{}) error {
	start := time.Now()
	var caughtUp time.Time
	tick := time.NewTicker(100 * time.Millisecond)
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
			prog, err := shadow.Progress(ctx, o.topic)
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
			o.progress.update(read)
			if done {
				caughtUp = time.Now()
			} else if o.timeout > 0 && time.Since(start) > o.timeout {
				return fmt.Errorf("not caught up within --timeout %s", o.timeout)
			}
			continue
		}
		_, held, err := shadow.HeldJobs(ctx, 0)
		if err != nil {
			return err
		}
		if held == 0 || time.Since(caughtUp) >= o.heldWait {
			return nil
		}
	}
}

// setTracker is a flag value that records that it was set, by the flag or
// its environment variable.
type setTracker struct {
	flag.Value
	set *bool
}

func (t setTracker) String() string {
	if t.Value == nil { // the flag package's zero value, for --help
		return ""
	}
	return t.Value.String()
}

func (t setTracker) Set(v string) error {
	*t.set = true
	return t.Value.Set(v)
}

// catchUpBound is how long the swap, holding the live positions, waits
// for the shadow to read as far as they say.
const catchUpBound = 30 * time.Second

// shadowReaches waits until the shadow's positions of topic are at least
// the live ones, for at most catchUpBound, or until the shadow's
// projection stopped. What it did not reach, the live instances read again
// after the swap.
func shadowReaches(ctx context.Context, shadow *store.Store, topic string, live []store.PartitionPosition, stopped <-chan struct{}) error {
	deadline := time.Now().Add(catchUpBound)
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
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// shadowName is the rebuild table as people write it: schema.table.
func shadowName(o *rebuildOpts) string { return o.schema + "." + store.ShadowName(o.table) }

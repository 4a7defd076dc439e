package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/projector/projector/projection"
	"github.com/projector/projector/store"
)

type rebuildOpts struct {
	runOpts
	keepOld  bool
	heldWait time.Duration
	timeout  time.Duration
}

var rebuildCommand = &command{
	name:    "rebuild",
	summary: "rebuild the read model from the start of the log into a shadow table and swap it in atomically",
	usage: `projector rebuild projects --topic from its earliest offsets into a shadow
table (projector_rebuild_<table>) with its own consumer group, while the live read model
stays in place. Once every partition reaches the end it saw when it started, it
swaps the shadow in, in one transaction: the shadow becomes <table>, its
positions, held deltas and quarantine become the live ones, and every
partition's epoch moves on, which fences any 'projector run' still working the
old model (it claims again and continues from the rebuilt positions).

Held gaps are not dropped: held deltas move with the swap and the live
instances keep closing them. The old table is dropped, or kept with --keep-old.

Example:
  DATABASE_URL=postgres://app@db:5432/app projector rebuild --brokers kafka-1:9092 --snapshot-url http://authority:8080`,
	flags: func(fs *flag.FlagSet) any {
		o := &rebuildOpts{}
		o.register(fs, "projector-rebuild", "off")
		o.start = "earliest"
		fs.BoolVar(&o.keepOld, "keep-old", false, "keep the previous read model as <table>_before_<time> instead of dropping it")
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
		if err := o.validate(); err != nil {
			return err
		}
		if o.heldWait < 0 || o.timeout < 0 {
			return usagef("--held-wait and --timeout must not be negative")
		}
		if name := store.ShadowName(o.table); len(name) > 63 {
			return usagef("--table %q: too long for its rebuild table %q (PostgreSQL names have at most 63 bytes)", o.table, name)
		}
		// Every precondition before anything is created or reset.
		hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		target, err := projection.HighWatermarks(hctx, o.kafkaConfig(), o.topic)
		cancel()
		if err != nil {
			return fmt.Errorf("nothing was changed: %w", err)
		}
		live, err := openStore(ctx, o.databaseURL, o.schema, o.table)
		if err != nil {
			return err
		}
		defer live.Close()
		shadow, err := live.Shadow()
		if err != nil {
			return usagef("--table: %v", err)
		}
		if err := shadow.Reset(ctx); err != nil {
			return err
		}
		if err := shadow.Migrate(ctx); err != nil {
			return err
		}
		fmt.Fprintf(env.stdout, "rebuilding %s.%s from the start of %s into %s (%d partitions, %d records to read)\n",
			o.schema, o.table, o.topic, shadow.JobsTable(), len(target), sum(target))

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
		done := make(chan error, 1)
		go func() { done <- p.Run(rctx) }()
		waitErr := waitRebuilt(ctx, shadow, p, target, o, env)
		cancelRun()
		if err := <-done; err != nil {
			return err
		}
		if waitErr != nil {
			return fmt.Errorf("rebuild stopped before the swap, the live read model is untouched (the shadow %s stays for inspection): %w", shadow.JobsTable(), waitErr)
		}
		res, err := live.Swap(ctx, shadow, o.keepOld)
		if err != nil {
			return err
		}
		c := p.Status().Counters
		fmt.Fprintf(env.stdout, "swapped: %s.%s is the rebuilt read model (%d records read, %d applied, %d quarantined, %d held jobs carried over)\n",
			o.schema, o.table, c.Consumed, c.Applied, c.Quarantined, c.HeldJobs)
		if res.OldTable != "" {
			fmt.Fprintf(env.stdout, "the previous read model is kept as %s\n", res.OldTable)
		}
		return nil
	},
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
func waitRebuilt(ctx context.Context, shadow *store.Store, p *projection.Projector, target map[int]int64, o *rebuildOpts, env *cmdEnv) error {
	start := time.Now()
	var caughtUp time.Time
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if caughtUp.IsZero() {
			pos, err := shadow.Positions(ctx)
			if err != nil {
				return err
			}
			have := map[int]int64{}
			for _, ps := range pos {
				if ps.Topic == o.topic {
					have[ps.Partition] = ps.NextOffset
				}
			}
			done := true
			for part, h := range target {
				if h > 0 && have[part] < h {
					done = false
				}
			}
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

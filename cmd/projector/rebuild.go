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
}

// driftSample is how many job ids --dry-run shows per kind of drift.
const driftSample = 10

// rebuildBatchSize is the rebuild's default --batch-size. A replay reads
// far behind the log's end, so every batch is full, and twice the records
// of the default of 'projector run' fold more of each job's events into
// one row write: in a 2,000,000-event deltas rebuild, PostgreSQL used
// about a fifth less CPU, for the same peak RSS of the process.
const rebuildBatchSize = 10000

// rebuildCacheBytes is the rebuild's default --cache-bytes. A replay
// meets a job again within its batch or a few batches on (clustered
// logs), where a small cache serves it, or only after most of the log's
// other jobs (long jobs side by side), where no cache of a bounded size
// does: at 1,000,000 jobs the default of 'projector run' (64 MiB) held
// about 45 MB of rows the replay did not meet again, and the rebuild's
// peak RSS was 369 MiB at 0.51x raw COPY; at 8 MiB it was 235 MiB at
// 0.53x (docs/performance.md, "Memory at a million jobs").
const rebuildCacheBytes = 8 << 20

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

Its batches are larger than run's (--batch-size 10000); --batches-in-flight
works as in run, and --memory-limit as well except that auto sets no limit
where no container limit is found. Where memory is tight, set --memory-limit
(the batches in flight then fit in it), or lower --batch-size or
--batches-in-flight.

Example:
  DATABASE_URL=postgres://app@db:5432/app projector rebuild --brokers kafka-1:9092 --snapshot-url http://authority:8080`,
	flags: func(fs *flag.FlagSet) any {
		o := &rebuildOpts{}
		o.register(fs, "", "off")
		group := fs.Lookup("group")
		group.Usage = "the rebuild's Kafka consumer group (default projector-rebuild-<schema>-<table>,\nso rebuilds of different tables never share one)"
		group.Value = setTracker{Value: group.Value, set: &o.groupSet}
		o.start = "earliest"
		batch := fs.Lookup("batch-size")
		batch.DefValue = fmt.Sprint(rebuildBatchSize)
		_ = batch.Value.Set(batch.DefValue)
		batch.Usage = "most records per batch transaction (twice the default of 'projector run': a replay\nfolds more of each job's events into one write)"
		cache := fs.Lookup("cache-bytes")
		defCache := byteSize(rebuildCacheBytes)
		cache.DefValue = defCache.String()
		_ = cache.Value.Set(cache.DefValue)
		cache.Usage = "memory budget of the cache of job rows and held deltas, one `size` for the whole\nprocess (8MiB, 64MiB, 1GiB or a number of bytes; smaller than run's 64MiB\nbecause a replay seldom meets a job again after its batch); least recently\nused rows are evicted, held jobs are kept and past half of it their deltas\nstay in PostgreSQL"
		o.memory.noDefault = true
		fs.Lookup("memory-limit").Usage = "the Go runtime's soft memory limit: a `size` (400MiB), off, or auto: 85% of\nthe container's memory limit (cgroup memory.max), none where no container\nlimit is found (a rebuild is a job of bounded length, whose batches are\ntwice run's: give it a size to bound it). GOMEMLIMIT in the environment wins\nover auto"
		fs.Lookup("batches-in-flight").Usage = "most batches the rebuild plans and writes at once, whatever its partitions;\n0 (the default) picks 2 for each CPU the process may use, from 8 to 32, or,\nunder a memory limit, as many as fit in it beyond --cache-bytes at 9KiB a\nrecord of --batch-size, at least 2; -1 bounds nothing"
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
		// live tables are only created if missing), then the rest, which
		// the rebuild checks itself.
		live, err := openProjection(ctx, o.databaseURL, o.storeConfig(), migrated)
		if err != nil {
			return err
		}
		defer live.Close()
		o.memory.apply(logger, int64(o.cacheBytes))
		rb := &projection.Rebuild{
			Live: live, Config: o.config(nil, logger),
			KeepOld: o.keepOld, Restart: o.restart, DryRun: o.dryRun, HeldWait: o.heldWait, Timeout: o.timeout,
			DriftSample: driftSample, Out: env.stdout,
			Started: func(p *projection.Projector) (func(), error) { return o.serve(ctx, p, logger) },
			Progress: func(total int64) (func(int64), func()) {
				pr := newProgress(env.stderr, logger, "rebuild", total)
				return pr.update, pr.finish
			},
		}
		res, err := rb.Run(ctx)
		var setup *projection.RebuildSetupError
		if errors.As(err, &setup) {
			return &usageError{setup.Msg}
		}
		if err != nil {
			return refusedGroup(err)
		}
		c := res.Counters
		if o.dryRun {
			printDrift(env.stdout, o, res.Drift, c)
			return nil
		}
		fmt.Fprintf(env.stdout, "swapped: %s.%s is the rebuilt read model (this run: %d records read, %d applied, %d quarantined; %d held jobs carried over; rows changed: %d updated, %d inserted, %d deleted)\n",
			o.schema, o.table, c.Consumed, c.Applied, c.Quarantined, c.HeldJobs, res.Swap.Updated, res.Swap.Inserted, res.Swap.Deleted)
		if res.Swap.OldTable != "" {
			fmt.Fprintf(env.stdout, "the previous read model is kept as %s\n", res.Swap.OldTable)
		}
		if res.Swap.Reread > 0 {
			fmt.Fprintf(env.stdout, "live instances had projected %d records past the rebuilt positions: they read them again from those positions, and until they have, the jobs they change read at their rebuilt version\n", res.Swap.Reread)
		}
		return nil
	},
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

// shadowName is the rebuild table as people write it: schema.table.
func shadowName(o *rebuildOpts) string { return o.schema + "." + store.ShadowName(o.table) }

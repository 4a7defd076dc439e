package main

import (
	"context"
	"flag"

	"github.com/projector/projector/internal/bench"
	"github.com/projector/projector/internal/demo"
)

type benchOpts struct {
	databaseURL string
	events      int
	jobs        int
	partitions  int
	sample      int
	seed        uint64
	swapRows    int
	swapDiffer  int
	swapKeepOld bool
	log         logFlags
}

var benchCommand = &command{
	name:    "bench",
	summary: "the throughput benchmark, side by side with baselines",
	usage: `projector bench measures, in one run on this machine, how fast the same
stream of job snapshots reaches PostgreSQL through: raw binary COPY (no version
check: the ceiling), one autocommit upsert per event, pipelined single upserts,
and the projector end to end from an in-process Kafka broker (snapshots only,
then snapshots with deltas). Each is reported in events/s and as a ratio of raw
COPY. It works in a schema of its own and drops it at the end.

With --swap-rows N it measures instead how long the swap at the end of a
'projector rebuild' takes with N rows, and how readers querying the table
through a view fare before and during it (latencies, errors, and samples of
pg_stat_activity for readers waiting on a lock).

Example:
  DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres projector bench --events 200000`,
	flags: func(fs *flag.FlagSet) any {
		o := &benchOpts{}
		fs.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL connection string (default: the local server on 127.0.0.1:5432)")
		fs.IntVar(&o.events, "events", 200000, "snapshot events in the stream, about (jobs get a varying number each)")
		fs.IntVar(&o.jobs, "jobs", 50000, "distinct jobs (events are spread over them)")
		fs.IntVar(&o.partitions, "partitions", 6, "partitions of the benchmark topic")
		fs.IntVar(&o.sample, "per-event-sample", 5000, "events the slow one-upsert-per-event baseline writes")
		fs.Uint64Var(&o.seed, "seed", 1, "seed of the generated stream")
		fs.IntVar(&o.swapRows, "swap-rows", 0, "measure a rebuild's swap with this many rows instead of the throughput (0: the throughput)")
		fs.IntVar(&o.swapDiffer, "swap-differ-percent", 1, "with --swap-rows, the percentage of rows the rebuilt model changes")
		fs.BoolVar(&o.swapKeepOld, "swap-keep-old", false, "with --swap-rows, swap as 'projector rebuild --keep-old' does")
		o.log.register(fs)
		o.log.level = "warn"
		fs.Lookup("log-level").DefValue = "warn"
		return o
	},
	run: func(ctx context.Context, env *cmdEnv, opts any) error {
		o := opts.(*benchOpts)
		logger, err := o.log.logger(env.stderr)
		if err != nil {
			return err
		}
		url := o.databaseURL
		if url == "" {
			url = demo.LocalURL
		}
		if o.swapRows != 0 {
			if o.swapRows < 1 || o.swapDiffer < 0 || o.swapDiffer > 100 {
				return usagef("--swap-rows %d, --swap-differ-percent %d: want at least 1 row and a percentage from 0 to 100", o.swapRows, o.swapDiffer)
			}
			_, err := bench.Swap(ctx, bench.SwapConfig{DatabaseURL: url, Rows: o.swapRows, DifferPercent: o.swapDiffer,
				KeepOld: o.swapKeepOld, Readers: 4, Out: env.stdout})
			return err
		}
		switch {
		case o.events < 1000:
			return usagef("--events %d: must be at least 1000", o.events)
		case o.jobs < 1 || o.jobs > o.events:
			return usagef("--jobs %d: must be from 1 to --events", o.jobs)
		case o.partitions < 1 || o.partitions > 1000:
			return usagef("--partitions %d: must be from 1 to 1000", o.partitions)
		case o.sample < 100:
			return usagef("--per-event-sample %d: must be at least 100", o.sample)
		}
		_, err = bench.Run(ctx, bench.Config{
			DatabaseURL: url, Events: o.events, Jobs: o.jobs, Partitions: o.partitions, Seed: o.seed,
			PerEventSample: o.sample, Out: env.stdout, Logger: logger,
		})
		return err
	},
}

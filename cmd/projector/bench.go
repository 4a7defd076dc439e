package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/projector/projector/internal/app/bench"
	"github.com/projector/projector/internal/app/demo"
	"github.com/projector/projector/projection"
)

// defaultBenchJobs is --jobs unless given, for streams of 200,000 events
// or more.
const defaultBenchJobs = 50000

type benchOpts struct {
	// jobsSet says --jobs (or PROJECTOR_JOBS) was given.
	jobsSet     bool
	databaseURL string
	mix         string
	shape       string
	events      int
	jobs        int
	partitions  int
	stateBytes  int
	naive       int
	batchSize   int
	inFlight    int
	seed        uint64
	preload     int
	waiters     int
	live        bool
	rate        int
	duration    time.Duration
	rebuild     bool
	json        bool
	cpuProfile  string
	memProfile  string
	memory      memoryLimit
	swapRows    int
	swapDiffer  int
	swapKeepOld bool
	log         logFlags
}

var benchCommand = &command{
	name:    "bench",
	summary: "the throughput, growth, latency and rebuild benchmark, side by side with baselines",
	usage: `projector bench measures, in one run on this machine, how fast one generated
stream of job events reaches PostgreSQL through:

  raw COPY        binary COPY of every event into a table with no key and no
                  version check: the ceiling every other line is a ratio of
                  (run three times; the median counts, and every run is shown)
  naive           a kafka-go group Reader, one conditional upsert per event and
                  CommitMessages after each (a bounded sample: it is slow)
  pgx.Batch       pipelined single upserts, 1000 per transaction (--mix snapshots)
  projector       the engine end to end from a Kafka-protocol broker, timed to
                  the last stored position; the read model is then checked
                  exactly against the stream's reference (wrong: exit 1)

--mix picks the stream: snapshots (every event a whole state), deltas (every
job one snapshot, then deltas only) or mixed (mostly deltas, some snapshots).
--shape picks where a job's events sit: clustered (close together, about 64
jobs live at a time in a partition, so a batch folds many versions of a job) or
spread (each job's events evenly over its partition's whole log, as long-running
jobs side by side: most events meet a job not seen for a while). Late and
duplicate deliveries are included. The broker and the projector's measured run
(the empty table) run in child processes, so the projector's peak heap and RSS
are its own: none of the generated stream, the reference or the broker.

--preload N also runs the projector into a table already holding N rows and
reports its rate as a ratio of the empty table's (growth). --waiters N also runs
it while N waits are held on the instance, as N clients of /wait would be, and
reports its rate as a ratio of the run with none. --rebuild times
'projector rebuild' of the same stream. --live --rate R --duration D then
produces R events/s for D into a running projector and reports the time from
produce to visible (p50, p99, p99.9, max). --json prints one JSON object.

With --swap-rows N it measures instead how long the swap at the end of a
'projector rebuild' takes with N rows, and how readers querying the table
through a view fare before and during it (latencies, errors, and samples of
pg_stat_activity for readers waiting on a lock).

It works in a schema of its own and drops it at the end.

Examples:
  projector bench --mix mixed --events 2000000
  projector bench --mix mixed --shape spread --events 2000000 --jobs 200000
  projector bench --mix snapshots --events 2000000 --preload 10000000 --json
  projector bench --mix mixed --events 200000 --live --rate 10000 --duration 60s`,
	flags: func(fs *flag.FlagSet) any {
		o := &benchOpts{}
		fs.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL connection string (default: the local server on 127.0.0.1:5432)")
		fs.StringVar(&o.mix, "mix", bench.MixSnapshots, "events of the stream: "+strings.Join(bench.Mixes, ", "))
		fs.StringVar(&o.shape, "shape", bench.ShapeClustered, "where a job's events sit in the log: "+strings.Join(bench.Shapes, ", "))
		fs.IntVar(&o.events, "events", 200000, "events in the stream, about (jobs get a varying number each)")
		fs.IntVar(&o.jobs, "jobs", defaultBenchJobs, "`number` of distinct jobs the events are spread over")
		jobs := fs.Lookup("jobs")
		jobs.Value = setTracker{Value: jobs.Value, set: &o.jobsSet}
		jobs.DefValue = fmt.Sprintf("%d, or a quarter of --events when that is fewer", defaultBenchJobs)
		fs.IntVar(&o.partitions, "partitions", 6, "partitions of the benchmark topic")
		fs.IntVar(&o.stateBytes, "state-bytes", 0, "size of a job's state in bytes, about (padded with a field no delta touches;\n0 leaves the natural size, about 200 bytes)")
		fs.IntVar(&o.naive, "naive-sample", 2000, "events the naive consumer handles (its rate is measured on them)")
		fs.IntVar(&o.batchSize, "batch-size", projection.Config{}.WithDefaults().BatchSize, "the projector's most records per batch transaction")
		fs.IntVar(&o.inFlight, "batches-in-flight", 0, "the projector's most batches planned and written at once, as projector run's\n(0: its default; -1: no bound), in every run of it and in --rebuild's")
		fs.Uint64Var(&o.seed, "seed", 1, "seed of the generated stream")
		fs.IntVar(&o.preload, "preload", 0, "also run into a table already holding this many rows (growth)")
		fs.IntVar(&o.waiters, "waiters", 0, "also run the projector while this many /wait-like waits are held on jobs the\nstream never writes, and report its rate as a ratio of the run with none")
		fs.BoolVar(&o.live, "live", false, "also measure produce-to-visible latency at a steady --rate for --duration")
		fs.IntVar(&o.rate, "rate", 10000, "events per second produced with --live")
		fs.DurationVar(&o.duration, "duration", 60*time.Second, "how long --live produces, e.g. 60s")
		fs.BoolVar(&o.rebuild, "rebuild", false, "also time 'projector rebuild' of the same stream")
		fs.BoolVar(&o.json, "json", false, "print the report as one JSON object (progress goes to stderr)")
		fs.StringVar(&o.cpuProfile, "cpu-profile", "", "write a pprof CPU profile of the projector's run (empty table) to this file")
		fs.StringVar(&o.memProfile, "alloc-profile", "", "write a pprof allocation profile of the projector's run, taken when it has caught up\n(before it stops, so its heap in use is there too: -sample_index=inuse_space), to this file")
		fs.IntVar(&o.swapRows, "swap-rows", 0, "measure a rebuild's swap with this many rows instead of the throughput (0: the throughput)")
		fs.IntVar(&o.swapDiffer, "swap-differ-percent", 1, "with --swap-rows, the percentage of rows the rebuilt model changes")
		fs.BoolVar(&o.swapKeepOld, "swap-keep-old", false, "with --swap-rows, swap as 'projector rebuild --keep-old' does")
		o.memory.register(fs)
		fs.Lookup("memory-limit").Usage = "the soft memory limit of the projector's measured run, a `size`, off or\nauto, as projector run's, in its own process; the broker, the bench itself (the\ngrowth, waiters and live runs) and --rebuild's process take none of it"
		o.log.register(fs)
		o.log.level = "warn"
		fs.Lookup("log-level").DefValue = "warn"
		return o
	},
	run: func(ctx context.Context, env *cmdEnv, opts any) error {
		if os.Getenv(bench.BrokerChildEnv) != "" {
			return bench.ServeBroker(ctx, os.Stdin, env.stdout)
		}
		o := opts.(*benchOpts)
		logger, err := o.log.logger(env.stderr)
		if err != nil {
			return err
		}
		if spec := os.Getenv(bench.ProjectorChildEnv); spec != "" {
			// The measured run's process takes the limit `projector run`
			// would; the broker's and the bench's own processes set none
			// (GOMEMLIMIT in the environment reaches every process).
			o.memory.apply(logger, projection.DefaultCacheBytes)
			return bench.ServeProjector(ctx, spec, env.stdout, logger)
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
		if !o.jobsSet {
			// A short stream spreads over fewer jobs, as the default
			// 200,000 events do over 50,000 (4 each), rather than refuse.
			// A long one over enough jobs that none has more events
			// than the stream can make (bench.MaxEventsPerJob).
			o.jobs = max(min(defaultBenchJobs, o.events/4), (o.events+bench.MaxEventsPerJob-1)/bench.MaxEventsPerJob)
		}
		switch {
		case !contains(bench.Mixes, o.mix):
			return usagef("--mix %q: must be one of %s", o.mix, strings.Join(bench.Mixes, ", "))
		case !contains(bench.Shapes, o.shape):
			return usagef("--shape %q: must be one of %s", o.shape, strings.Join(bench.Shapes, ", "))
		case o.events < 1000:
			return usagef("--events %d: must be at least 1000", o.events)
		case o.jobs < 1 || o.jobs*3 > o.events:
			return usagef("--jobs %d: must be from 1 to a third of --events (every job has at least 3 events)", o.jobs)
		case o.events/o.jobs > bench.MaxEventsPerJob:
			return usagef("--jobs %d: at most %d events a job (--events %d needs --jobs %d or more): the stream makes each record by folding its job from its start",
				o.jobs, bench.MaxEventsPerJob, o.events, (o.events+bench.MaxEventsPerJob-1)/bench.MaxEventsPerJob)
		case o.partitions < 1 || o.partitions > 1000:
			return usagef("--partitions %d: must be from 1 to 1000", o.partitions)
		case o.stateBytes < 0 || o.stateBytes > 900_000:
			return usagef("--state-bytes %d: must be from 0 to 900000 (a record must fit the broker's 1 MiB)", o.stateBytes)
		case o.naive < 10:
			return usagef("--naive-sample %d: must be at least 10", o.naive)
		case o.inFlight < -1:
			return usagef("--batches-in-flight %d: want -1 (no bound), 0 (the default) or a bound", o.inFlight)
		case o.batchSize < 1:
			return usagef("--batch-size %d: must be at least 1", o.batchSize)
		case o.preload < 0:
			return usagef("--preload %d: must not be negative", o.preload)
		case o.waiters < 0 || o.waiters > 1_000_000:
			return usagef("--waiters %d: must be from 0 to 1000000", o.waiters)
		case o.live && o.rate < 1:
			return usagef("--rate %d: must be at least 1 event per second", o.rate)
		case o.live && o.duration < time.Second:
			return usagef("--duration %s: must be at least 1s, e.g. --duration 60s", o.duration)
		}
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("bench: finding this binary to start the broker process: %w", err)
		}
		progress := env.stdout
		if o.json {
			progress = env.stderr
		}
		cfg := bench.Config{
			DatabaseURL: url, Mix: o.mix, Shape: o.shape, Events: o.events, Jobs: o.jobs, Partitions: o.partitions, StateBytes: o.stateBytes,
			Seed: o.seed, NaiveSample: o.naive, BatchSize: o.batchSize, BatchesInFlight: o.inFlight, Preload: o.preload, Waiters: o.waiters,
			Live: o.live, LiveRate: o.rate, LiveDuration: o.duration, Rebuild: o.rebuild,
			Executable: self, ChildArgs: []string{"--log-level", o.log.level, "--log-format", o.log.format, "--memory-limit", o.memory.String()},
			CPUProfile: o.cpuProfile, AllocProfile: o.memProfile, Progress: progress, Logger: logger,
		}
		// The profiles are written by the projector's process: a file
		// that cannot be created is refused here, before the run.
		for _, path := range []string{o.cpuProfile, o.memProfile} {
			if path == "" {
				continue
			}
			f, err := os.Create(path)
			if err != nil {
				return usagef("profile file: %v", err)
			}
			f.Close()
		}
		rep, err := bench.Run(ctx, cfg)
		var wrong *bench.MismatchError
		if errors.As(err, &wrong) {
			return fmt.Errorf("%w: the run is a failure, however fast", err)
		}
		if err != nil {
			return err
		}
		if o.json {
			return bench.JSON(env.stdout, rep)
		}
		bench.Print(env.stdout, rep)
		return nil
	},
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

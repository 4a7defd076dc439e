package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"time"

	"github.com/projector/projector/internal/app/demo"
)

type demoOpts struct {
	databaseURL string
	seed        uint64
	jobs        int
	events      int
	partitions  int
	keep        bool
	timeout     time.Duration
	log         logFlags
	source      string
}

var demoCommand = &command{
	name:    "demo",
	summary: "the whole story on one machine: broker, faulty stream, authority, projection, verification",
	usage: `projector demo needs no set-up. It starts an in-process Kafka broker and a
trusted snapshot authority, generates a job event stream with late, duplicate,
missing, misrouted and bad events, projects it with the same engine as
'projector run' into PostgreSQL, and checks every job's row against the
reference model. It exits 0 only if every job matches.

With --source sqs the stream goes through a FIFO queue on an SQS emulator
(fauxqs, run with Node.js from the repository's node_modules: npm ci), one
message group per job, and the engine reads it as 'projector run --source sqs'
does.

PostgreSQL: --database-url / DATABASE_URL if set, else the local server on
127.0.0.1:5432 if it answers, else a throwaway cluster started from the
PostgreSQL binaries on this machine and removed at the end. The demo works in
a schema of its own and drops it unless --keep.

Example:
  go run ./cmd/projector demo --jobs 500 --seed 7
  go run ./cmd/projector demo --source sqs --jobs 200 --seed 7`,
	flags: func(fs *flag.FlagSet) any {
		o := &demoOpts{}
		fs.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL connection string (default: the local server, else a throwaway cluster)")
		fs.Uint64Var(&o.seed, "seed", 1, "seed of the generated stream: the same seed gives the same records, faults, applied and\nquarantined counts and final read model (gap closings between partitions depend on timing)")
		fs.IntVar(&o.jobs, "jobs", 2000, "number of jobs")
		fs.IntVar(&o.events, "events-per-job", 20, "events per job, about")
		fs.IntVar(&o.partitions, "partitions", 6, "partitions of the demo topic")
		fs.BoolVar(&o.keep, "keep", false, "keep the demo's schema (and print its name) instead of dropping it")
		fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "give up waiting for the projection after this long")
		fs.StringVar(&o.source, "source", sourceKafka, "kafka (an in-process broker) or sqs (a FIFO queue on the SQS emulator)")
		o.log.register(fs)
		o.log.level = "warn"
		fs.Lookup("log-level").DefValue = "warn"
		return o
	},
	run: func(ctx context.Context, env *cmdEnv, opts any) error {
		o := opts.(*demoOpts)
		logger, err := o.log.logger(env.stderr)
		if err != nil {
			return err
		}
		switch {
		case o.jobs < 1 || o.jobs > 1_000_000:
			return usagef("--jobs %d: must be from 1 to 1000000", o.jobs)
		case o.events < 3 || o.events > 1000:
			return usagef("--events-per-job %d: must be from 3 to 1000", o.events)
		case o.partitions < 1 || o.partitions > 1000:
			return usagef("--partitions %d: must be from 1 to 1000", o.partitions)
		}
		if err := positive("timeout", o.timeout); err != nil {
			return err
		}
		if o.source != sourceKafka && o.source != sourceSQS {
			return usagef("--source %q: want kafka or sqs", o.source)
		}
		sum, err := demo.Run(ctx, demo.Config{
			Seed: o.seed, Jobs: o.jobs, EventsPerJob: o.events, Partitions: o.partitions,
			DatabaseURL: o.databaseURL, Keep: o.keep, Timeout: o.timeout,
			Progress: isTerminal(env.stdout), Out: env.stdout, Logger: logger, Source: o.source,
		})
		if err != nil {
			return err
		}
		if o.keep {
			logger.Warn("kept the demo schema", "schema", sum.Schema)
			env.stdout.Write([]byte("kept schema " + sum.Schema + "\n"))
		}
		if !sum.OK() {
			return errors.New("the read model does not match the reference model")
		}
		return nil
	},
}

func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

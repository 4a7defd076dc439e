package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/projector/projector/projection"
	kafkasrc "github.com/projector/projector/source/kafka"
	"github.com/projector/projector/store"
)

type resetOpts struct {
	databaseURL string
	schema      string
	table       string
	brokers     listFlag
	topic       string
	to          string
	partitions  listFlag
	newLog      bool
	kafka       kafkaFlags
}

var resetPositionsCommand = &command{
	name:    "reset-positions",
	summary: "move partitions' stored positions to the log's start or end, an operator's choice",
	usage: `projector reset-positions moves the stored position of the projection's
partitions to where their log begins now (--to earliest: everything is read
again; the version rules drop what was applied as duplicate or stale) or ends
now (--to latest: every record before the end is skipped, and each skipped
range is printed). Each partition's epoch moves on, so an instance working it
is fenced, claims it again and reads from the new position: it is safe to run
while instances run.

A partition whose topic was deleted and recreated is found by 'run' by itself
and read from the new log's start; use this command to choose otherwise, or for
a position stored by an earlier version that kept no record to compare. With
--new-log the log is taken for a new one: the quarantined records of the old
one are renamed to the topic "<topic>~log<n>", so that the new log's records at
the same offsets are quarantined beside them.

Example:
  DATABASE_URL=postgres://app@db:5432/app projector reset-positions --brokers kafka-1:9092 --to latest --partitions 0,3`,
	flags: func(fs *flag.FlagSet) any {
		o := &resetOpts{}
		registerStoreFlags(fs, &o.databaseURL, &o.schema, &o.table)
		fs.Var(&o.brokers, "brokers", "Kafka bootstrap brokers, comma-separated host:port (required)")
		fs.StringVar(&o.topic, "topic", projection.Config{}.WithDefaults().Topic, "topic whose partitions to move")
		fs.StringVar(&o.to, "to", "", "where the positions go: earliest (the log's start) or latest (its end) (required)")
		fs.Var(&o.partitions, "partitions", "partitions to move, comma-separated (default: every partition of the topic)")
		fs.BoolVar(&o.newLog, "new-log", false, "the topic was recreated: keep the old log's quarantined records apart")
		o.kafka.register(fs)
		return o
	},
	run: func(ctx context.Context, env *cmdEnv, opts any) error {
		o := opts.(*resetOpts)
		if o.to != "earliest" && o.to != "latest" {
			return usagef("--to %q: want earliest or latest", o.to)
		}
		if err := checkBrokers(o.brokers); err != nil {
			return err
		}
		if o.topic == "" {
			return usagef("--topic must not be empty")
		}
		var only []int
		for _, s := range o.partitions {
			p, err := strconv.Atoi(s)
			if err != nil || p < 0 {
				return usagef("--partitions %q: want partition numbers, e.g. --partitions 0,3", s)
			}
			only = append(only, p)
		}
		k, err := o.kafka.apply(o.brokers)
		if err != nil {
			return err
		}
		st, err := openProjection(ctx, o.databaseURL, store.Config{Schema: o.schema, Table: o.table}, migrated)
		if err != nil {
			return err
		}
		defer st.Close()
		kctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		ends, err := kafkasrc.LogEnds(kctx, k, o.topic)
		var parts []int
		if err == nil {
			for p := range ends {
				if len(only) == 0 || slices.Contains(only, p) {
					parts = append(parts, p)
				}
			}
			slices.Sort(parts)
			for _, p := range only {
				if _, ok := ends[p]; !ok {
					err = usagef("--partitions: %s has no partition %d", o.topic, p)
				}
			}
		}
		var starts map[int]int64
		if err == nil {
			starts, err = kafkasrc.LogStarts(kctx, k, o.topic, parts)
		}
		cancel()
		if err != nil {
			return err
		}
		host, _ := os.Hostname()
		owner := fmt.Sprintf("reset-positions %s/%d", host, os.Getpid())
		for _, p := range parts {
			next := starts[p]
			if o.to == "latest" {
				// Reading committed, the last stable offset: what a
				// transaction open now wrote is read once it commits.
				next = ends[p].End
			}
			was, err := st.ResetPosition(ctx, o.topic, p, next, owner, o.newLog)
			if err != nil {
				return err
			}
			from := max(was, starts[p])
			switch {
			case was > ends[p].HighWatermark:
				fmt.Fprintf(env.stdout, "partition %d: %d -> %d (the stored position was past the log's end %d: another log)\n", p, was, next, ends[p].HighWatermark)
			case next > from:
				fmt.Fprintf(env.stdout, "partition %d: %d -> %d: offsets %d to %d skipped (%d records)\n", p, was, next, from, next-1, next-from)
			case was > next:
				fmt.Fprintf(env.stdout, "partition %d: %d -> %d: offsets %d to %d read again\n", p, was, next, next, was-1)
			default:
				fmt.Fprintf(env.stdout, "partition %d: %d -> %d\n", p, was, next)
			}
		}
		return nil
	},
}

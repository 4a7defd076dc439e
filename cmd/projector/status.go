package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/projector/projector/projection"
	kafkasrc "github.com/projector/projector/source/kafka"
	sqssrc "github.com/projector/projector/source/sqs"
	"github.com/projector/projector/store"
)

type statusOpts struct {
	databaseURL string
	schema      string
	table       string
	brokers     listFlag
	topic       string
	json        bool
	limit       int
	kafka       kafkaFlags
	// sqs is the queue whose counts to report, with --sqs-queue-url.
	sqs sqsFlags
}

// statusReport is what `projector status --json` prints.
type statusReport struct {
	Projection string              `json:"projection"`
	Schema     string              `json:"schema"`
	Partitions []partitionReport   `json:"partitions"`
	Lag        *int64              `json:"lag,omitempty"`
	HeldJobs   int                 `json:"held_jobs"`
	Held       []store.HeldSummary `json:"held"`
	Quarantine int                 `json:"quarantined"`
	Recent     []quarantineReport  `json:"recent_quarantine"`
	Jobs       int64               `json:"jobs"`
	// DeletedJobs counts the tombstones: jobs deleted and remembered so
	// that no late event brings them back.
	DeletedJobs int64 `json:"deleted_jobs"`
	// SQS is the queue's approximate counts, with --sqs-queue-url; their
	// sum is then Lag.
	SQS *queueReport `json:"sqs,omitempty"`
	// Isolation and LagMeasuredTo, with --brokers, say how transactions
	// are read and what the lag is measured to: the last stable offset
	// reading committed, the high watermark reading uncommitted.
	Isolation     string `json:"isolation,omitempty"`
	LagMeasuredTo string `json:"lag_measured_to,omitempty"`
}

type queueReport struct {
	QueueURL string `json:"queue_url"`
	projection.SQSCounts
}

type partitionReport struct {
	store.Position
	HighWatermark *int64 `json:"high_watermark,omitempty"`
	LastStable    *int64 `json:"last_stable_offset,omitempty"`
	Lag           *int64 `json:"lag,omitempty"`
	// OpenTransaction, reading committed, is the offset of the transaction
	// still open the partition waits on: its position is at the last
	// stable offset and records follow it.
	OpenTransaction *int64 `json:"open_transaction,omitempty"`
}

type quarantineReport struct {
	Topic     string    `json:"topic"`
	Partition int       `json:"partition"`
	Offset    int64     `json:"offset"`
	Key       string    `json:"key"`
	Error     string    `json:"error"`
	CreatedAt time.Time `json:"time"`
	// MessageID and SequenceNumber name an SQS message.
	MessageID      string `json:"message_id,omitempty"`
	SequenceNumber string `json:"sequence_number,omitempty"`
}

var statusCommand = &command{
	name:    "status",
	summary: "positions, lag, held gaps and quarantine counts (--json for machines)",
	usage: `projector status reads the projection's state from PostgreSQL: each partition's
next offset, epoch and owner, the jobs held behind a gap (with the versions
they hold and since when), and the quarantine. With --brokers it also asks Kafka
for where each log ends and reports the lag of every partition (to the last
stable offset with --kafka-isolation read_committed, the default: a
transaction still open is waited on, not lag; to the high watermark with
read_uncommitted); with
--sqs-queue-url (a projection fed by 'run --source sqs') it asks the queue for
its approximate visible and in-flight messages, which are the lag.

It only reads: it runs no migration, creates and alters nothing (its
transactions are read-only), and a projection that does not exist is an error
(exit 1), not an empty one. Text from records (job ids, keys, errors) is
printed with control characters escaped.

Example:
  DATABASE_URL=postgres://app@db:5432/app projector status --brokers kafka-1:9092`,
	flags: func(fs *flag.FlagSet) any {
		o := &statusOpts{}
		registerStoreFlags(fs, &o.databaseURL, &o.schema, &o.table)
		fs.Var(&o.brokers, "brokers", "Kafka brokers, comma-separated host:port; with them the lag is reported")
		fs.StringVar(&o.topic, "topic", projection.Config{}.WithDefaults().Topic, "topic whose lag to report")
		fs.BoolVar(&o.json, "json", false, "print JSON instead of tables")
		fs.IntVar(&o.limit, "limit", 20, "most held jobs and quarantined records to list")
		o.kafka.register(fs)
		o.sqs.registerQueue(fs, "the queue of a projection fed by 'run --source sqs', to report its\napproximate visible and in-flight messages as the lag, e.g.", "with --sqs-queue-url: ")
		// The receive settings only pass validation.
		o.sqs.wait, o.sqs.visibility, o.sqs.maxMessages = projection.DefaultSQSWait, projection.DefaultSQSVisibility, projection.DefaultSQSMaxMessages
		return o
	},
	run: func(ctx context.Context, env *cmdEnv, opts any) error {
		o := opts.(*statusOpts)
		if o.limit < 0 {
			return usagef("--limit %d: must not be negative", o.limit)
		}
		if len(o.brokers) > 0 {
			if err := checkBrokers(o.brokers); err != nil {
				return err
			}
		}
		if err := checkStoreNames(o.schema, o.table); err != nil {
			return err
		}
		if o.sqs.queueURL != "" {
			o.sqs.source = sourceSQS
			if err := o.sqs.validate(); err != nil {
				return err
			}
		}
		st, err := openProjection(ctx, o.databaseURL, store.Config{Schema: o.schema, Table: o.table}, readOnly)
		if err != nil {
			return err
		}
		defer st.Close()
		rep, err := buildStatus(ctx, st, o)
		if err != nil {
			return err
		}
		if o.json {
			enc := json.NewEncoder(env.stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(rep)
		}
		printStatus(env, rep)
		return nil
	},
}

func buildStatus(ctx context.Context, st *store.Store, o *statusOpts) (*statusReport, error) {
	rep := &statusReport{Projection: st.Projection(), Schema: o.schema, Partitions: []partitionReport{}, Held: []store.HeldSummary{}, Recent: []quarantineReport{}}
	pos, err := st.Positions(ctx)
	if err != nil {
		return nil, err
	}
	var ends map[int]projection.LogEnd
	if len(o.brokers) > 0 {
		hctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		k, kerr := o.kafka.apply(o.brokers)
		if kerr != nil {
			cancel()
			return nil, kerr
		}
		ends, err = kafkasrc.LogEnds(hctx, k, o.topic)
		cancel()
		if err != nil {
			return nil, err
		}
		rep.Isolation, rep.LagMeasuredTo = k.Isolation, "high_watermark"
		if k.Isolation == projection.ReadCommitted {
			rep.LagMeasuredTo = "last_stable_offset"
		}
		var total int64
		rep.Lag = &total
		seen := map[int]bool{}
		for _, p := range pos {
			if p.Topic == o.topic {
				seen[p.Partition] = true
			}
		}
		// Partitions never projected lag by their whole length.
		for p := range ends {
			if !seen[p] {
				pos = append(pos, store.Position{Topic: o.topic, Partition: p, NextOffset: -1})
			}
		}
		sort.Slice(pos, func(i, j int) bool {
			if pos[i].Topic != pos[j].Topic {
				return pos[i].Topic < pos[j].Topic
			}
			return pos[i].Partition < pos[j].Partition
		})
	}
	for _, p := range pos {
		pr := partitionReport{Position: p}
		if e, ok := ends[p.Partition]; ok && p.Topic == o.topic {
			lag := max(e.End-max(p.NextOffset, 0), 0)
			pr.HighWatermark, pr.LastStable, pr.Lag = &e.HighWatermark, &e.LastStable, &lag
			if k := rep.Isolation; k == projection.ReadCommitted && p.NextOffset >= e.LastStable && e.LastStable < e.HighWatermark {
				pr.OpenTransaction = &e.LastStable
			}
			*rep.Lag += lag
		}
		rep.Partitions = append(rep.Partitions, pr)
	}
	if o.sqs.queueURL != "" {
		qctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		n, err := sqssrc.QueueCounts(qctx, o.sqs.config())
		cancel()
		if err != nil {
			return nil, err
		}
		rep.SQS = &queueReport{QueueURL: o.sqs.queueURL, SQSCounts: n}
		lag := n.Visible + n.InFlight
		rep.Lag = &lag
	}
	held, total, err := st.HeldJobs(ctx, o.limit)
	if err != nil {
		return nil, err
	}
	rep.HeldJobs = total
	if held != nil {
		rep.Held = held
	}
	q, qtotal, err := st.Quarantine(ctx, o.limit)
	if err != nil {
		return nil, err
	}
	rep.Quarantine = qtotal
	for _, r := range q {
		rep.Recent = append(rep.Recent, quarantineReport{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
			Key: string(r.Key), Error: r.Error, CreatedAt: r.CreatedAt,
			MessageID: r.Coordinate.MessageID, SequenceNumber: r.Coordinate.SequenceNumber})
	}
	if rep.Jobs, err = st.CountJobs(ctx); err != nil {
		return nil, err
	}
	if rep.DeletedJobs, err = st.CountTombstones(ctx); err != nil {
		return nil, err
	}
	return rep, nil
}

func printStatus(env *cmdEnv, rep *statusReport) {
	w := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "projection %s.%s: %d jobs, %d deleted (tombstones)\n\n", rep.Schema, rep.Projection, rep.Jobs, rep.DeletedJobs)
	if len(rep.Partitions) == 0 {
		fmt.Fprintln(w, "no partition has been claimed yet")
	} else {
		fmt.Fprintln(w, "TOPIC\tPARTITION\tNEXT OFFSET\tHIGH WATERMARK\tLAST STABLE\tLAG\tEPOCH\tOWNER\tUPDATED")
		for _, p := range rep.Partitions {
			hw, stable, lag := "-", "-", "-"
			if p.HighWatermark != nil {
				hw, stable, lag = fmt.Sprint(*p.HighWatermark), fmt.Sprint(*p.LastStable), fmt.Sprint(*p.Lag)
			}
			position := fmt.Sprint(p.NextOffset)
			if p.NextOffset < 0 {
				position = "none"
			}
			updated := "-"
			if !p.UpdatedAt.IsZero() {
				updated = p.UpdatedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", printable(p.Topic), p.Partition, position, hw, stable, lag, p.Epoch, printable(p.Owner), updated)
		}
		for _, p := range rep.Partitions {
			if p.OpenTransaction != nil {
				fmt.Fprintf(w, "partition %d waits on a transaction still open at offset %d: every record before it is projected; %d offsets after it are read once it commits or is aborted\n",
					p.Partition, *p.OpenTransaction, *p.HighWatermark-*p.OpenTransaction)
			}
		}
	}
	if rep.SQS != nil {
		fmt.Fprintf(w, "queue %s: %d visible, %d in flight\n", printable(rep.SQS.QueueURL), rep.SQS.Visible, rep.SQS.InFlight)
	}
	if rep.Lag != nil {
		fmt.Fprintf(w, "total lag: %d", *rep.Lag)
		if rep.LagMeasuredTo != "" {
			fmt.Fprintf(w, " (to the %s: --kafka-isolation %s)", strings.ReplaceAll(rep.LagMeasuredTo, "_", " "), rep.Isolation)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\nheld jobs: %d\n", rep.HeldJobs)
	if len(rep.Held) > 0 {
		fmt.Fprintln(w, "JOB\tTOPIC/PARTITION\tROW VERSION\tMISSING\tHELD VERSIONS\tSINCE")
		for _, h := range rep.Held {
			fmt.Fprintf(w, "%s\t%s/%d\t%d\t%v\t%v\t%s\n", printable(h.JobID), printable(h.Topic), h.Partition, h.RowVersion, h.Missing, h.Versions, h.Since.UTC().Format(time.RFC3339))
		}
	}
	fmt.Fprintf(w, "\nquarantined records: %d\n", rep.Quarantine)
	if len(rep.Recent) > 0 {
		fmt.Fprintln(w, "TOPIC/PARTITION@OFFSET\tKEY\tERROR")
		for _, q := range rep.Recent {
			where := fmt.Sprintf("%s/%d@%d", printable(q.Topic), q.Partition, q.Offset)
			if q.MessageID != "" {
				where = fmt.Sprintf("%s message %s seq %s", printable(q.Topic), printable(q.MessageID), printable(q.SequenceNumber))
			}
			fmt.Fprintf(w, "%s\t%s\t%s\n", where, strconv.QuoteToGraphic(q.Key), printable(q.Error))
		}
	}
	w.Flush()
}

package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector/projector/event"
	"github.com/projector/projector/internal/broker"
	"github.com/projector/projector/internal/jobgen"
	"github.com/projector/projector/projection"
	"github.com/projector/projector/store"
)

// Config shapes a run.
type Config struct {
	DatabaseURL string
	Events      int // snapshot events in the main stream
	Jobs        int
	Partitions  int
	Seed        uint64
	// PerEventSample bounds the slow one-upsert-per-event baseline.
	PerEventSample int
	Out            io.Writer
	Logger         *slog.Logger
}

// Result is one measured line.
type Result struct {
	Name    string
	Events  int
	Elapsed time.Duration
	Note    string
}

// Rate is events per second.
func (r Result) Rate() float64 { return float64(r.Events) / r.Elapsed.Seconds() }

// Run measures every line and prints the table.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return nil, fmt.Errorf("bench: connect: %w", err)
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	schema := "projector_bench_" + hex.EncodeToString(rnd[:])
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, err
	}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE")

	perJob := max(cfg.Events/cfg.Jobs, 1)
	stream := jobgen.Generate(jobgen.Config{Seed: cfg.Seed, Jobs: cfg.Jobs, EventsPerJob: perJob, Partitions: cfg.Partitions, SnapshotsOnly: true, LateRate: 0.2, DuplicateRate: 0.1})
	evs := make([]event.Event, 0, len(stream.Records))
	for _, r := range stream.Records {
		ev, err := event.Decode(r.Key, r.Value)
		if err != nil {
			return nil, err
		}
		evs = append(evs, ev)
	}
	fmt.Fprintf(cfg.Out, "projector bench: %d snapshot events for %d jobs (late and duplicate deliveries included), %d partitions, %d CPUs\n",
		len(evs), cfg.Jobs, cfg.Partitions, runtime.NumCPU())

	var results []Result
	add := func(r Result, err error) error {
		if err != nil {
			return fmt.Errorf("bench: %s: %w", r.Name, err)
		}
		results = append(results, r)
		fmt.Fprintf(cfg.Out, "  %-44s %8.0f events/s\n", r.Name, r.Rate())
		return nil
	}
	if err := add(rawCopy(ctx, pool, schema, evs)); err != nil {
		return nil, err
	}
	if err := add(perEvent(ctx, pool, schema, evs[:min(len(evs), cfg.PerEventSample)])); err != nil {
		return nil, err
	}
	if err := add(batchedSingles(ctx, pool, schema, evs)); err != nil {
		return nil, err
	}
	if err := add(projector(ctx, cfg, pool, schema, "projector, snapshots (Kafka to PostgreSQL)", stream)); err != nil {
		return nil, err
	}
	mixed := jobgen.Generate(jobgen.Config{Seed: cfg.Seed, Jobs: cfg.Jobs, EventsPerJob: max(perJob, 3), Partitions: cfg.Partitions,
		LateRate: 0.1, DuplicateRate: 0.1})
	if err := add(projector(ctx, cfg, pool, schema, "projector, snapshots + deltas (Kafka to PostgreSQL)", mixed)); err != nil {
		return nil, err
	}
	print(cfg.Out, results)
	return results, nil
}

func print(out io.Writer, rs []Result) {
	base := rs[0].Rate()
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(out)
	fmt.Fprintln(w, "WRITER\tEVENTS\tSECONDS\tEVENTS/S\tx RAW COPY\tNOTE")
	for _, r := range rs {
		fmt.Fprintf(w, "%s\t%d\t%.2f\t%.0f\t%.2f\t%s\n", r.Name, r.Events, r.Elapsed.Seconds(), r.Rate(), r.Rate()/base, r.Note)
	}
	w.Flush()
}

func table(ctx context.Context, pool *pgxpool.Pool, schema, name string) (string, error) {
	t := pgx.Identifier{schema, name}.Sanitize()
	_, err := pool.Exec(ctx, `CREATE TABLE `+t+` (job_id text PRIMARY KEY, version bigint NOT NULL, state jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())`)
	return t, err
}

// rawCopy is the ceiling: binary COPY of every event into a table with no
// key, no version check, nothing but the bytes.
func rawCopy(ctx context.Context, pool *pgxpool.Pool, schema string, evs []event.Event) (Result, error) {
	r := Result{Name: "raw COPY (no versions, no key: the ceiling)", Events: len(evs)}
	t := pgx.Identifier{schema, "raw_copy"}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+t.Sanitize()+` (job_id text, version bigint, state jsonb)`); err != nil {
		return r, err
	}
	start := time.Now()
	_, err := pool.CopyFrom(ctx, t, []string{"job_id", "version", "state"}, pgx.CopyFromSlice(len(evs), func(i int) ([]any, error) {
		return []any{evs[i].JobID, evs[i].Version, string(evs[i].State)}, nil
	}))
	r.Elapsed = time.Since(start)
	return r, err
}

const guarded = ` AS t (job_id, version, state) VALUES ($1, $2, $3::jsonb)
	ON CONFLICT (job_id) DO UPDATE SET version = excluded.version, state = excluded.state, updated_at = now()
	WHERE t.version < excluded.version`

// perEvent is the common first try: one autocommit, version-guarded upsert
// per event (a sample, the rate extrapolates).
func perEvent(ctx context.Context, pool *pgxpool.Pool, schema string, evs []event.Event) (Result, error) {
	r := Result{Name: "one upsert per event, autocommit", Events: len(evs), Note: fmt.Sprintf("sample of %d events", len(evs))}
	t, err := table(ctx, pool, schema, "per_event")
	if err != nil {
		return r, err
	}
	start := time.Now()
	for _, ev := range evs {
		if _, err := pool.Exec(ctx, `INSERT INTO `+t+guarded, ev.JobID, ev.Version, string(ev.State)); err != nil {
			return r, err
		}
	}
	r.Elapsed = time.Since(start)
	return r, nil
}

// batchedSingles pipelines single upserts, 1000 to a transaction.
func batchedSingles(ctx context.Context, pool *pgxpool.Pool, schema string, evs []event.Event) (Result, error) {
	r := Result{Name: "pgx.Batch of single upserts, 1000 per tx", Events: len(evs)}
	t, err := table(ctx, pool, schema, "batched")
	if err != nil {
		return r, err
	}
	start := time.Now()
	for i := 0; i < len(evs); i += 1000 {
		b := &pgx.Batch{}
		for _, ev := range evs[i:min(i+1000, len(evs))] {
			b.Queue(`INSERT INTO `+t+guarded, ev.JobID, ev.Version, string(ev.State))
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() }); err != nil {
			return r, err
		}
	}
	r.Elapsed = time.Since(start)
	return r, nil
}

// projector runs the real engine from an in-process broker, timing from
// start to every partition's stored position at its high watermark.
func projector(ctx context.Context, cfg Config, pool *pgxpool.Pool, schema, name string, stream *jobgen.Stream) (Result, error) {
	r := Result{Name: name, Events: len(stream.Records), Note: "end to end: fetch, decode, fold, write, commit"}
	cluster, err := broker.Start()
	if err != nil {
		return r, err
	}
	defer cluster.Close()
	topic := "bench"
	if err := cluster.CreateTopic(ctx, topic, cfg.Partitions); err != nil {
		return r, err
	}
	recs := make([]broker.Record, len(stream.Records))
	for i, x := range stream.Records {
		recs[i] = broker.Record{Partition: x.Partition, Key: x.Key, Value: x.Value}
	}
	if _, err := cluster.Produce(ctx, topic, recs...); err != nil {
		return r, err
	}
	hwm, err := cluster.HighWatermarks(ctx, topic)
	if err != nil {
		return r, err
	}
	st, err := store.New(pool, store.Config{Schema: schema, Table: fmt.Sprintf("jobs_%d", time.Now().UnixNano()%1e6)})
	if err != nil {
		return r, err
	}
	if err := st.Migrate(ctx); err != nil {
		return r, err
	}
	p, err := projection.New(projection.Config{
		Brokers: cluster.Addrs(), Topic: topic, Group: "bench-" + st.Projection(), Store: st, Logger: cfg.Logger,
		BatchSize: 5000, BatchLinger: 10 * time.Millisecond, MaxWait: 250 * time.Millisecond,
		HeartbeatInterval: broker.GroupHeartbeatInterval, SessionTimeout: broker.GroupSessionTimeout,
		RebalanceTimeout: broker.GroupRebalanceTimeout, JoinGroupBackoff: broker.GroupJoinBackoff,
		PartitionWatchInterval: broker.GroupPartitionWatchInterval, GapWait: time.Second,
	})
	if err != nil {
		return r, err
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- p.Run(rctx) }()
	defer func() { stop(); <-done }()
	for {
		pos, err := st.Positions(ctx)
		if err != nil {
			return r, err
		}
		caught := len(pos) > 0
		have := map[int]int64{}
		for _, ps := range pos {
			have[ps.Partition] = ps.NextOffset
		}
		for part, h := range hwm {
			if h > 0 && have[part] != h {
				caught = false
			}
		}
		if caught {
			r.Elapsed = time.Since(start)
			return r, nil
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case err := <-done:
			return r, fmt.Errorf("engine stopped: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/projector/projector/event"
	"github.com/projector/projector/internal/app/broker"
	"github.com/projector/projector/internal/app/jobgen"
	"github.com/projector/projector/projection"
	"github.com/projector/projector/store"
)

// Mixes of events a stream can have.
const (
	MixSnapshots = "snapshots" // every event a full snapshot
	MixDeltas    = "deltas"    // every job one snapshot, then deltas only
	MixMixed     = "mixed"     // the demo's shape: mostly deltas, some snapshots
)

// Mixes lists the mixes in the order --help shows them.
var Mixes = []string{MixSnapshots, MixDeltas, MixMixed}

// Shapes of a stream, as the generator has them: a job's events close
// together (clustered) or spread over the whole log (spread).
const (
	ShapeClustered = jobgen.ShapeClustered
	ShapeSpread    = jobgen.ShapeSpread
)

// Shapes lists the shapes in the order --help shows them.
var Shapes = jobgen.Shapes

// Config shapes a run.
type Config struct {
	DatabaseURL string
	Mix         string
	// Shape is where a job's events sit in the log: ShapeClustered (the
	// default) or ShapeSpread.
	Shape      string
	Events     int // events in the stream, about (jobs get a varying number each)
	Jobs       int
	Partitions int
	// StateBytes pads each job's state to about this size (0: natural).
	StateBytes int
	Seed       uint64
	// NaiveSample bounds the naive consumer's line: it is slow.
	NaiveSample int
	// BatchSize is the projector's batch size.
	BatchSize int
	// BatchesInFlight is the projector's bound on batches planned and
	// written at once (0: its default), in every run of it.
	BatchesInFlight int
	// Preload, when above zero, also runs the projector against a table
	// already holding that many rows, beside the run on an empty table.
	Preload int
	// Waiters, when above zero, also runs the projector on an empty
	// table while that many waits are held on jobs the stream never
	// writes (as clients of /wait on the instance would), beside the run
	// with none.
	Waiters int
	// Live runs a steady produce rate after the throughput lines.
	Live         bool
	LiveRate     int
	LiveDuration time.Duration
	// Rebuild times `projector rebuild` of the stream (needs Executable).
	Rebuild bool
	// Executable is the projector binary: it runs the broker and the
	// projector's measured run (on the empty table) in child processes,
	// so the projector's memory is measured alone, and the rebuild. Empty
	// runs both in this process (tests).
	Executable string
	// ChildArgs are the arguments after "bench" the projector's child
	// process gets (its log flags).
	ChildArgs []string
	// CPUProfile and AllocProfile, when set, name files that receive pprof
	// profiles of the projector's run on the empty table: CPU during it,
	// and allocations (with the heap in use) at its end, before the engine
	// stops.
	CPUProfile, AllocProfile string
	// Progress receives one line per measured writer as it finishes.
	Progress io.Writer
	Logger   *slog.Logger

	// tamper, in tests, changes the read model after the projector's run
	// and before it is checked.
	tamper func(ctx context.Context, pool *pgxpool.Pool, table string) error
	// checkChunk is how many jobs one query of the check compares
	// (default 100,000; tests make it small to cross chunks).
	checkChunk int
}

// Writer is one measured line.
type Writer struct {
	Name            string  `json:"name"`
	Events          int     `json:"events"`
	Seconds         float64 `json:"seconds"`
	EventsPerSecond float64 `json:"events_per_second"`
	RatioToCopy     float64 `json:"ratio_to_copy"`
	Note            string  `json:"note,omitempty"`
	// WALBytes is the write-ahead log the server wrote during the run, and
	// BlocksRead the table's and its indexes' blocks read into shared
	// buffers (not found there), for the projector's lines: what a growing
	// table costs shows in them.
	WALBytes   int64 `json:"wal_bytes,omitempty"`
	BlocksRead int64 `json:"blocks_read,omitempty"`
}

// Report is everything one run measured; its JSON is `projector bench --json`.
type Report struct {
	Mix       string `json:"mix"`
	Shape     string `json:"shape"`
	Events    int    `json:"events"`
	Jobs      int    `json:"jobs"`
	BatchSize int    `json:"batch_size"`
	// BatchesInFlight is the projector's bound on batches planned and
	// written at once (its default when not given, as the measured run
	// took it; -1: none).
	BatchesInFlight int `json:"batches_in_flight"`
	// MemoryLimitBytes is the soft memory limit of the measured run's
	// process (0: none).
	MemoryLimitBytes         int64   `json:"memory_limit_bytes"`
	DistinctJobsPerBatch     float64 `json:"distinct_jobs_per_batch"`
	DistinctJobsPerBatchHow  string  `json:"distinct_jobs_per_batch_how"`
	Partitions               int     `json:"partitions"`
	StateBytes               int     `json:"state_bytes"`
	MeanStateBytes           int     `json:"mean_state_bytes"`
	CPUs                     int     `json:"cpus"`
	ProjectorEventsPerSecond float64 `json:"projector_events_per_second"`
	ProjectorRatioToCopy     float64 `json:"projector_ratio_to_copy"`
	ProjectorRatioToNaive    float64 `json:"projector_ratio_to_naive"`
	// ProjectorRatioToKeyed is the projector's rate over the keyed
	// ceiling's ([keyedUpserts]): how near it comes to writing only rows.
	ProjectorRatioToKeyed float64 `json:"projector_ratio_to_keyed"`
	PeakHeapBytes         int64   `json:"peak_heap_bytes"`
	// PeakLiveHeapBytes is the largest live heap a collection marked:
	// what --cache-bytes and the batches in flight bound.
	PeakLiveHeapBytes         int64    `json:"peak_live_heap_bytes"`
	PeakRSSBytes              int64    `json:"peak_rss_bytes"`
	HeapBeforeBytes           int64    `json:"heap_before_bytes"`
	Projector                 string   `json:"projector"`
	Broker                    string   `json:"broker"`
	BrokerPeakRSSBytes        int64    `json:"broker_peak_rss_bytes,omitempty"`
	BenchPeakRSSBytes         int64    `json:"bench_peak_rss_bytes"` // this process's own; see notePeakRSS
	Checked                   string   `json:"checked"`
	Writers                   []Writer `json:"writers"`
	Preload                   int      `json:"preload,omitempty"`
	EmptyTableEventsPerSecond float64  `json:"empty_table_events_per_second,omitempty"`
	GrowthRatio               float64  `json:"growth_ratio,omitempty"`
	Waiters                   int      `json:"waiters,omitempty"`
	WaitersEventsPerSecond    float64  `json:"waiters_events_per_second,omitempty"`
	NoWaitersEventsPerSecond  float64  `json:"no_waiters_events_per_second,omitempty"`
	WaitersRatio              float64  `json:"waiters_ratio,omitempty"`
	WaitersGoroutines         int      `json:"waiters_goroutines,omitempty"`
	WaitersHeapBytes          int64    `json:"waiters_heap_bytes,omitempty"`
	RebuildSeconds            float64  `json:"rebuild_seconds,omitempty"`
	RebuildRatioToCopy        float64  `json:"rebuild_ratio_to_copy,omitempty"`
	// RebuildPeakRSSBytes is the rebuild process's peak resident set.
	RebuildPeakRSSBytes int64 `json:"rebuild_peak_rss_bytes,omitempty"`
	// RebuildCPUSeconds is the CPU time (user and system) the rebuild's
	// process took: its own work beside its wall time, for comparing
	// builds; PostgreSQL's share is not in it.
	RebuildCPUSeconds float64  `json:"rebuild_cpu_seconds,omitempty"`
	LiveRate          int      `json:"live_rate,omitempty"`
	LiveSeconds       float64  `json:"live_seconds,omitempty"`
	LiveEvents        int      `json:"live_events,omitempty"`
	LatencyP50Ms      *float64 `json:"latency_p50_ms,omitempty"`
	LatencyP99Ms      *float64 `json:"latency_p99_ms,omitempty"`
	LatencyP999Ms     *float64 `json:"latency_p999_ms,omitempty"`
	LatencyMaxMs      *float64 `json:"latency_max_ms,omitempty"`
}

// MismatchError is a read model that differs from the stream's reference:
// the projector's run was wrong, however fast.
type MismatchError struct {
	Table      string
	Wrong      int
	FirstJobID string
	Rows       int64
	WantRows   int64
}

func (e *MismatchError) Error() string {
	if e.Wrong == 0 {
		return fmt.Sprintf("bench: read model %s is wrong: %d rows, want %d", e.Table, e.Rows, e.WantRows)
	}
	return fmt.Sprintf("bench: read model %s is wrong: %d jobs differ from the reference (first %q)", e.Table, e.Wrong, e.FirstJobID)
}

func (c Config) withDefaults() Config {
	if c.Mix == "" {
		c.Mix = MixSnapshots
	}
	if c.Shape == "" {
		c.Shape = ShapeClustered
	}
	if c.NaiveSample == 0 {
		c.NaiveSample = 2000
	}
	if c.BatchSize == 0 {
		c.BatchSize = 5000
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.checkChunk == 0 {
		c.checkChunk = 100_000
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// MaxEventsPerJob bounds Events / Jobs (see [Config.Validate]).
const MaxEventsPerJob = 1000

// Validate names what is wrong with c, in the library's words.
func (c Config) Validate() error {
	switch {
	case !slices.Contains(Mixes, c.Mix):
		return fmt.Errorf("Mix %q: not one of %v", c.Mix, Mixes)
	case c.Shape != "" && !slices.Contains(Shapes, c.Shape):
		return fmt.Errorf("Shape %q: not one of %v", c.Shape, Shapes)
	case c.Events < 100:
		return fmt.Errorf("Events %d: must be at least 100", c.Events)
	case c.Jobs < 1 || c.Jobs*3 > c.Events:
		return fmt.Errorf("Jobs %d: must be from 1 to a third of Events (every job has at least 3 events)", c.Jobs)
	case c.Events/c.Jobs > MaxEventsPerJob:
		// The stream makes each record from its job's seed when it is read,
		// folding the job from its start: that costs the square of a job's
		// events, and past this many it would take hours.
		return fmt.Errorf("Events %d over Jobs %d: at most %d events a job; raise Jobs", c.Events, c.Jobs, MaxEventsPerJob)
	case c.Partitions < 1 || c.Partitions > 1000:
		return fmt.Errorf("Partitions %d: must be from 1 to 1000", c.Partitions)
	case c.StateBytes < 0 || c.StateBytes > 900_000:
		return fmt.Errorf("StateBytes %d: must be from 0 to 900000 (a record must fit the broker's 1 MiB)", c.StateBytes)
	case c.BatchesInFlight < -1:
		return fmt.Errorf("BatchesInFlight %d: want -1 (no bound), 0 (the default) or a bound", c.BatchesInFlight)
	case c.NaiveSample < 10:
		return fmt.Errorf("NaiveSample %d: must be at least 10", c.NaiveSample)
	case c.Preload < 0:
		return fmt.Errorf("Preload %d: must not be negative", c.Preload)
	case c.Waiters < 0:
		return fmt.Errorf("Waiters %d: must not be negative", c.Waiters)
	case c.Live && (c.LiveRate < 1 || c.LiveDuration < time.Second):
		return fmt.Errorf("Live: LiveRate must be at least 1 and LiveDuration at least 1s")
	case c.Rebuild && c.Executable == "":
		return errors.New("Rebuild: needs Executable, the projector binary")
	}
	return nil
}

// stream plans the run's stream (its records are made as they are read);
// faults adds late and duplicate deliveries.
func (c Config) stream(seed uint64, events int, faults bool) *jobgen.Stream {
	return jobgen.Plan(c.generator(seed, events, faults))
}

// generator is the generator's config of the run's stream.
func (c Config) generator(seed uint64, events int, faults bool) jobgen.Config {
	rate := 0.0
	if faults {
		rate = 0.1
	}
	jobs := c.Jobs
	if events != c.Events {
		// The live stream: 16 events a job, whatever the main stream's
		// shape (few events a job round down in the generator).
		jobs = max(1, events/16)
	}
	return jobgen.Config{
		Seed: seed, Jobs: jobs, EventsPerJob: max(events/jobs, 3), Partitions: c.Partitions, Shape: c.Shape,
		SnapshotsOnly: c.Mix == MixSnapshots, DeltasOnly: c.Mix == MixDeltas, StateBytes: c.StateBytes,
		LateRate: rate, DuplicateRate: rate,
		// A version and a hash a job: the states of millions of jobs would
		// take gigabytes of this process.
		LeanReference: true,
	}
}

// run is one run's shared parts.
type run struct {
	cfg    Config
	pool   *pgxpool.Pool
	schema string
	broker *brokerProc
	rep    *Report
	// noCheckpoint is set once CHECKPOINT was refused.
	noCheckpoint bool
}

// Run measures every line and returns the report; a read model that is not
// exactly the reference fails it with a *[MismatchError].
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// The pool `projector run` would have.
	pool, err := store.OpenPool(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer pool.Close()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	r := &run{cfg: cfg, pool: pool, schema: "projector_bench_" + hex.EncodeToString(rnd[:])}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+r.schema); err != nil {
		return nil, fmt.Errorf("bench: create schema: %w", err)
	}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+r.schema+" CASCADE")
	r.broker, err = startBroker(ctx, cfg.Executable)
	if err != nil {
		return nil, err
	}
	defer r.broker.close()
	r.rep = &Report{Mix: cfg.Mix, Shape: cfg.Shape, Jobs: cfg.Jobs, BatchSize: cfg.BatchSize,
		BatchesInFlight: projection.Config{BatchesInFlight: cfg.BatchesInFlight}.WithDefaults().BatchesInFlight, Partitions: cfg.Partitions, StateBytes: cfg.StateBytes, CPUs: runtime.NumCPU(),
		Projector: "child process: the memory figures are its own", Broker: "child process (not in the memory figures)",
		Checked: "exact: every job's version and state (a 64-bit hash of it as jsonb text, computed in PostgreSQL) equal the reference, and no other row"}
	if r.broker.inProcess {
		r.rep.Broker = "in this process (its memory is in the figures)"
	}
	if cfg.Executable == "" {
		r.rep.Projector = "in this process: the memory figures include the reference and the bench's own"
	}
	if err := r.measure(ctx); err != nil {
		return r.rep, err
	}
	r.rep.BrokerPeakRSSBytes = r.broker.peakRSS()
	r.notePeakRSS()
	return r.rep, nil
}

// notePeakRSS keeps this process's peak resident set so far (VmHWM): the
// generator, the producer, the baselines and the reference, and the
// broker's and the projector's too when they run in this process (tests).
// It is read before the projector's measured run as well: run in this
// process, that run resets the kernel's high-water mark to measure its
// own.
func (r *run) notePeakRSS() {
	r.rep.BenchPeakRSSBytes = max(r.rep.BenchPeakRSSBytes, procStatusBytes("/proc/self/status", "VmHWM:"))
}

func (r *run) add(w Writer) {
	w.EventsPerSecond = float64(w.Events) / w.Seconds
	if len(r.rep.Writers) > 0 {
		w.RatioToCopy = w.EventsPerSecond / r.rep.Writers[0].EventsPerSecond
	} else {
		w.RatioToCopy = 1
	}
	r.rep.Writers = append(r.rep.Writers, w)
	fmt.Fprintf(r.cfg.Progress, "  %-52s %9.0f events/s  %5.2fx raw COPY\n", w.Name, w.EventsPerSecond, w.RatioToCopy)
}

func (r *run) measure(ctx context.Context) error {
	cfg := r.cfg
	stream := cfg.stream(cfg.Seed, cfg.Events, true)
	r.rep.Events = stream.Len
	r.rep.MeanStateBytes = int(stream.StateBytes / int64(stream.Jobs))

	const topic = "bench"
	if err := r.broker.createTopic(ctx, topic, cfg.Partitions); err != nil {
		return err
	}
	events, err := r.produce(ctx, topic, stream)
	if err != nil {
		return err
	}
	defer events.close()
	r.rep.DistinctJobsPerBatchHow = fmt.Sprintf("mean over partition 0's log cut every %d records (--batch-size), as full batches hold them", cfg.BatchSize)
	fmt.Fprintf(cfg.Progress, "projector bench: mix %s, shape %s, %d events for %d jobs (late and duplicate deliveries included), states of about %d bytes, %d partitions, %.0f distinct jobs a batch of %d, %d CPUs\n",
		cfg.Mix, cfg.Shape, stream.Len, stream.Jobs, r.rep.MeanStateBytes, cfg.Partitions, r.rep.DistinctJobsPerBatch, cfg.BatchSize, runtime.NumCPU())
	hwm, err := r.broker.highWatermarks(ctx, topic, cfg.Partitions)
	if err != nil {
		return err
	}

	w, err := rawCopyMedian(ctx, r.pool, r.schema, events, r.checkpoint)
	if err != nil {
		return fmt.Errorf("bench: raw COPY: %w", err)
	}
	r.add(w)
	r.checkpoint(ctx)
	w, err = keyedUpserts(ctx, r.pool, r.schema, events, cfg.Partitions, cfg.BatchSize)
	if err != nil {
		return fmt.Errorf("bench: keyed upserts: %w", err)
	}
	r.add(w)
	keyedRate := r.rep.Writers[len(r.rep.Writers)-1].EventsPerSecond
	r.checkpoint(ctx)
	w, err = naive(ctx, r, topic)
	if err != nil {
		return fmt.Errorf("bench: naive: %w", err)
	}
	r.add(w)
	naiveRate := r.rep.Writers[len(r.rep.Writers)-1].EventsPerSecond
	if cfg.Mix == MixSnapshots {
		r.checkpoint(ctx)
		w, err := batchedSingles(ctx, r.pool, r.schema, events)
		if err != nil {
			return fmt.Errorf("bench: pgx.Batch: %w", err)
		}
		r.add(w)
	}
	truth := stream.Refs
	stream = nil
	events.close()
	r.notePeakRSS()

	first := emptyLeg
	first.measureMemory = true
	empty, err := r.projector(ctx, topic, hwm, truth, first)
	if err != nil {
		return err
	}
	main := empty
	if cfg.Preload > 0 {
		grown, err := r.projector(ctx, topic, hwm, truth, leg{name: fmt.Sprintf("projector, %d rows already in the table", cfg.Preload),
			table: "jobs_preloaded", preload: cfg.Preload})
		if err != nil {
			return err
		}
		r.rep.Preload = cfg.Preload
		r.rep.EmptyTableEventsPerSecond = empty.rate
		r.rep.GrowthRatio = grown.rate / empty.rate
		main = grown
	}
	if cfg.Waiters > 0 {
		// Runs of one process came out faster one after the other,
		// whatever they did: the runs with waits and without alternate as
		// with, without, without, with, so that a steady drift falls on
		// both alike, and each side's rate is the mean of its two.
		var with, without float64
		for i, waits := range []int{cfg.Waiters, 0, 0, cfg.Waiters} {
			l := leg{name: fmt.Sprintf("projector, %d waits held meanwhile", waits), table: fmt.Sprintf("jobs_waits_%d", i), waiters: waits}
			if waits == 0 {
				l.name = "projector, no waits (beside the runs with them)"
			}
			run, err := r.projector(ctx, topic, hwm, truth, l)
			if err != nil {
				return err
			}
			if waits > 0 {
				with += run.rate / 2
			} else {
				without += run.rate / 2
			}
		}
		r.rep.Waiters = cfg.Waiters
		r.rep.WaitersEventsPerSecond = with
		r.rep.NoWaitersEventsPerSecond = without
		r.rep.WaitersRatio = with / without
	}
	r.rep.ProjectorEventsPerSecond = main.rate
	r.rep.ProjectorRatioToCopy = main.rate / r.rep.Writers[0].EventsPerSecond
	r.rep.ProjectorRatioToNaive = main.rate / naiveRate
	r.rep.ProjectorRatioToKeyed = main.rate / keyedRate

	if cfg.Rebuild {
		if err := r.rebuild(ctx, topic, empty.store, truth); err != nil {
			return err
		}
	}
	if cfg.Live {
		if err := r.live(ctx); err != nil {
			return err
		}
	}
	return nil
}

// table creates a plain read-model table for a baseline.
func table(ctx context.Context, pool *pgxpool.Pool, schema, name string) (string, error) {
	t := pgx.Identifier{schema, name}.Sanitize()
	_, err := pool.Exec(ctx, `CREATE TABLE `+t+` (job_id text PRIMARY KEY, version bigint NOT NULL, state jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())`)
	return t, err
}

// rawCopyRuns is how many times the ceiling is measured, each after a
// checkpoint ([run.checkpoint]); the median keeps one disturbed run (a
// busy moment of the machine) from moving every ratio.
const rawCopyRuns = 3

// rawCopyMedian measures the ceiling rawCopyRuns times and keeps the
// median run, noting every run's rate.
func rawCopyMedian(ctx context.Context, pool *pgxpool.Pool, schema string, events *spill, settle func(context.Context)) (Writer, error) {
	runs := make([]Writer, 0, rawCopyRuns)
	for range rawCopyRuns {
		settle(ctx)
		w, err := rawCopy(ctx, pool, schema, events)
		if err != nil {
			return w, err
		}
		runs = append(runs, w)
	}
	rates := make([]string, len(runs))
	for i, x := range runs {
		rates[i] = fmt.Sprintf("%.0f", float64(x.Events)/x.Seconds)
	}
	sorted := slices.SortedFunc(slices.Values(runs), func(a, b Writer) int { return cmp.Compare(a.Seconds, b.Seconds) })
	w := sorted[len(sorted)/2]
	w.Note += fmt.Sprintf("; median of %d runs (%s events/s, in run order)", len(runs), strings.Join(rates, ", "))
	return w, nil
}

// rawCopy is the ceiling: binary COPY of every event (its key, version and
// state or ops) into a table with no key, no version check, nothing but
// the bytes. The events were decoded as they were produced; the COPY reads
// them back from the spill file as it sends them.
func rawCopy(ctx context.Context, pool *pgxpool.Pool, schema string, events *spill) (Writer, error) {
	w := Writer{Name: "raw COPY (no versions, no key: the ceiling)", Events: events.n,
		Note: "decoded before timing, read back from a file as sent; each event's state or ops as jsonb"}
	t := pgx.Identifier{schema, "raw_copy"}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+t.Sanitize()+` (job_id text, version bigint, body jsonb)`); err != nil {
		return w, err
	}
	start := time.Now()
	n, err := pool.CopyFrom(ctx, t, []string{"job_id", "version", "body"}, events.rows())
	w.Seconds = time.Since(start).Seconds()
	if err == nil && n != int64(events.n) {
		err = fmt.Errorf("copied %d events of %d", n, events.n)
	}
	if err == nil {
		_, err = pool.Exec(ctx, `DROP TABLE `+t.Sanitize())
	}
	return w, err
}

const guarded = ` AS t (job_id, version, state) VALUES ($1, $2, $3::jsonb)
	ON CONFLICT (job_id) DO UPDATE SET version = excluded.version, state = excluded.state, updated_at = now()
	WHERE t.version < excluded.version`

// batchedSingles pipelines single version-guarded upserts, 1000 to a
// transaction (snapshots only: it applies no deltas), reading the events
// back from the spill file a batch at a time.
func batchedSingles(ctx context.Context, pool *pgxpool.Pool, schema string, events *spill) (Writer, error) {
	w := Writer{Name: "pgx.Batch of single upserts, 1000 per tx", Events: events.n, Note: "decoded before timing, no Kafka, no positions"}
	t, err := table(ctx, pool, schema, "batched")
	if err != nil {
		return w, err
	}
	rows := events.rows()
	start := time.Now()
	for more := true; more; {
		b := &pgx.Batch{}
		for b.Len() < 1000 {
			if more = rows.Next(); !more {
				break
			}
			b.Queue(`INSERT INTO `+t+guarded, rows.jobID, rows.version, rows.body)
		}
		if rows.Err() != nil {
			return w, rows.Err()
		}
		if b.Len() == 0 {
			break
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() }); err != nil {
			return w, err
		}
	}
	w.Seconds = time.Since(start).Seconds()
	_, err = pool.Exec(ctx, `DROP TABLE `+t)
	return w, err
}

// produceChunk is how many records the bench makes and produces at a
// time: the stream is never whole in its memory.
const produceChunk = 20_000

// produce makes the stream's records a chunk at a time (in a goroutine of
// its own, a chunk ahead) and produces each chunk, counting partition 0's
// batches and spilling the decoded events for the baselines.
func (r *run) produce(ctx context.Context, topic string, stream *jobgen.Stream) (*spill, error) {
	events, err := newSpill()
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			events.close()
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	chunks := make(chan []jobgen.Record, 1)
	made := make(chan struct{})
	go func() {
		defer close(made)
		defer close(chunks)
		rd := stream.Reader()
		for {
			recs := rd.Next(produceChunk)
			if len(recs) == 0 {
				return
			}
			select {
			case chunks <- recs:
			case <-ctx.Done():
				return
			}
		}
	}()
	defer func() { cancel(); <-made }()
	batches := jobgen.NewBatches(0, r.cfg.BatchSize)
	for recs := range chunks {
		if _, err := r.broker.produce(ctx, topic, recs); err != nil {
			return nil, err
		}
		batches.Add(recs)
		for _, rec := range recs {
			ev, err := event.Decode(rec.Key, rec.Value)
			if err != nil {
				return nil, fmt.Errorf("bench: a generated record does not decode: %w", err)
			}
			if err := events.add(rec.Partition, ev); err != nil {
				return nil, err
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := events.done(); err != nil {
		return nil, err
	}
	if events.n != stream.Len {
		return nil, fmt.Errorf("bench: the stream made %d records, planned %d", events.n, stream.Len)
	}
	r.rep.DistinctJobsPerBatch = batches.Mean()
	ok = true
	return events, nil
}

// projected is one projector run.
type projected struct {
	rate  float64
	store *store.Store
}

func (r *run) engine(st *store.Store, topic, group string) (*projection.Projector, error) {
	return newEngine(childSpec{Brokers: r.broker.addrs, Topic: topic, Group: group, BatchSize: r.cfg.BatchSize, BatchesInFlight: r.cfg.BatchesInFlight}, st, r.cfg.Logger)
}

// projector runs the real engine from the broker into a fresh table
// (holding preload rows first), timing from start to every partition's
// stored position at its high watermark, then checks the table exactly.
// leg is one run of the projector: into table, shown as name.
type leg struct {
	name, table string
	// preload rows are in the table first; waiters waits are held
	// meanwhile.
	preload, waiters int
	measureMemory    bool
}

var emptyLeg = leg{name: "projector (Kafka to PostgreSQL, end to end)", table: "jobs"}

func (r *run) projector(ctx context.Context, topic string, hwm map[int]int64, truth []jobgen.Ref, l leg) (projected, error) {
	name, table, preload, waiters, measureMemory := l.name, l.table, l.preload, l.waiters, l.measureMemory
	st, err := store.New(r.pool, store.Config{Schema: r.schema, Table: table})
	if err != nil {
		return projected{}, err
	}
	if err := st.Migrate(ctx); err != nil {
		return projected{}, err
	}
	if preload > 0 {
		if err := r.preload(ctx, st.JobsTable(), preload); err != nil {
			return projected{}, err
		}
	}
	if waiters > 0 {
		release, err := r.holdWaiters(ctx, st, waiters)
		if err != nil {
			return projected{}, err
		}
		defer release()
	}
	r.checkpoint(ctx)
	before, err := ioCounters(ctx, r.pool, st.JobsTable())
	if err != nil {
		return projected{}, err
	}
	var elapsed time.Duration
	spec := childSpec{DatabaseURL: r.cfg.DatabaseURL, Schema: r.schema, Table: table, Topic: topic, Group: "bench-" + table,
		Brokers: r.broker.addrs, BatchSize: r.cfg.BatchSize, BatchesInFlight: r.cfg.BatchesInFlight, HWM: hwm}
	switch {
	case measureMemory && r.cfg.Executable != "":
		// The projector alone in its own process: its heap and RSS are
		// what `projector run` would have, with nothing of the bench's.
		spec.CPUProfile, spec.AllocProfile = r.cfg.CPUProfile, r.cfg.AllocProfile
		var res childResult
		res, err = runProjectorChild(ctx, r.cfg.Executable, r.cfg.ChildArgs, spec)
		elapsed = time.Duration(res.Seconds * float64(time.Second))
		r.rep.PeakHeapBytes, r.rep.PeakLiveHeapBytes, r.rep.PeakRSSBytes, r.rep.HeapBeforeBytes = res.PeakHeapBytes, res.PeakLiveHeapBytes, res.PeakRSSBytes, res.HeapBeforeBytes
		r.rep.BatchesInFlight, r.rep.MemoryLimitBytes = res.BatchesInFlight, res.MemoryLimitBytes
	case measureMemory:
		spec.CPUProfile, spec.AllocProfile = r.cfg.CPUProfile, r.cfg.AllocProfile
		var res childResult
		res, err = projectorRun(ctx, r.pool, spec, r.cfg.Logger)
		elapsed = time.Duration(res.Seconds * float64(time.Second))
		r.rep.PeakHeapBytes, r.rep.PeakLiveHeapBytes, r.rep.PeakRSSBytes, r.rep.HeapBeforeBytes = res.PeakHeapBytes, res.PeakLiveHeapBytes, res.PeakRSSBytes, res.HeapBeforeBytes
		r.rep.BatchesInFlight, r.rep.MemoryLimitBytes = res.BatchesInFlight, res.MemoryLimitBytes
	default:
		var p *projection.Projector
		if p, err = r.engine(st, topic, spec.Group); err == nil {
			elapsed, err = runUntil(ctx, p, st, hwm, nil)
		}
	}
	if err != nil {
		return projected{}, fmt.Errorf("bench: %s: %w", name, err)
	}
	// Before the check, which reads the whole table.
	time.Sleep(statsDelay)
	after, err := ioCounters(ctx, r.pool, st.JobsTable())
	if err != nil {
		return projected{}, err
	}
	if r.cfg.tamper != nil {
		if err := r.cfg.tamper(ctx, r.pool, st.JobsTable()); err != nil {
			return projected{}, err
		}
	}
	if err := check(ctx, r.pool, st.JobsTable(), truth, int64(preload), r.cfg.checkChunk); err != nil {
		return projected{}, err
	}
	w := Writer{Name: name, Events: r.rep.Events, Seconds: elapsed.Seconds(), Note: "fetch, decode, fold, write, commit; checked exact"}
	w.WALBytes, w.BlocksRead = after.wal-before.wal, after.blocks-before.blocks
	r.add(w)
	return projected{rate: r.rep.Writers[len(r.rep.Writers)-1].EventsPerSecond, store: st}, nil
}

// runUntil runs p until every partition's stored position reaches hwm and
// returns how long that took. caught, when set, runs then, before the
// engine stops, with the engine's memory still in use.
func runUntil(ctx context.Context, p *projection.Projector, st *store.Store, hwm map[int]int64, caught func() error) (time.Duration, error) {
	start := time.Now()
	e := startEngine(ctx, p)
	defer e.stop()
	for {
		done, err := reached(ctx, st, hwm)
		if err != nil {
			return 0, err
		}
		if done {
			elapsed := time.Since(start)
			if caught != nil {
				if err := caught(); err != nil {
					return 0, err
				}
			}
			return elapsed, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-e.stopped:
			return 0, fmt.Errorf("engine stopped: %v", e.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// engineRun is a running projector; stop cancels it and waits for it.
type engineRun struct {
	cancel  context.CancelFunc
	stopped chan struct{}
	err     error // once stopped is closed
}

func startEngine(ctx context.Context, p *projection.Projector) *engineRun {
	ctx, cancel := context.WithCancel(ctx)
	e := &engineRun{cancel: cancel, stopped: make(chan struct{})}
	go func() { e.err = p.Run(ctx); close(e.stopped) }()
	return e
}

func (e *engineRun) stop() { e.cancel(); <-e.stopped }

// io is the server's write-ahead log position and the blocks of a table
// and its indexes read into shared buffers so far.
type ioCount struct{ wal, blocks int64 }

// ioCounters reads the server's counters for table. Block reads are
// statistics each connection publishes at most once a second, so they are
// read a little after a run ends (see statsDelay).
const statsDelay = 1500 * time.Millisecond

func ioCounters(ctx context.Context, pool *pgxpool.Pool, table string) (ioCount, error) {
	var c ioCount
	err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint,
		coalesce((SELECT coalesce(heap_blks_read, 0) + coalesce(idx_blks_read, 0) + coalesce(toast_blks_read, 0) + coalesce(tidx_blks_read, 0)
			FROM pg_statio_all_tables WHERE relid = to_regclass($1)), 0)`, table).Scan(&c.wal, &c.blocks)
	if err != nil {
		return c, fmt.Errorf("bench: server counters: %w", err)
	}
	return c, nil
}

func reached(ctx context.Context, st *store.Store, hwm map[int]int64) (bool, error) {
	pos, err := st.Positions(ctx)
	if err != nil {
		return false, err
	}
	have := map[int]int64{}
	for _, ps := range pos {
		have[ps.Partition] = ps.NextOffset
	}
	for part, h := range hwm {
		if h > 0 && have[part] < h {
			return false, nil
		}
	}
	return true, nil
}

// preload fills table with n rows whose ids sort among the stream's ("job-
// 00042-17" between "job-00042" and "job-00043"), so the stream's writes
// land all over a grown index, as a real table's would.
func (r *run) preload(ctx context.Context, table string, n int) error {
	start := time.Now()
	_, err := r.pool.Exec(ctx, `INSERT INTO `+table+` (job_id, version, state)
		SELECT 'job-' || lpad((i % $2)::text, 5, '0') || '-' || (i / $2)::text, 1,
			jsonb_build_object('status', 'completed', 'processed_articles', i, 'payload', repeat('x', $3))
		FROM generate_series(0, $1 - 1) AS i`, n, r.cfg.Jobs, max(r.rep.MeanStateBytes-80, 0))
	if err != nil {
		return fmt.Errorf("bench: preload %d rows: %w", n, err)
	}
	if _, err := r.pool.Exec(ctx, `VACUUM ANALYZE `+table); err != nil {
		return fmt.Errorf("bench: preload: analyze: %w", err)
	}
	// The preload and its vacuum leave gigabytes of dirty pages (and of
	// WAL) that the server's checkpoints would otherwise write back while
	// the projector runs, charging the preload's cost to the projector.
	// A checkpoint needs a superuser or pg_checkpoint: without one, the
	// run goes on and says so.
	if _, err := r.pool.Exec(ctx, `CHECKPOINT`); err != nil {
		fmt.Fprintf(r.cfg.Progress, "  (no checkpoint after the preload: %v; the server writes the preload back during the run)\n", err)
	}
	fmt.Fprintf(r.cfg.Progress, "  (preloaded %d rows in %.1fs, checkpoint included)\n", n, time.Since(start).Seconds())
	return nil
}

// checkpoint puts the server in the same state before each timed writer:
// its own checkpoints come every 1 GB of WAL (max_wal_size), so one bench
// run wrote enough for one or two, and whichever writer one fell in
// (writing back the pages before it, then logging full-page images) ran
// slower: raw COPY of one deltas stream ran at 640,000 to 1,150,000
// events/s from one run to the next. A checkpoint needs a superuser or
// pg_checkpoint: without one, the bench says so once and goes on.
func (r *run) checkpoint(ctx context.Context) {
	if r.noCheckpoint {
		return
	}
	if _, err := r.pool.Exec(ctx, `CHECKPOINT`); err != nil {
		r.noCheckpoint = true
		fmt.Fprintf(r.cfg.Progress, "  (no CHECKPOINT before each timed writer: %v; the server's own checkpoints may fall in one and slow it)\n", err)
	}
}

// check compares table with the reference: every job at its version with
// its state, and no row but theirs and the preloaded ones. A state is
// compared by a 64-bit hash of its jsonb text, computed in the server, so
// the check holds 16 bytes a job rather than every state. The bench's
// streams delete no job; a deleted one would have no row.
func check(ctx context.Context, pool *pgxpool.Pool, table string, truth []jobgen.Ref, preload int64, checkChunk int) error {
	var wrong, live int
	var first string
	for lo := 0; lo < len(truth); lo += checkChunk {
		refs := truth[lo:min(lo+checkChunk, len(truth))]
		ids := make([]string, 0, len(refs))
		vers := make([]int64, 0, len(refs))
		hashes := make([]int64, 0, len(refs))
		var gone []string
		for i, t := range refs {
			if t.Deleted {
				gone = append(gone, jobgen.JobID(lo+i))
				continue
			}
			ids, vers, hashes = append(ids, jobgen.JobID(lo+i)), append(vers, int64(t.Version)), append(hashes, t.Hash)
		}
		live += len(ids)
		var n int
		var firstHere *string
		err := pool.QueryRow(ctx, `SELECT count(*), min(job_id) FROM (
				SELECT t.job_id FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS t(job_id, version, hash)
				LEFT JOIN `+table+` j ON j.job_id = t.job_id
				WHERE j.job_id IS NULL OR j.version <> t.version OR ('x' || left(md5(j.state::text), 16))::bit(64)::bigint <> t.hash
				UNION ALL
				SELECT j.job_id FROM `+table+` j WHERE j.job_id = ANY($4::text[])
			) AS w`, ids, vers, hashes, gone).Scan(&n, &firstHere)
		if err != nil {
			return fmt.Errorf("bench: check %s: %w", table, err)
		}
		if n > 0 && wrong == 0 {
			first = *firstHere
		}
		wrong += n
	}
	if wrong > 0 {
		return &MismatchError{Table: table, Wrong: wrong, FirstJobID: first}
	}
	var rows int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&rows); err != nil {
		return fmt.Errorf("bench: check %s: %w", table, err)
	}
	if want := int64(live) + preload; rows != want {
		return &MismatchError{Table: table, Rows: rows, WantRows: want}
	}
	return nil
}

// rebuild times `projector rebuild` of the stream into the table the
// projector wrote, from process start to exit, and checks the result. The
// rebuild runs with its own defaults (its batches are larger than the
// projector's), as an operator would run it, but for the bound on batches
// in flight the bench was given.
func (r *run) rebuild(ctx context.Context, topic string, st *store.Store, truth []jobgen.Ref) error {
	g := func(d time.Duration) string { return d.String() }
	cmd := exec.CommandContext(ctx, r.cfg.Executable, "rebuild",
		"--database-url", r.cfg.DatabaseURL, "--brokers", r.broker.addrs[0], "--topic", topic,
		"--schema", r.schema, "--table", "jobs",
		"--group-heartbeat-interval", g(broker.GroupHeartbeatInterval), "--group-session-timeout", g(sessionTimeout),
		"--group-rebalance-timeout", g(broker.GroupRebalanceTimeout), "--group-join-backoff", g(broker.GroupJoinBackoff),
		"--batches-in-flight", strconv.Itoa(r.cfg.BatchesInFlight), "--log-level", "warn")
	cmd.Stderr = os.Stderr
	r.checkpoint(ctx)
	start := time.Now()
	out, err := cmd.Output()
	elapsed := time.Since(start)
	if err != nil {
		return fmt.Errorf("bench: projector rebuild: %w (output: %s)", err, out)
	}
	if err := check(ctx, r.pool, st.JobsTable(), truth, 0, r.cfg.checkChunk); err != nil {
		return fmt.Errorf("after rebuild: %w", err)
	}
	r.add(Writer{Name: "projector rebuild (its own process, start to swap)", Events: r.rep.Events, Seconds: elapsed.Seconds(),
		Note: "shadow table from the earliest offsets, then the swap; checked exact"})
	r.rep.RebuildSeconds = elapsed.Seconds()
	r.rep.RebuildRatioToCopy = r.rep.Writers[len(r.rep.Writers)-1].RatioToCopy
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && runtime.GOOS == "linux" {
		r.rep.RebuildPeakRSSBytes = ru.Maxrss << 10 // kilobytes on Linux
	}
	r.rep.RebuildCPUSeconds = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	return nil
}

// Print writes the report as a table.
func Print(out io.Writer, rep *Report) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(out)
	fmt.Fprintln(tw, "WRITER\tEVENTS\tSECONDS\tEVENTS/S\tx RAW COPY\tNOTE")
	for _, w := range rep.Writers {
		note := w.Note
		if w.WALBytes > 0 {
			note += fmt.Sprintf("; WAL %.0f MiB, %d blocks read", float64(w.WALBytes)/(1<<20), w.BlocksRead)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.0f\t%.2f\t%s\n", w.Name, w.Events, w.Seconds, w.EventsPerSecond, w.RatioToCopy, note)
	}
	tw.Flush()
	fmt.Fprintf(out, "\nprojector: %.2fx raw COPY, %.2fx the keyed ceiling, %.1fx the naive consumer; peak heap %s (live %s), peak RSS %s (projector: %s; broker: %s)\n",
		rep.ProjectorRatioToCopy, rep.ProjectorRatioToKeyed, rep.ProjectorRatioToNaive, mib(rep.PeakHeapBytes), mib(rep.PeakLiveHeapBytes), mib(rep.PeakRSSBytes), rep.Projector, rep.Broker)
	fmt.Fprintf(out, "stream: shape %s, %d jobs, %.1f distinct jobs a batch of %d; the bench process's peak RSS %s (the stream is made as it is produced, never whole)\n",
		rep.Shape, rep.Jobs, rep.DistinctJobsPerBatch, rep.BatchSize, mib(rep.BenchPeakRSSBytes))
	if rep.Preload > 0 {
		fmt.Fprintf(out, "growth: with %d rows already in the table, %.0f events/s, %.2fx the empty table's %.0f\n",
			rep.Preload, rep.ProjectorEventsPerSecond, rep.GrowthRatio, rep.EmptyTableEventsPerSecond)
	}
	if rep.Waiters > 0 {
		fmt.Fprintf(out, "waiters: with %d waits held, %.0f events/s, %.2fx the %.0f of the runs with none beside them; they took %d goroutines and %s of heap\n",
			rep.Waiters, rep.WaitersEventsPerSecond, rep.WaitersRatio, rep.NoWaitersEventsPerSecond, rep.WaitersGoroutines, mib(rep.WaitersHeapBytes))
	}
	if rep.RebuildSeconds > 0 {
		fmt.Fprintf(out, "rebuild: %.2fs, %.2fx raw COPY, its process's peak RSS %s, its CPU %.1fs\n", rep.RebuildSeconds, rep.RebuildRatioToCopy, mib(rep.RebuildPeakRSSBytes), rep.RebuildCPUSeconds)
	}
	if rep.LatencyP99Ms != nil {
		fmt.Fprintf(out, "live: %d events at %d/s for %.0fs; produce to visible p50 %.1f ms, p99 %.1f ms, p99.9 %.1f ms, max %.1f ms\n",
			rep.LiveEvents, rep.LiveRate, rep.LiveSeconds, *rep.LatencyP50Ms, *rep.LatencyP99Ms, *rep.LatencyP999Ms, *rep.LatencyMaxMs)
	}
}

// JSON writes the report as one JSON object.
func JSON(out io.Writer, rep *Report) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// keyedUpserts is the keyed ceiling: the least any read model keyed by job
// must write for this stream, and nothing else. The log is cut into the
// batches the projector reads (each partition's records in log order,
// batchSize at a time); each batch is reduced to the last version of each
// of its jobs and written by one upsert of a row per job (the version
// guard in its WHERE, as a keyed model needs), in a transaction of its
// own, every partition at once on the pool. No Kafka, no positions, no
// version rules, no deltas applied: a delta's ops are stored as its job's
// state, and they are smaller than the state they would make, so if
// anything this ceiling is high. On a stream whose jobs' events are far
// apart, nearly every event is a row to find and rewrite: no writer of a
// keyed model goes faster than this on it.
func keyedUpserts(ctx context.Context, pool *pgxpool.Pool, schema string, events *spill, partitions, batchSize int) (Writer, error) {
	w := Writer{Name: "keyed upserts, a row per job per batch (no Kafka, no version rules: the keyed ceiling)", Events: events.n,
		Note: fmt.Sprintf("decoded before timing, read back from a file; each partition's log cut every %d records, one upsert statement per batch, %d partitions at once", batchSize, partitions)}
	t, err := table(ctx, pool, schema, "keyed")
	if err != nil {
		return w, err
	}
	took, err := keyedInto(ctx, pool, t, events, partitions, batchSize)
	if err != nil {
		_, _ = pool.Exec(context.WithoutCancel(ctx), `DROP TABLE `+t)
		return w, err
	}
	w.Seconds = took.Seconds()
	_, err = pool.Exec(ctx, `DROP TABLE `+t)
	return w, err
}

// keyedBatch is one batch of the keyed ceiling: a row per job.
type keyedBatch struct {
	ids    []string
	vers   []int64
	states []string
	at     map[string]int // job id to its row
	n      int            // records read into it
}

// add takes an event into the batch: a new row for a job not in it yet,
// else the job's row if the event is of a later version.
func (b *keyedBatch) add(job string, version int64, state string) {
	if state == "" {
		state = "null" // a delete has no body
	}
	b.n++
	if i, ok := b.at[job]; ok {
		if version > b.vers[i] {
			b.vers[i], b.states[i] = version, state
		}
		return
	}
	b.at[job] = len(b.ids)
	b.ids, b.vers, b.states = append(b.ids, job), append(b.vers, version), append(b.states, state)
}

// keyedInto writes the keyed ceiling's rows into table t (see
// [keyedUpserts]) and says how long that took.
func keyedInto(ctx context.Context, pool *pgxpool.Pool, t string, events *spill, partitions, batchSize int) (time.Duration, error) {
	upsert := `INSERT INTO ` + t + ` AS t (job_id, version, state)
		SELECT i.job_id, i.version, i.state::jsonb FROM unnest($1::text[], $2::bigint[], $3::text[]) AS i(job_id, version, state)
		ON CONFLICT (job_id) DO UPDATE SET version = excluded.version, state = excluded.state, updated_at = now()
		WHERE t.version < excluded.version`
	g, gctx := errgroup.WithContext(ctx)
	queues := make([]chan *keyedBatch, partitions)
	for p := range queues {
		// A few batches deep: the reader, one for every partition, does
		// not wait on one partition's statement while another's is idle.
		q := make(chan *keyedBatch, 4)
		queues[p] = q
		g.Go(func() error {
			for b := range q {
				if _, err := pool.Exec(gctx, upsert, b.ids, b.vers, b.states); err != nil {
					return err
				}
			}
			return nil
		})
	}
	fresh := func() *keyedBatch { return &keyedBatch{at: make(map[string]int, batchSize)} }
	filling := make([]*keyedBatch, partitions)
	for p := range filling {
		filling[p] = fresh()
	}
	send := func(p int) error {
		select {
		case queues[p] <- filling[p]:
			filling[p] = fresh()
			return nil
		case <-gctx.Done():
			return gctx.Err()
		}
	}
	start := time.Now()
	read := func() error {
		defer func() {
			for _, q := range queues {
				close(q)
			}
		}()
		rows := events.rows()
		for rows.Next() {
			p := rows.partition
			if p < 0 || p >= partitions {
				return fmt.Errorf("an event of partition %d, of %d", p, partitions)
			}
			filling[p].add(rows.jobID, rows.version, rows.body)
			if filling[p].n == batchSize {
				if err := send(p); err != nil {
					return err
				}
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for p, b := range filling {
			if b.n > 0 {
				if err := send(p); err != nil {
					return err
				}
			}
		}
		return nil
	}
	readErr := read()
	if err := g.Wait(); err != nil {
		return 0, err
	}
	if readErr != nil {
		return 0, readErr
	}
	return time.Since(start), nil
}

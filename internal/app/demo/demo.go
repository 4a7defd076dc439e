package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/internal/app/jobgen"
	"github.com/projector/projector/projection"
	"github.com/projector/projector/store"
)

// LocalURL is the server the demo tries when no URL is given.
const LocalURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable&connect_timeout=3"

// Config shapes a demo run.
type Config struct {
	Seed         uint64
	Jobs         int
	EventsPerJob int
	Partitions   int
	// DatabaseURL is used when set; else the local server if it answers;
	// else a throwaway cluster.
	DatabaseURL string
	// Keep leaves the demo's schema in place.
	Keep bool
	// Progress draws a live progress line (for a terminal); otherwise
	// progress goes to the log.
	Progress bool
	// Timeout bounds the wait for the projection to finish.
	Timeout time.Duration
	Out     io.Writer
	Logger  *slog.Logger
	// Source is projection.SourceKafka (the default: an in-process
	// broker) or projection.SourceSQS (a FIFO queue on the SQS emulator).
	Source string
}

// Summary is what a run produced and found.
type Summary struct {
	Seed       uint64
	Records    int
	Events     int
	Faults     jobgen.Faults
	Counters   projection.Counters
	Elapsed    time.Duration
	Jobs       int
	Verified   int
	Mismatches []string
	Schema     string
	Database   string
}

// OK reports whether every job matched.
func (s *Summary) OK() bool { return s.Jobs > 0 && s.Verified == s.Jobs }

// Run runs the demo and prints its summary to cfg.Out.
func Run(ctx context.Context, cfg Config) (*Summary, error) {
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 3 * time.Minute
	}
	gen := jobgen.Config{
		Seed: cfg.Seed, Jobs: cfg.Jobs, EventsPerJob: cfg.EventsPerJob, Partitions: cfg.Partitions,
		LateRate: 0.10, DuplicateRate: 0.10, MissingRate: 0.03, MisrouteRate: 0.03, BadRate: 0.02, DeleteRate: 0.05,
	}.WithDefaults()
	log := cfg.Logger
	say := func(format string, args ...any) { fmt.Fprintf(cfg.Out, format+"\n", args...) }
	sum := &Summary{Seed: cfg.Seed}

	// PostgreSQL.
	pool, where, stop, err := connect(ctx, cfg, func(f string, a ...any) { say(f, a...) })
	if err != nil {
		return nil, err
	}
	defer stop()
	sum.Database = where
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	sum.Schema = "projector_demo_" + hex.EncodeToString(rnd[:])
	st, err := store.New(pool, store.Config{Schema: sum.Schema})
	if err != nil {
		return nil, err
	}
	if err := st.Migrate(ctx); err != nil {
		return nil, err
	}
	if !cfg.Keep {
		defer func() {
			_, _ = pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{sum.Schema}.Sanitize()+" CASCADE")
		}()
	}

	stream := jobgen.Generate(gen)
	sum.Records, sum.Events, sum.Faults, sum.Jobs = len(stream.Records), stream.Events, stream.Faults, len(stream.Truth)
	auth := jobgen.NewAuthority(stream.Truth)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: auth, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	authURL := "http://" + ln.Addr().String()

	// The source: Kafka or SQS.
	var src feed
	if cfg.Source == projection.SourceSQS {
		src, err = startQueue(ctx)
	} else {
		src, err = startBroker(ctx, gen.Partitions)
	}
	if err != nil {
		return nil, err
	}
	defer src.close()

	what := fmt.Sprintf("%d partitions", gen.Partitions)
	if cfg.Source == projection.SourceSQS {
		what = "one FIFO queue, a message group per job"
	}
	say("projector demo: %d jobs, %d events (%d records with faults: %d late, %d duplicate, %d missing, %d misrouted, %d bad), %d deleted and %d deleted then recreated, %s, seed %d",
		sum.Jobs, sum.Events, sum.Records, sum.Faults.Late, sum.Faults.Duplicate, sum.Faults.Missing, sum.Faults.Misrouted, sum.Faults.Bad,
		sum.Faults.Deleted, sum.Faults.Recreated, what, cfg.Seed)
	say("  %s", src.describe())
	say("  store    %s, schema %s", where, sum.Schema)
	say("  authority %s/jobs/{job_id}", authURL)

	pcfg := projection.Config{
		Store: st, Logger: log, BatchSize: 2000,
		GapWait: time.Second, RereadWindow: time.Hour, RereadMaxTime: 10 * time.Second,
		SnapshotURL: authURL, SnapshotTimeout: 2 * time.Second, SnapshotMaxElapsed: 5 * time.Second,
		GapRetryMin: 200 * time.Millisecond, GapRetryMax: 2 * time.Second,
	}
	src.configure(&pcfg)
	p, err := projection.New(pcfg)
	if err != nil {
		return nil, err
	}

	start := time.Now()
	runCtx, stopEngine := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() { runErr = p.Run(runCtx) })

	// Produce while the engine runs, in chunks, as live workers would.
	if err := src.produce(ctx, stream.Records); err != nil {
		stopEngine()
		wg.Wait()
		return nil, fmt.Errorf("demo: produce: %w", err)
	}

	waitErr := waitDone(ctx, cfg, src, st, p, start)
	var own string
	if waitErr == nil {
		job, version, took, err := ownWrite(ctx, src, st, stream, gen.Partitions, sum)
		if err != nil {
			waitErr = err
		} else {
			own = fmt.Sprintf("read your own write: %s v%d published and read back %s later (waited for, not polled)", job, version, took.Round(100*time.Microsecond))
		}
	}
	stopEngine()
	wg.Wait()
	if runErr != nil {
		return nil, runErr
	}
	sum.Elapsed = time.Since(start)
	sum.Counters = p.Status().Counters
	if errors.Is(waitErr, context.Canceled) {
		return nil, waitErr
	}

	if err := verify(ctx, st, stream, sum); err != nil {
		return nil, err
	}
	printSummary(cfg.Out, sum, auth.Requests.Load())
	if own != "" {
		say("%s", own)
	}
	if waitErr != nil {
		say("did not finish: %v", waitErr)
	}
	return sum, nil
}

// connect finds a PostgreSQL server: the given URL, the local server, or
// a throwaway cluster.
func connect(ctx context.Context, cfg Config, say func(string, ...any)) (*pgxpool.Pool, string, func(), error) {
	open := func(url string) (*pgxpool.Pool, error) {
		pc, err := pgxpool.ParseConfig(url)
		if err != nil {
			return nil, err
		}
		pc.MaxConns = 8
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return nil, err
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := pool.Ping(pctx); err != nil {
			pool.Close()
			return nil, err
		}
		return pool, nil
	}
	describe := func(url string) string {
		pc, err := pgx.ParseConfig(url)
		if err != nil {
			return "PostgreSQL"
		}
		return fmt.Sprintf("PostgreSQL %s@%s:%d/%s", pc.User, pc.Host, pc.Port, pc.Database)
	}
	if cfg.DatabaseURL != "" {
		pool, err := open(cfg.DatabaseURL)
		if err != nil {
			return nil, "", nil, fmt.Errorf("demo: connect to DATABASE_URL: %w", err)
		}
		return pool, describe(cfg.DatabaseURL), pool.Close, nil
	}
	if pool, err := open(LocalURL); err == nil {
		return pool, describe(LocalURL) + " (local server)", pool.Close, nil
	}
	say("no DATABASE_URL and no server on 127.0.0.1:5432: starting a throwaway PostgreSQL cluster")
	tc, err := startTempCluster(ctx, say)
	if err != nil {
		return nil, "", nil, fmt.Errorf("demo: no PostgreSQL: %w", err)
	}
	pool, err := open(tc.URL)
	if err != nil {
		tc.Stop()
		return nil, "", nil, fmt.Errorf("demo: connect to the throwaway cluster: %w", err)
	}
	return pool, describe(tc.URL) + " (throwaway cluster, removed at the end)", func() { pool.Close(); tc.Stop() }, nil
}

// waitDone waits until every record is projected and no job is held.
func waitDone(ctx context.Context, cfg Config, src feed, st *store.Store, p *projection.Projector, start time.Time) error {
	deadline := time.Now().Add(cfg.Timeout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	lastLog := time.Now()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		lag, total, err := src.lag(ctx, st)
		if err != nil {
			return err
		}
		s := p.Status()
		c := s.Counters
		rate := float64(c.Consumed) / time.Since(start).Seconds()
		line := fmt.Sprintf("consumed %d/%d  %.0f events/s  held gaps %d  lag %d", c.Consumed, total, rate, c.HeldJobs, lag)
		if cfg.Progress {
			fmt.Fprintf(cfg.Out, "\r\033[K%s", line)
		} else if time.Since(lastLog) > 2*time.Second {
			fmt.Fprintln(cfg.Out, line)
			lastLog = time.Now()
		}
		if lag == 0 && c.HeldJobs == 0 && total > 0 && len(s.Partitions) > 0 {
			held, _, err := st.HeldJobs(ctx, 1)
			if err == nil && len(held) == 0 {
				if cfg.Progress {
					fmt.Fprintln(cfg.Out)
				}
				return nil
			}
		}
		if time.Now().After(deadline) {
			if cfg.Progress {
				fmt.Fprintln(cfg.Out)
			}
			return fmt.Errorf("timed out after %s with lag %d and %d held jobs", cfg.Timeout, lag, c.HeldJobs)
		}
	}
}

func verify(ctx context.Context, st *store.Store, stream *jobgen.Stream, sum *Summary) error {
	rows, err := st.Jobs(ctx)
	if err != nil {
		return err
	}
	var deleted []string
	for _, id := range stream.JobIDs() {
		if stream.Truth[id].Deleted {
			deleted = append(deleted, id)
		}
	}
	tombs, err := st.Tombstones(ctx, deleted)
	if err != nil {
		return err
	}
	for _, id := range stream.JobIDs() {
		want := stream.Truth[id]
		got, ok := rows[id]
		switch {
		case want.Deleted && ok:
			sum.Mismatches = append(sum.Mismatches, fmt.Sprintf("%s: a row at version %d for a job deleted at version %d", id, got.Version, want.Version))
		case want.Deleted && tombs[id].Version != want.Version:
			sum.Mismatches = append(sum.Mismatches, fmt.Sprintf("%s: deleted at version %d, but its tombstone is at %d", id, want.Version, tombs[id].Version))
		case want.Deleted:
			sum.Verified++
		case !ok:
			sum.Mismatches = append(sum.Mismatches, fmt.Sprintf("%s: no row (want version %d)", id, want.Version))
		case got.Version != want.Version || !delta.SameState(got.State, want.State):
			sum.Mismatches = append(sum.Mismatches, fmt.Sprintf("%s: version %d state %s, want version %d state %s",
				id, got.Version, got.State, want.Version, want.State))
		default:
			sum.Verified++
		}
	}
	for id := range rows {
		if _, ok := stream.Truth[id]; !ok {
			sum.Mismatches = append(sum.Mismatches, fmt.Sprintf("%s: a row for a job that does not exist", id))
		}
	}
	sort.Strings(sum.Mismatches)
	return nil
}

func printSummary(out io.Writer, s *Summary, authRequests int64) {
	c := s.Counters
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(out)
	row := func(k string, v any) { fmt.Fprintf(w, "%v\t  %s\t\n", v, k) }
	row("records produced (events, duplicates, bad records)", s.Records)
	row("records consumed", c.Consumed)
	row("applied", c.Applied)
	row("deleted", c.Deleted)
	row("stale snapshots dropped", c.Stale)
	row("duplicate deltas dropped", c.Duplicates)
	row("deltas held behind a gap", c.Held)
	row("held deltas covered by a snapshot or delete", c.Covered)
	row("gaps closed by wait", c.ClosedByWait)
	row("gaps closed by re-read", c.ClosedByReread)
	row("gaps closed by snapshot", c.ClosedBySnapshot)
	row("conflicts", c.Conflicts)
	row("quarantined", c.Quarantined)
	row("authority requests", authRequests)
	row("time", s.Elapsed.Round(time.Millisecond))
	row("events/s", fmt.Sprintf("%.0f", float64(c.Consumed)/s.Elapsed.Seconds()))
	w.Flush()
	fmt.Fprintln(out)
	if s.OK() {
		fmt.Fprintf(out, "verified: %d/%d jobs match\n", s.Verified, s.Jobs)
		return
	}
	fmt.Fprintf(out, "verified: %d/%d jobs match; first differences:\n", s.Verified, s.Jobs)
	for i, m := range s.Mismatches {
		if i == 10 {
			fmt.Fprintf(out, "  ... and %d more\n", len(s.Mismatches)-10)
			break
		}
		fmt.Fprintf(out, "  %s\n", m)
	}
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/projector/projector/projection"
	"github.com/projector/projector/snapshot"
	"github.com/projector/projector/store"
)

type runOpts struct {
	databaseURL     string
	brokers         listFlag
	topic           string
	group           string
	start           string
	memory          memoryLimit
	schema          string
	table           string
	batchSize       int
	batchLinger     time.Duration
	batchesInFlight int
	httpAddr        string
	owner           string
	readyMaxLag     int64
	stallTimeout    time.Duration
	kafka           kafkaFlags
	cacheBytes      byteSize
	log             logFlags
	gap             gapFlags
	// tombstoneRetention is how long a deleted job's tombstone is kept;
	// 0 keeps them for ever.
	tombstoneRetention time.Duration
	groupTiming        groupFlags
	bounds             boundFlags
	// sqs chooses the source (run only; rebuild reads Kafka).
	sqs sqsFlags
	// api is the read-your-writes long-poll (run only).
	api apiFlags
}

// boundFlags are the bounds on the transactions that lock a partition's
// row (store.Config), so a frozen or cut-off instance cannot hold its
// partitions for ever, and a batch that legitimately runs long can be let.
type boundFlags struct {
	claimLock, idle, statement time.Duration
}

func (b *boundFlags) register(fs *flag.FlagSet) {
	d := store.Config{}.WithDefaults()
	fs.DurationVar(&b.claimLock, "claim-lock-timeout", d.ClaimLockTimeout, "how long one claim of a partition waits for the previous owner's open batch\ntransaction before it logs why and tries again")
	fs.DurationVar(&b.idle, "idle-in-transaction-timeout", d.IdleInTransactionTimeout, "PostgreSQL ends a batch transaction whose client sent nothing for this long\n(a frozen or cut-off instance) and so releases its partition")
	fs.DurationVar(&b.statement, "statement-timeout", d.StatementTimeout, "longest one statement of a batch transaction may run; raise it if batches\nlegitimately take longer. A batch transaction is given up after twice this\n(at least 2m) and retried; --stall-timeout must be at least twice this")
}

func (b *boundFlags) validate() error {
	for _, f := range []struct {
		name, example string
		d             time.Duration
	}{{"claim-lock-timeout", "2s", b.claimLock}, {"idle-in-transaction-timeout", "10s", b.idle}, {"statement-timeout", "5m", b.statement}} {
		if f.d < time.Millisecond {
			return usagef("--%s %s: must be at least 1ms, e.g. --%s %s", f.name, f.d, f.name, f.example)
		}
	}
	return nil
}

// storeConfig is the store's configuration: names and bounds.
func (o *runOpts) storeConfig() store.Config {
	return store.Config{Schema: o.schema, Table: o.table,
		ClaimLockTimeout: o.bounds.claimLock, IdleInTransactionTimeout: o.bounds.idle, StatementTimeout: o.bounds.statement}
}

// groupFlags are the consumer group's timings.
type groupFlags struct {
	session, heartbeat, rebalance, joinBackoff time.Duration
}

func (g *groupFlags) register(fs *flag.FlagSet) {
	d := projection.Config{}.WithDefaults()
	fs.DurationVar(&g.session, "group-session-timeout", d.SessionTimeout, "how long the group coordinator waits for a heartbeat before it\nmoves an instance's partitions to the others (the broker bounds it:\ngroup.min.session.timeout.ms, group.max.session.timeout.ms)")
	fs.DurationVar(&g.heartbeat, "group-heartbeat-interval", d.HeartbeatInterval, "how often an instance tells the coordinator it is alive;\nbelow --group-session-timeout, usually a third of it or less")
	fs.DurationVar(&g.rebalance, "group-rebalance-timeout", d.RebalanceTimeout, "how long the coordinator waits for every member to rejoin in a rebalance")
	fs.DurationVar(&g.joinBackoff, "group-join-backoff", d.JoinGroupBackoff, "wait before joining the group again after a failed join")
}

func (g *groupFlags) validate() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"group-session-timeout", g.session}, {"group-heartbeat-interval", g.heartbeat},
		{"group-rebalance-timeout", g.rebalance}, {"group-join-backoff", g.joinBackoff}} {
		if err := positive(f.name, f.d); err != nil {
			return err
		}
	}
	if g.heartbeat >= g.session {
		return usagef("--group-heartbeat-interval %s must be below --group-session-timeout %s (a third of it or less is usual)", g.heartbeat, g.session)
	}
	return nil
}

func (g *groupFlags) apply(c *projection.Config) {
	c.SessionTimeout = g.session
	c.HeartbeatInterval = g.heartbeat
	c.RebalanceTimeout = g.rebalance
	c.JoinGroupBackoff = g.joinBackoff
}

// gapFlags configure the gap detector's policy chain.
type gapFlags struct {
	wait            time.Duration
	reread          bool
	rereadWindow    time.Duration
	rereadMaxBytes  int64
	snapshotURL     string
	snapshotTimeout time.Duration
	snapshotMax     time.Duration
	// snapshotMaxSet says --snapshot-timeout-max was given: when it was
	// not, it is at least --snapshot-timeout.
	snapshotMaxSet bool
	snapshotConc   int
	// snapshotRedirects is which redirects of the authority are followed.
	snapshotRedirects string
	retryMax          time.Duration
	logRetention      time.Duration
	logMaxRows        int
}

func (g *gapFlags) register(fs *flag.FlagSet) {
	d := projection.Config{}.WithDefaults()
	fs.DurationVar(&g.wait, "gap-wait", d.GapWait, "how long a delta held behind a missing version waits for it to arrive\nbefore re-read and snapshot run; 0 skips waiting")
	fs.BoolVar(&g.reread, "reread", true, "re-read step: read the job's row and every partition of the log again\nfor the missing versions (--reread=false turns it off)")
	fs.DurationVar(&g.rereadWindow, "reread-window", d.RereadWindow, "how far before the first held delta the log re-read starts")
	fs.Int64Var(&g.rereadMaxBytes, "reread-max-bytes", d.RereadMaxBytes, "most bytes one log re-read reads")
	fs.StringVar(&g.snapshotURL, "snapshot-url", "", "trusted snapshot authority: GET {url}/jobs/{job_id} returns the job's snapshot;\nempty turns the snapshot step off")
	fs.DurationVar(&g.snapshotTimeout, "snapshot-timeout", d.SnapshotTimeout, "timeout of a held job's first request to the authority, body included")
	fs.DurationVar(&g.snapshotMax, "snapshot-timeout-max", d.SnapshotTimeoutMax, "longest timeout a job's requests to the authority grow to: each request\ncut by its timeout gives the job's next twice the time, in the slow lane,\nuntil the gap closes; equal to --snapshot-timeout, requests never grow")
	if f := fs.Lookup("snapshot-timeout-max"); f != nil {
		f.Value = setTracker{Value: f.Value, set: &g.snapshotMaxSet}
	}
	fs.StringVar(&g.snapshotRedirects, "snapshot-redirects", string(d.SnapshotRedirects), "which redirects of the authority are followed: same-origin (to its own\nscheme, host and port, at most 5 per request) or none; a redirect not\nfollowed ends the fetch and the job stays held")
	fs.IntVar(&g.snapshotConc, "snapshot-concurrency", d.SnapshotConcurrency, "most requests to the authority in flight, not counting slow ones:\na request running past 3 x the median answer time (at least 50ms) leaves\nfor a slow lane of as many more, freeing its slot, and is cut at 3 x that\n(at once if the slow lane is full); a job found slow starts its next\nrequest in the slow lane, which runs to the job's timeout")
	fs.DurationVar(&g.retryMax, "gap-retry-max", d.GapRetryMax, "longest backoff between attempts that leave a gap held")
	fs.DurationVar(&g.logRetention, "gap-log-retention", d.GapLogRetention, "how long closed gaps stay in the gap log (projector explain shows them)")
	fs.IntVar(&g.logMaxRows, "gap-log-max-rows", d.GapLogMaxRows, "most rows the gap log keeps; the oldest beyond are pruned")
}

func (g *gapFlags) validate() error {
	if g.wait < 0 {
		return usagef("--gap-wait %s: must not be negative (0 skips waiting)", g.wait)
	}
	if g.rereadWindow <= 0 {
		return usagef("--reread-window %s: must be positive, e.g. --reread-window 10m", g.rereadWindow)
	}
	if g.rereadMaxBytes <= 0 {
		return usagef("--reread-max-bytes %d: must be positive", g.rereadMaxBytes)
	}
	if g.snapshotURL != "" {
		if _, err := snapshot.NewClient(g.snapshotURL); err != nil {
			return usagef("--snapshot-url: %v", err)
		}
	}
	if _, err := snapshot.ParseRedirects(g.snapshotRedirects); err != nil {
		return usagef("--snapshot-redirects %q: want same-origin or none", g.snapshotRedirects)
	}
	if g.snapshotTimeout <= 0 || g.snapshotMax <= 0 || g.snapshotConc <= 0 || g.retryMax <= 0 {
		return usagef("--snapshot-timeout, --snapshot-timeout-max, --snapshot-concurrency and --gap-retry-max must be positive")
	}
	if g.snapshotMax < g.snapshotTimeout {
		return usagef("--snapshot-timeout-max %s is below --snapshot-timeout %s: it caps how long a slow job's requests grow; set it to %s or more (equal: requests never grow)",
			g.snapshotMax, g.snapshotTimeout, g.snapshotTimeout)
	}
	if g.logRetention <= 0 {
		return usagef("--gap-log-retention %s: must be positive, e.g. 168h", g.logRetention)
	}
	if g.logMaxRows <= 0 {
		return usagef("--gap-log-max-rows %d: must be positive", g.logMaxRows)
	}
	return nil
}

func (g *gapFlags) apply(c *projection.Config) {
	c.GapWait, c.GapWaitOff = g.wait, g.wait == 0
	c.NoReread = !g.reread
	c.RereadWindow = g.rereadWindow
	c.RereadMaxBytes = g.rereadMaxBytes
	c.SnapshotURL = g.snapshotURL
	c.SnapshotTimeout = g.snapshotTimeout
	c.SnapshotTimeoutMax = g.snapshotMax
	if !g.snapshotMaxSet {
		// A --snapshot-timeout above the default cap raises the cap.
		c.SnapshotTimeoutMax = max(g.snapshotMax, g.snapshotTimeout)
	}
	c.SnapshotConcurrency = g.snapshotConc
	c.SnapshotRedirects = snapshot.Redirects(g.snapshotRedirects)
	c.GapRetryMax = g.retryMax
	c.GapLogRetention = g.logRetention
	c.GapLogMaxRows = g.logMaxRows
}

var runCommand = &command{
	name:    "run",
	summary: "the daemon: consume job events and keep the read model in PostgreSQL",
	usage: `projector run consumes --topic from --brokers as consumer group --group and
projects every job event into the read model in DATABASE_URL. Positions are
stored in PostgreSQL in the same transaction as the writes; each partition's
owner is fenced so a consumer that lost its partition cannot write.

It serves /healthz (its loops are alive), /readyz (the topic exists, it is in
a group generation, PostgreSQL answered in the last 5s), /status (JSON) and
Prometheus /metrics on --http-addr. A missing topic is waited for, not ready.
With --kafka-tls* and --kafka-sasl-* every connection to Kafka is secured;
brokers that refuse the credentials or certificate stop it with exit 1.
SIGINT or SIGTERM finishes the batch in flight, commits and exits 0.

With --source sqs it receives from the SQS FIFO queue --sqs-queue-url instead
(credentials from the standard AWS chain): any number of instances may read
one queue; a message is deleted only after the transaction that applied, held
or quarantined it committed, and one delivered twice is dropped as a
duplicate. /readyz then checks that the queue answers, and the lag is the
queue's approximate visible and in-flight messages. SQS refusing the
credentials or their permission on the queue stops it with exit 1.

Example:
  DATABASE_URL=postgres://app@db:5432/app projector run --brokers kafka-1:9092,kafka-2:9092
  DATABASE_URL=postgres://app@db:5432/app projector run --source sqs \
      --sqs-queue-url https://sqs.eu-west-1.amazonaws.com/123456789012/job-events.fifo`,
	flags: func(fs *flag.FlagSet) any {
		o := &runOpts{}
		d := projection.Config{}.WithDefaults()
		o.register(fs, d.Group, "")
		fs.StringVar(&o.start, "start", d.Start, "where a partition never projected before starts: earliest or latest")
		o.sqs.register(fs)
		o.api.register(fs)
		return o
	},
	run: func(ctx context.Context, env *cmdEnv, opts any) error {
		o := opts.(*runOpts)
		logger, err := o.log.logger(env.stderr)
		if err != nil {
			return err
		}
		if err := o.validate(); err != nil {
			return err
		}
		if err := o.api.validate(); err != nil {
			return err
		}
		warnUnverifiedTLS(logger, o.databaseURL)
		cfg := o.storeConfig()
		cfg.Notify = o.api.notify || o.api.addr != ""
		st, err := openStoreWaiting(ctx, o.databaseURL, cfg, logger)
		if err != nil {
			if ctx.Err() != nil {
				// SIGINT or SIGTERM while starting (connecting, or
				// waiting for another instance's migration): nothing was
				// begun, so this is a clean stop, not a failure.
				logger.Info("stopped while starting", "err", err)
				return nil
			}
			return err
		}
		defer st.Close()
		// The limit first: the default of batches in flight fits in it.
		o.memory.apply(logger, int64(o.cacheBytes))
		p, err := projection.New(o.config(st, logger))
		if err != nil {
			return &usageError{err.Error()}
		}
		logger.Info("batches in flight", "bound", p.Config().BatchesInFlight)
		stop, err := o.serve(ctx, p, logger)
		if err != nil {
			return err
		}
		defer stop()
		positions := o.topic // what /wait?partition= means; SQS stores no positions
		if o.sqs.source == sourceSQS {
			positions = ""
		}
		stopAPI, err := o.api.serve(ctx, o.databaseURL, o.storeConfig(), p, positions, logger)
		if err != nil {
			return err
		}
		defer stopAPI()
		return refusedGroup(p.Run(ctx))
	},
}

// refusedGroup makes a consumer group or queue that another projection
// works a usage error (exit 2): the operator must pick another.
func refusedGroup(err error) error {
	var gc *projection.GroupConflictError
	if errors.As(err, &gc) {
		return &codeError{code: exitUsage, msg: err.Error()}
	}
	return err
}

// defaultHTTPAddr serves health, status and metrics when --http-addr is
// not set.
const defaultHTTPAddr = ":8080"

// register adds the engine's flags, shared by run and rebuild.
func (o *runOpts) register(fs *flag.FlagSet, group, httpAddr string) {
	d := projection.Config{}.WithDefaults()
	registerStoreFlags(fs, &o.databaseURL, &o.schema, &o.table)
	fs.Var(&o.brokers, "brokers", "Kafka bootstrap brokers, comma-separated host:port (required)")
	fs.StringVar(&o.topic, "topic", d.Topic, "topic to consume")
	fs.StringVar(&o.group, "group", group, "Kafka consumer group; instances with the same group share the partitions\n(default: the group the projection recorded when it first ran, else\nprojector-<schema>.<table>; one given here is recorded as the projection's;\na group another projection works is refused with exit 2)")
	fs.IntVar(&o.batchSize, "batch-size", d.BatchSize, "most records per batch transaction")
	fs.DurationVar(&o.batchLinger, "batch-linger", d.BatchLinger, "how long a batch waits for more records after its first; 0 waits for none:\na batch takes what has arrived, and records that come while one commits make\nthe next, so batches grow with the load and a quiet stream is not delayed")
	fs.IntVar(&o.batchesInFlight, "batches-in-flight", 0, "most batches the instance plans and writes at once, whatever its partitions;\n0 (the default) picks 2 for each CPU the process may use, from 8 to 32, or,\nunder a memory limit (--memory-limit), as many as fit in it beyond\n--cache-bytes at 9KiB a record of --batch-size, at least 2 (3 at the\ndefaults where no container limit is found); -1 bounds nothing. A batch\nbeing planned and written holds its records decoded, the rows it read and\nits statement (several KB a record), so the bound keeps that memory from\ngrowing with the partitions; with a bound below the partitions, a partition\nwaits for another's transaction at times")
	usage := "address for /healthz, /readyz, /status and /metrics; \"off\" disables it"
	if httpAddr == "" {
		usage += "\n(default :8080; if :8080 is taken, for example by a second instance on the\nsame host, the server is skipped with a warning: set it to make that an error)"
	}
	fs.StringVar(&o.httpAddr, "http-addr", httpAddr, usage)
	fs.StringVar(&o.owner, "owner", "", "this instance's name in the partitions table (default host/pid)")
	fs.Int64Var(&o.readyMaxLag, "ready-max-lag", 0, "with a positive value, /readyz fails while this instance's total lag\nis above it; 0 leaves lag out of readiness")
	fs.DurationVar(&o.stallTimeout, "stall-timeout", d.StallTimeout,
		"a partition with lag whose position has not moved for this long is stalled:\n/healthz fails, projector_stalls_total counts it, and run exits 1 so a\nsupervisor starts it again; a loop silent this long fails /healthz too")
	o.kafka.register(fs)
	o.cacheBytes = byteSize(d.CacheBytes)
	fs.Var(&o.cacheBytes, "cache-bytes", "memory budget of the cache of job rows and held deltas, one `size` for the whole\ninstance (64MiB, 512KiB, 1GiB or a number of bytes); least recently used\nrows are evicted, held jobs are kept and past half of it their deltas stay\nin PostgreSQL")
	o.log.register(fs)
	o.gap.register(fs)
	fs.DurationVar(&o.tombstoneRetention, "tombstone-retention", d.TombstoneRetention,
		"how long a deleted job's tombstone is kept: until then no event at or below the\ndelete's version brings the job back; after it, one older than the delete can;\n0 keeps them for ever")
	o.groupTiming.register(fs)
	o.bounds.register(fs)
	o.memory.register(fs)
}

func (o *runOpts) validate() error {
	if err := o.sqs.validate(); err != nil {
		return err
	}
	if o.sqs.source != sourceSQS {
		if err := checkBrokers(o.brokers); err != nil {
			return err
		}
	}
	if err := checkHTTPAddr(o.httpAddr); err != nil {
		return err
	}
	if err := checkStoreNames(o.schema, o.table); err != nil {
		return err
	}
	if o.cacheBytes <= 0 {
		return usagef("--cache-bytes %s: must be positive, e.g. --cache-bytes 64MiB", o.cacheBytes.String())
	}
	if o.start != "earliest" && o.start != "latest" {
		return usagef("--start %q: want earliest or latest", o.start)
	}
	if o.topic == "" {
		return usagef("--topic must not be empty")
	}
	if o.batchSize < 1 || o.batchSize > 1_000_000 {
		return usagef("--batch-size %d: must be from 1 to 1000000", o.batchSize)
	}
	if o.batchesInFlight < -1 {
		return usagef("--batches-in-flight %d: want -1 (no bound), 0 (the default: 2 a CPU, from 8 to 32, fewer under a memory limit) or a bound", o.batchesInFlight)
	}
	if o.batchLinger < 0 {
		return usagef("--batch-linger %s: must be zero (take what has arrived) or a positive duration such as 5ms", o.batchLinger)
	}
	if o.stallTimeout <= 0 {
		return usagef("--stall-timeout %s: must be positive, e.g. --stall-timeout 2m", o.stallTimeout)
	}
	if o.readyMaxLag < 0 {
		return usagef("--ready-max-lag %d: must not be negative (0 turns it off)", o.readyMaxLag)
	}
	if _, err := o.kafka.apply(o.brokers); err != nil {
		return err
	}
	if o.tombstoneRetention < 0 {
		return usagef("--tombstone-retention %s: must not be negative (e.g. 168h; 0 keeps tombstones for ever)", o.tombstoneRetention)
	}
	if err := o.groupTiming.validate(); err != nil {
		return err
	}
	if err := o.bounds.validate(); err != nil {
		return err
	}
	// A batch transaction may legitimately run as long as twice the
	// statement timeout: the progress watchdog must not stop the instance
	// in the middle of one.
	if o.stallTimeout < 2*o.bounds.statement {
		return usagef("--stall-timeout %s is below twice --statement-timeout %s: a batch may legitimately run that long and the watchdog would stop the instance in the middle of it; raise --stall-timeout to %s or more",
			o.stallTimeout, o.bounds.statement, 2*o.bounds.statement)
	}
	return o.gap.validate()
}

// kafkaConfig is the brokers with their TLS and SASL settings; validate
// has checked them.
func (o *runOpts) kafkaConfig() projection.Kafka {
	k, _ := o.kafka.apply(o.brokers)
	return k
}

func (o *runOpts) config(st *store.Store, logger *slog.Logger) projection.Config {
	k := o.kafkaConfig()
	cfg := projection.Config{
		Brokers: o.brokers, TLS: k.TLS, SASL: k.SASL, Isolation: k.Isolation, Topic: o.topic, Group: o.group, Start: o.start,
		BatchSize: o.batchSize, BatchLinger: o.batchLinger, BatchesInFlight: o.batchesInFlight, Owner: o.owner, ReadyMaxLag: o.readyMaxLag, StallTimeout: o.stallTimeout,
		Store: st, Logger: logger, CacheBytes: int64(o.cacheBytes),
	}
	o.gap.apply(&cfg)
	cfg.TombstoneRetention, cfg.TombstonesForever = o.tombstoneRetention, o.tombstoneRetention == 0
	o.groupTiming.apply(&cfg)
	if o.sqs.source == sourceSQS {
		cfg.Source, cfg.SQS, cfg.Brokers, cfg.Topic = projection.SourceSQS, o.sqs.config(), nil, ""
	}
	return cfg
}

// serve starts the health, status and metrics server unless it is off.
func (o *runOpts) serve(ctx context.Context, p *projection.Projector, logger *slog.Logger) (func(), error) {
	if o.httpAddr == "off" {
		return func() {}, nil
	}
	addr, chosen := o.httpAddr, o.httpAddr != ""
	if !chosen {
		addr = defaultHTTPAddr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if chosen {
			return nil, fmt.Errorf("--http-addr %s: %w", addr, err)
		}
		logger.Warn("health, status and metrics are not served: the default address is taken; set --http-addr", "addr", addr, "err", err)
		return func() {}, nil
	}
	srv := &http.Server{Handler: p.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	logger.Info("serving health, status and metrics", "addr", ln.Addr().String())
	return func() { _ = srv.Shutdown(context.WithoutCancel(ctx)) }, nil
}

func registerStoreFlags(fs *flag.FlagSet, url, schema, table *string) {
	fs.StringVar(url, "database-url", "", "PostgreSQL connection string, e.g. postgres://user:pass@host:5432/db (required)")
	fs.StringVar(schema, "schema", "public", "PostgreSQL schema of the read model and the projector's tables")
	fs.StringVar(table, "table", "jobs", "read-model table; also names the projection's positions")
}

// openStoreWaiting is [openProjection] for the daemon: a server that does not
// answer yet (a database restarting, a network not up) is waited for with
// backoff, logged at the start and at most every 30 s, so a fleet started
// before its database comes up by itself. Settings the server refuses
// (password, database, privileges) end at once with exit 1, and bad
// settings with exit 2.
func openStoreWaiting(ctx context.Context, url string, cfg store.Config, log *slog.Logger) (*store.Store, error) {
	start := time.Now()
	var lastLog time.Time
	bo := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		st, err := openProjection(ctx, url, cfg, migrated)
		if err == nil {
			if attempt > 1 {
				log.Info("PostgreSQL answers; starting", "waited", time.Since(start).Round(time.Millisecond).String(), "attempts", attempt)
			}
			return st, nil
		}
		var ue *usageError
		if errors.As(err, &ue) || ctx.Err() != nil || !store.IsUnreachable(err) {
			return nil, err
		}
		if attempt == 1 || time.Since(lastLog) >= 30*time.Second {
			lastLog = time.Now()
			log.Warn("PostgreSQL does not answer at start; waiting for it (not ready until it does)",
				"err", err, "attempt", attempt, "retry_in", bo.String())
		}
		t := time.NewTimer(bo)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("stopped while waiting for PostgreSQL: %w", err)
		case <-t.C:
		}
		bo = min(bo*2, 10*time.Second)
	}
}

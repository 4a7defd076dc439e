package projection

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/snapshot"
	"github.com/projector/projector/source"
	"github.com/projector/projector/source/kafka/kafkacfg"
	"github.com/projector/projector/store"
)

// Config is everything the engine needs. Zero fields take the defaults of
// [Config.WithDefaults]; [Config.Validate] says what to fix.
type Config struct {
	// From is the source of the projection's lanes, built outside the
	// engine (source/kafka's Group, source/sqs's Queue, or any other
	// [source.Source]), for one Projector: a source is run once. Nil: the
	// source that Source and its settings below describe, built by name
	// ([source.Build]). A [Rebuild] refuses it: it builds its own.
	From source.Source
	// Source is where records come from: SourceKafka (the default: Brokers,
	// Topic, Group) or SourceSQS (the queue SQS names).
	Source string
	// SQS is the queue, with Source SourceSQS.
	SQS SQS

	Brokers []string
	// TLS and SASL secure every connection to the brokers (see [Kafka]).
	TLS  *tls.Config
	SASL *SASL
	// Isolation is how records written in Kafka transactions are read:
	// ReadCommitted (the default) or ReadUncommitted (see [Kafka]).
	Isolation string
	Topic     string
	// Group is the Kafka consumer group. Empty: the group the projection
	// recorded when it first ran, or [DefaultGroup] for a new projection
	// ([LegacyGroup] for one that ran before groups were recorded). A group
	// given here is recorded as the projection's.
	Group string
	// Start is where a partition never seen by this projection begins:
	// "earliest" (default) or "latest".
	Start string
	// BatchSize caps the records per batch transaction.
	BatchSize int
	// BatchLinger is how long a batch waits for more records after its
	// first. Zero (the default) waits for none: a batch takes what has
	// arrived, so records that come while a batch commits make the next
	// one, and batches grow with the load without delaying a quiet stream.
	BatchLinger time.Duration
	// BatchesInFlight bounds the batches the instance plans and writes at
	// once, whatever its number of partitions (zero: [DefaultBatchesInFlight]
	// or, under a soft memory limit, [BatchesInFlightWithin] it; -1: no
	// bound). Each holds, while it is
	// planned and written, its records decoded, the rows it read and its
	// encoded statement; the records fetched stay with each partition all
	// the same. A bound below the partitions makes a partition wait for
	// another's transaction at times, and batches held up by a lock in
	// PostgreSQL then hold up the instance's other partitions too.
	BatchesInFlight int
	// MaxWait is how long the broker holds a fetch with nothing new to
	// return: how soon an idle partition's fetcher asks again.
	MaxWait time.Duration
	// Owner names this instance in the partitions table.
	Owner string
	// CacheBytes is the memory budget, in bytes, of the cache of job rows
	// and held deltas that every partition of this instance shares.
	CacheBytes int64

	Store  *store.Store
	Logger *slog.Logger

	// GapWait is how long a held delta waits for the missing versions to
	// arrive in the log before re-read and snapshot run (zero: 10s);
	// GapWaitOff skips waiting.
	GapWait    time.Duration
	GapWaitOff bool
	// NoReread turns the re-read step off.
	NoReread bool
	// RereadWindow is how far before a job's oldest hold the log re-read
	// starts, found by offset-for-timestamp lookup.
	RereadWindow time.Duration
	// RereadMaxBytes and RereadMaxTime bound one re-read of the log.
	RereadMaxBytes int64
	RereadMaxTime  time.Duration
	// SnapshotURL is the trusted snapshot authority; empty turns the
	// snapshot step off.
	SnapshotURL string
	// SnapshotTimeout bounds a held job's first request to the authority.
	SnapshotTimeout time.Duration
	// SnapshotTimeoutMax caps how far a job's requests get more time:
	// each one cut by its timeout doubles the next one's, so an authority
	// slower than SnapshotTimeout still heals the job. The time falls back
	// to SnapshotTimeout when the gap closes. Equal to SnapshotTimeout,
	// every request gets SnapshotTimeout. Default
	// [DefaultSnapshotTimeoutMax].
	SnapshotTimeoutMax time.Duration
	// SnapshotRedirects is which redirects of the authority are followed:
	// snapshot.SameOrigin (the default), to the authority's own scheme,
	// host and port, at most snapshot.MaxRedirects per request, or
	// snapshot.NoRedirects.
	SnapshotRedirects snapshot.Redirects
	// SnapshotConcurrency bounds requests to the authority in flight.
	SnapshotConcurrency int
	// SnapshotMaxElapsed bounds one fetch's retries; the gap's own backoff
	// (GapRetryMax) takes over after it.
	SnapshotMaxElapsed time.Duration
	// GapRetryMin and GapRetryMax bound the backoff between attempts
	// that leave a gap held.
	GapRetryMin time.Duration
	GapRetryMax time.Duration

	// TombstoneRetention is how long a deleted job's tombstone is kept
	// before it is pruned (zero: DefaultTombstoneRetention);
	// TombstonesForever keeps them for ever.
	TombstoneRetention time.Duration
	TombstonesForever  bool
	// GapLogRetention and GapLogMaxRows bound the gap log: rows closed
	// longer ago, and the oldest rows beyond the count, are pruned in small
	// batches in the background.
	GapLogRetention time.Duration
	GapLogMaxRows   int

	// Group timing; the defaults suit a real cluster.
	HeartbeatInterval time.Duration
	SessionTimeout    time.Duration
	RebalanceTimeout  time.Duration
	JoinGroupBackoff  time.Duration
	// PartitionWatchInterval is how often the topic is checked for new
	// partitions (which forces a rebalance).
	PartitionWatchInterval time.Duration

	// ReadyMaxLag, when positive, keeps /readyz failing while the total lag
	// of this instance's partitions is above it.
	ReadyMaxLag int64
	// StallTimeout is how long a loop (a partition worker, the health
	// monitor) may go without a sign of life before /healthz fails, and
	// how long a partition with lag may go without its position moving
	// before Run ends with [ErrStalled]. Default [DefaultStallTimeout].
	StallTimeout time.Duration
	// Version and Revision label projector_build_info; empty takes them
	// from the binary's build information.
	Version, Revision string

	// testBeforeApply, set by this package's tests, runs before each batch
	// commit of this instance's workers: a hook per instance, so tests
	// that pause or fence a batch can run in parallel.
	testBeforeApply func(partition int)
	// testAuthorityRequest, set by this package's tests, is told of every
	// request this instance's fetchers make to the authority.
	testAuthorityRequest func(authorityRequest)
}

// Kafka is the broker settings of c.
func (c Config) Kafka() Kafka {
	return Kafka{Brokers: c.Brokers, TLS: c.TLS, SASL: c.SASL, Isolation: c.Isolation}
}

// Sources of records.
const (
	SourceKafka = "kafka"
	SourceSQS   = "sqs"
)

// WithDefaults returns c with its zero fields set.
func (c Config) WithDefaults() Config {
	if c.Source == "" {
		c.Source = SourceKafka
	}
	if c.Source == SourceSQS {
		c.SQS = c.SQS.WithDefaults()
		// The queue stands for the topic in the store's rows.
		if c.Topic == "" {
			c.Topic = c.SQS.Name()
		}
	}
	if c.Topic == "" {
		c.Topic = "job-events"
	}
	if c.Start == "" {
		c.Start = "earliest"
	}
	if c.Isolation == "" {
		c.Isolation = ReadCommitted
	}
	if c.BatchSize == 0 {
		c.BatchSize = 5000
	}
	if c.MaxWait == 0 {
		c.MaxWait = time.Second
	}
	if c.Owner == "" {
		host, _ := os.Hostname()
		c.Owner = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	if c.CacheBytes == 0 {
		c.CacheBytes = DefaultCacheBytes
	}
	if c.BatchesInFlight == 0 {
		c.BatchesInFlight = BatchesInFlightWithin(debug.SetMemoryLimit(-1), c.CacheBytes, c.BatchSize)
	}
	if c.GapWait == 0 && !c.GapWaitOff {
		c.GapWait = 10 * time.Second
	}
	if c.RereadWindow == 0 {
		c.RereadWindow = 10 * time.Minute
	}
	if c.RereadMaxBytes == 0 {
		c.RereadMaxBytes = 256 << 20
	}
	if c.RereadMaxTime == 0 {
		c.RereadMaxTime = 30 * time.Second
	}
	if c.SnapshotTimeout == 0 {
		c.SnapshotTimeout = 5 * time.Second
	}
	if c.SnapshotTimeoutMax == 0 {
		c.SnapshotTimeoutMax = max(DefaultSnapshotTimeoutMax, c.SnapshotTimeout)
	}
	if c.SnapshotRedirects == "" {
		c.SnapshotRedirects = snapshot.SameOrigin
	}
	if c.SnapshotConcurrency == 0 {
		c.SnapshotConcurrency = 4
	}
	if c.SnapshotMaxElapsed == 0 {
		c.SnapshotMaxElapsed = 30 * time.Second
	}
	if c.GapRetryMin == 0 {
		c.GapRetryMin = time.Second
	}
	if c.GapRetryMax == 0 {
		c.GapRetryMax = 5 * time.Minute
	}
	if c.TombstoneRetention == 0 && !c.TombstonesForever {
		c.TombstoneRetention = DefaultTombstoneRetention
	}
	if c.GapLogRetention == 0 {
		c.GapLogRetention = 7 * 24 * time.Hour
	}
	if c.GapLogMaxRows == 0 {
		c.GapLogMaxRows = 100_000
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	// A crashed instance's partitions move after SessionTimeout: short
	// enough to fail over quickly, above brokers' usual 6 s minimum.
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = time.Second
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = 10 * time.Second
	}
	if c.RebalanceTimeout == 0 {
		c.RebalanceTimeout = 30 * time.Second
	}
	if c.JoinGroupBackoff == 0 {
		c.JoinGroupBackoff = 2 * time.Second
	}
	if c.PartitionWatchInterval == 0 {
		c.PartitionWatchInterval = 5 * time.Second
	}
	if c.StallTimeout == 0 {
		c.StallTimeout = DefaultStallTimeout
	}
	if c.Version == "" {
		b := Build()
		c.Version, c.Revision = b.Version, b.Revision
	}
	return c
}

// Validate reports every setting that cannot work, joined. It checks c as
// it is: apply the defaults first ([Config.WithDefaults], as [New] does).
func (c Config) Validate() error {
	var errs []error
	switch c.Source {
	case SourceKafka, "":
		if len(c.Brokers) == 0 {
			errs = append(errs, errors.New("brokers: at least one broker address (host:port) is required"))
		}
	case SourceSQS:
		if err := c.SQS.Validate(); err != nil {
			errs = append(errs, err)
		}
	default:
		errs = append(errs, fmt.Errorf("source: %q is not %s or %s", c.Source, SourceKafka, SourceSQS))
	}
	for _, b := range c.Brokers {
		host, port, err := net.SplitHostPort(b)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			errs = append(errs, fmt.Errorf("brokers: %q is not a host:port address with a port from 1 to 65535", b))
		}
	}
	if c.HeartbeatInterval < 0 || c.SessionTimeout < 0 || c.RebalanceTimeout < 0 || c.JoinGroupBackoff < 0 {
		errs = append(errs, errors.New("heartbeat-interval, session-timeout, rebalance-timeout and join-group-backoff must not be negative"))
	}
	if c.HeartbeatInterval >= c.SessionTimeout {
		errs = append(errs, fmt.Errorf("heartbeat-interval %s must be below session-timeout %s", c.HeartbeatInterval, c.SessionTimeout))
	}
	if c.Topic == "" {
		errs = append(errs, errors.New("topic: required"))
	}
	if c.Start != "earliest" && c.Start != "latest" {
		errs = append(errs, fmt.Errorf("start: %q is not earliest or latest", c.Start))
	}
	if err := kafkacfg.ValidIsolation(c.Isolation); err != nil {
		errs = append(errs, err)
	}
	if c.BatchSize < 1 || c.BatchSize > 1_000_000 {
		errs = append(errs, fmt.Errorf("batch-size: %d is outside 1..1000000", c.BatchSize))
	}
	if c.BatchesInFlight < -1 {
		errs = append(errs, fmt.Errorf("batches-in-flight: %d: want -1 (no bound), 0 (the default) or a bound", c.BatchesInFlight))
	}
	if c.BatchLinger < 0 {
		errs = append(errs, fmt.Errorf("batch-linger: %s is negative", c.BatchLinger))
	}
	if c.MaxWait < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("max-wait: %s is below 100ms", c.MaxWait))
	}
	if c.GapLogRetention < 0 || c.GapLogMaxRows < 0 {
		errs = append(errs, errors.New("gap-log-retention and gap-log-max-rows must not be negative"))
	}
	if c.CacheBytes < 0 {
		errs = append(errs, fmt.Errorf("cache-bytes: %d is negative", c.CacheBytes))
	}
	if c.RereadWindow < 0 || c.RereadMaxBytes < 0 || c.RereadMaxTime < 0 {
		errs = append(errs, errors.New("reread-window, reread-max-bytes and reread-max-time must not be negative"))
	}
	if c.SnapshotTimeout < 0 || c.SnapshotTimeoutMax < 0 || c.SnapshotConcurrency < 0 || c.GapRetryMin < 0 || c.GapRetryMax < 0 {
		errs = append(errs, errors.New("snapshot-timeout, snapshot-timeout-max, snapshot-concurrency, gap-retry-min and gap-retry-max must not be negative"))
	} else if c.SnapshotTimeoutMax < c.SnapshotTimeout {
		errs = append(errs, fmt.Errorf("snapshot-timeout-max %s is below snapshot-timeout %s: it caps the time a slow job's requests grow to (set it equal to keep every request at snapshot-timeout)",
			c.SnapshotTimeoutMax, c.SnapshotTimeout))
	}
	if c.SnapshotRedirects != "" {
		if _, err := snapshot.ParseRedirects(string(c.SnapshotRedirects)); err != nil {
			errs = append(errs, fmt.Errorf("snapshot-redirects: %w", err))
		}
	}
	if err := c.SASL.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.ReadyMaxLag < 0 {
		errs = append(errs, fmt.Errorf("ready-max-lag: %d is negative", c.ReadyMaxLag))
	}
	if c.StallTimeout < 0 {
		errs = append(errs, fmt.Errorf("stall-timeout: %s is negative", c.StallTimeout))
	}
	if c.TombstoneRetention < 0 {
		errs = append(errs, fmt.Errorf("tombstone-retention: %s is negative (TombstonesForever keeps them for ever)", c.TombstoneRetention))
	}
	if c.GapWait < 0 {
		errs = append(errs, fmt.Errorf("gap-wait: %s is negative (GapWaitOff skips waiting)", c.GapWait))
	}
	if c.GapWaitOff && c.GapWait > 0 {
		errs = append(errs, fmt.Errorf("gap-wait: %s given with GapWaitOff: set one of them", c.GapWait))
	}
	if c.TombstonesForever && c.TombstoneRetention > 0 {
		errs = append(errs, fmt.Errorf("tombstone-retention: %s given with TombstonesForever: set one of them", c.TombstoneRetention))
	}
	if c.Store == nil {
		errs = append(errs, errors.New("store: required"))
	}
	return errors.Join(errs...)
}

// DefaultStallTimeout is how long a loop may go without a sign of life,
// and a partition with lag without progress, before the instance is
// reported wedged (/healthz) or stalled (Run ends with [ErrStalled]).
const DefaultStallTimeout = 2 * time.Minute

// DefaultSnapshotTimeoutMax is how long a slow job's requests to the
// authority may grow to by default.
const DefaultSnapshotTimeoutMax = 2 * time.Minute

// DefaultTombstoneRetention is how long tombstones are kept by default: a
// week, far longer than any event should take to arrive.
const DefaultTombstoneRetention = 7 * 24 * time.Hour

// gapWait is how long held deltas wait: none when waiting is off.
func (c Config) gapWait() time.Duration {
	if c.GapWaitOff {
		return 0
	}
	return c.GapWait
}

func (c Config) gapPolicy() gapfill.Policy {
	return gapfill.Policy{
		Wait:     c.gapWait(),
		Reread:   !c.NoReread,
		Snapshot: c.SnapshotURL != "",
		RetryMin: c.GapRetryMin,
		RetryMax: c.GapRetryMax,

		SnapshotTimeout:    c.SnapshotTimeout,
		SnapshotTimeoutMax: c.SnapshotTimeoutMax,
	}
}

// DefaultBatchesInFlight is the default of [Config.BatchesInFlight] in a
// process with no soft memory limit: two batches for each CPU the process
// may use (GOMAXPROCS), one planned while another commits, at least 8, so
// that a PostgreSQL with more cores than the instance is kept busy and a
// few partitions held up by row locks do not hold up the rest, and at most
// 32. An instance of many partitions then does not hold a batch for each:
// a batch being planned and written holds a few KB a record (11 to 18 MiB
// at 5,000 records of 200-byte states, a job each, from the difference
// between measured runs). Under a memory limit the default is
// [BatchesInFlightWithin] (docs/performance.md, docs/deploy.md).
func DefaultBatchesInFlight() int { return min(32, max(8, 2*runtime.GOMAXPROCS(0))) }

// BatchMemoryPerRecord is what a batch in flight is allowed of a soft
// memory limit, per record of the batch: about 3.3 KB a record is live
// while a batch is planned and written (spread jobs, 200-byte states), and
// the rest leaves the collector room to work without running all the time.
const BatchMemoryPerRecord = 9 << 10

// BatchesInFlightWithin is the default of [Config.BatchesInFlight] in a
// process whose soft memory limit (debug.SetMemoryLimit, GOMEMLIMIT or
// `--memory-limit`) is limit: as many batches of batchSize records as fit
// in what the limit leaves beyond the cache, BatchMemoryPerRecord a record,
// at least 2 (one planned while another commits) and at most
// [DefaultBatchesInFlight]. So a limit of 208 MiB (the default outside a
// container, [DefaultMemoryLimit]) with the 64 MiB cache and batches of
// 5,000 takes 3, a pod of 512 MiB (a limit of 435 MiB) 8. A limit of
// math.MaxInt64 or below 1 is none.
func BatchesInFlightWithin(limit, cacheBytes int64, batchSize int) int {
	n := DefaultBatchesInFlight()
	if limit <= 0 || limit == math.MaxInt64 || batchSize <= 0 {
		return n
	}
	fit := (limit - cacheBytes) / (int64(batchSize) * BatchMemoryPerRecord)
	return int(max(2, min(int64(n), fit)))
}

// WorkingMemory is what the default soft memory limit allows beyond the
// cache's budget: the records fetched for each partition (about 7 MiB a
// partition), the batches in flight, the connections' buffers and the
// rest of the process (about 15 MiB).
const WorkingMemory = 144 << 20

// DefaultMemoryLimit is the soft memory limit a projector process sets
// where no container limits it and none is given (`--memory-limit auto`):
// the cache's budget and [WorkingMemory], 208 MiB at the default cache, so
// that a process left at its defaults stays near 230 MiB resident however
// many jobs it sees. The limit is soft: a live heap above it is not
// refused, only collected more often: from about 8 partitions an instance
// nears it and from about 12 it is collected without pause, so one of many
// partitions or large states should be given a larger one.
func DefaultMemoryLimit(cacheBytes int64) int64 { return cacheBytes + WorkingMemory }

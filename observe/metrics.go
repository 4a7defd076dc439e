package observe

import (
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/projector/projector/snapshot"
)

// Metrics are one engine's Prometheus metrics, in a registry of its own
// so several engines can run in one process.
type Metrics struct {
	reg           *prometheus.Registry
	batchDuration prometheus.Histogram
	batchRecords  prometheus.Histogram
}

// NewMetrics registers in reg every collector of an instance, own being
// the one that reads the engine's counters and partitions
// ([NewCollector], or [EveryFamily] for the reference); version,
// revision and goVersion label projector_build_info.
func NewMetrics(reg *prometheus.Registry, own prometheus.Collector, version, revision, goVersion string) *Metrics {
	m := &Metrics{
		reg: reg,
		batchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "projector_batch_duration_seconds",
			Help:    "Time to plan and commit one batch transaction, retries excluded.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 120},
		}),
		batchRecords: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "projector_batch_records",
			Help:    "Records in one committed batch.",
			Buckets: []float64{1, 10, 50, 100, 500, 1000, 2500, 5000, 10000, 50000},
		}),
	}
	m.reg.MustRegister(
		// The Go collector's defaults; the live heap the last collection
		// marked (go_gc_heap_live_bytes), which beside
		// go_gc_gomemlimit_bytes says how near the soft memory limit the
		// instance runs (ProjectorMemoryNearLimit); and the CPU the
		// collector took (go_cpu_classes_gc_total_cpu_seconds_total) of
		// all the process's (go_cpu_classes_total_cpu_seconds_total).
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.GoRuntimeMetricsRule{
			Matcher: regexp.MustCompile(`^(/gc/heap/live:bytes|/cpu/classes/gc/total:cpu-seconds|/cpu/classes/total:cpu-seconds)$`),
		})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.batchDuration, m.batchRecords,
		own,
	)
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "projector_build_info",
		Help: "Always 1; the labels say which build runs.",
		ConstLabels: prometheus.Labels{
			"version": version, "revision": revision, "goversion": goVersion,
		},
	})
	build.Set(1)
	m.reg.MustRegister(build)
	return m
}

// Registry is the registry: what /metrics serves.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in Prometheus's formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Batch observes one committed batch: how long it took and its records.
func (m *Metrics) Batch(d time.Duration, records int) {
	m.batchDuration.Observe(d.Seconds())
	if records > 0 {
		m.batchRecords.Observe(float64(records))
	}
}

// family is one metric family of [projectorCollector]: a Desc says
// neither its type nor its labels, which the metric reference needs.
type family struct {
	name   string
	desc   *prometheus.Desc
	kind   prometheus.ValueType
	labels []string
}

// families are every family [projectorCollector] may export, in the order
// declared.
var families []family

func newFamily(kind prometheus.ValueType, name, help string, labels ...string) *prometheus.Desc {
	d := prometheus.NewDesc(name, help, labels, nil)
	families = append(families, family{name: name, desc: d, kind: kind, labels: labels})
	return d
}

var (
	descInfo = newFamily(prometheus.GaugeValue, "projector_info",
		"Always 1; the labels name what the instance projects: the read model's schema and table, the topic (with --source sqs, sqs:QUEUE_NAME, which stands for the topic in the store's rows) and the Kafka consumer group (empty with --source sqs, which has none). Join on instance to filter any other metric by projection.",
		"schema", "table", "topic", "group")
	descRecords = newFamily(prometheus.CounterValue, "projector_records_total",
		"Records by outcome: applied (changed the read model), stale (snapshot at or below the row's version), duplicate (delta at or below it), conflict (same version, other content; the first won), held (delta waiting behind a gap), quarantined (broke the contract; stored with its error), deleted (a delete removed the job).", "outcome")
	descCovered = newFamily(prometheus.CounterValue, "projector_held_covered_total",
		"Held deltas dropped because a snapshot or a delete covered them.")
	descTombstonesPruned = newFamily(prometheus.CounterValue, "projector_tombstones_pruned_total",
		"Tombstones removed after the tombstone retention.")
	descConsumed = newFamily(prometheus.CounterValue, "projector_records_consumed_total",
		"Records read from Kafka and committed in a batch.")
	descLost = newFamily(prometheus.CounterValue, "projector_records_lost_total",
		"Records deleted from the log (retention, compaction) before they were read.")
	descNewLogs = newFamily(prometheus.CounterValue, "projector_new_logs_total",
		"Partitions found reading a new log under the same name (a topic deleted and recreated: the stored position past the log's end, or another record at the offset last read) and read again from the new log's start.")
	descBatches = newFamily(prometheus.CounterValue, "projector_batches_total",
		"Batch transactions committed.")
	descFenced = newFamily(prometheus.CounterValue, "projector_fenced_total",
		"Batches rolled back because another owner claimed the partition.")
	descGapsOpened = newFamily(prometheus.CounterValue, "projector_gaps_opened_total",
		"Jobs that started waiting behind a gap.")
	descGapsClosed = newFamily(prometheus.CounterValue, "projector_gaps_closed_total",
		"Gaps closed, by the step that closed them: wait (the versions arrived), reread (found in the store or the log again), snapshot (a trusted snapshot).", "by")
	descAuthority = newFamily(prometheus.CounterValue, "projector_authority_requests_total",
		"Snapshot fetches from the authority by result: ok, not_found, error (after its retries).", "result")
	descAuthorityTimeouts = newFamily(prometheus.CounterValue, "projector_authority_timeouts_total",
		"Snapshot fetches whose request to the authority was cut by its timeout (counted in projector_authority_requests_total{result=\"error\"} too); each doubles its job's next timeout, from --snapshot-timeout up to --snapshot-timeout-max, until the gap closes.")
	descAuthorityInFlight = newFamily(prometheus.GaugeValue, "projector_authority_requests_in_flight",
		"Requests to the authority in flight, by the lane they count against: main (--snapshot-concurrency) or slow (requests past a few median answer times, up to --snapshot-concurrency more).", "lane")
	descAuthoritySlowMoves = newFamily(prometheus.CounterValue, "projector_authority_slow_lane_moves_total",
		"Requests to the authority that ran past the slow threshold and moved to the slow lane, freeing their main slot.")
	descAuthoritySlowFull = newFamily(prometheus.CounterValue, "projector_authority_slow_lane_full_total",
		"Requests to the authority that ran past the slow threshold while the slow lane was full, and so were cut (counted in projector_authority_slow_cut_total too).")
	descAuthoritySlowCut = newFamily(prometheus.CounterValue, "projector_authority_slow_cut_total",
		"Requests to the authority cut for slowness: past the slow threshold with the slow lane full (the job is asked in the main lane again), or moved to it and still running at 3 x the threshold (the job is found slow: its next requests start in the slow lane).")
	descAuthoritySlowStarts = newFamily(prometheus.CounterValue, "projector_authority_slow_lane_starts_total",
		"Requests to the authority started in the slow lane, for jobs found slow (their last request was cut at 3 x the slow threshold after a move, or timed out); they run to --snapshot-timeout.")
	descAuthoritySlowAfter = newFamily(prometheus.GaugeValue, "projector_authority_slow_after_seconds",
		"How long a request to the authority runs before it leaves the main lane: 3 x the median of the last 64 answers, at least 0.05; 0 until 8 answers have been seen.")
	descDBErrors = newFamily(prometheus.CounterValue, "projector_database_errors_total",
		"Failed PostgreSQL operations (batches, claims, reloads, pings); each is retried.")
	descStalls = newFamily(prometheus.CounterValue, "projector_stalls_total",
		"Partitions found with lag and no progress for the stall timeout; the instance stops at the first.")
	descHeldJobs = newFamily(prometheus.GaugeValue, "projector_held_jobs",
		"Jobs held behind a gap right now, on this instance's partitions.")
	descOldestHeld = newFamily(prometheus.GaugeValue, "projector_oldest_held_seconds",
		"Age of the oldest hold on this instance's partitions; 0 when nothing is held.")
	descLag = newFamily(prometheus.GaugeValue, "projector_partition_lag",
		"Records between the stored position and where this instance can read to, read at least every 5 s: the last stable offset with --kafka-isolation read_committed (a transaction still open is waited on, not lag), the high watermark with read_uncommitted.", "partition")
	descOpenTxn = newFamily(prometheus.GaugeValue, "projector_partition_open_transaction_seconds",
		"How long the partition has waited on a transaction still open (read_committed: every record before it is projected, the rest waits until it commits or is aborted); 0 when it waits on none.", "partition")
	descPosition = newFamily(prometheus.GaugeValue, "projector_partition_position",
		"Next offset to read, as committed in PostgreSQL (-1: none yet).", "partition")
	descEpoch = newFamily(prometheus.GaugeValue, "projector_partition_epoch",
		"Fencing epoch this instance holds the partition under.", "partition")
	descReady = newFamily(prometheus.GaugeValue, "projector_ready",
		"1 when /readyz answers 200.")
	descSQSMessages = newFamily(prometheus.GaugeValue, "projector_sqs_queue_messages",
		"With --source sqs: the queue's approximate messages, visible (waiting) or in_flight (received, not deleted), read every 5 s; their sum is the lag.", "state")
	descSQSEvents = newFamily(prometheus.CounterValue, "projector_sqs_messages_total",
		"With --source sqs: messages received, redelivered (received more than once), group_not_job_id (MessageGroupId is not the job id: no order), deleted, delete_failed (delivered again), visibility_extend_failed.", "event")
)

// Scraped is what the engine's collector reads at scrape time.
type Scraped interface {
	// Status is the engine's status, its held jobs' views included.
	Status() Status
	// Names are the read model's schema and table, and whether the
	// source is a queue (SQS), which has no consumer group.
	Names() (schema, table string, queue bool)
	// AuthorityLanes are the authority client's lanes; ok is false when
	// there is no authority.
	AuthorityLanes() (l snapshot.LaneStats, ok bool)
}

// NewCollector is the collector of the families the engine exports, read
// from s at scrape time.
func NewCollector(s Scraped) prometheus.Collector { return &projectorCollector{s: s} }

// projectorCollector reads the counters and the partition book at scrape
// time: they stay the one source of truth for /status and /metrics.
type projectorCollector struct{ s Scraped }

// Describe gives every family, whether or not this run exports it, so
// the registry checks what Collect sends.
func (c *projectorCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range families {
		ch <- f.desc
	}
}

func (c *projectorCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s.Status()
	k := s.Counters
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	schema, table, queue := c.s.Names()
	group := s.Group
	if queue {
		group = ""
	}
	gauge(descInfo, 1, schema, table, s.Topic, group)
	for _, o := range []struct {
		outcome string
		v       int64
	}{
		{"applied", k.Applied}, {"stale", k.Stale}, {"duplicate", k.Duplicates}, {"conflict", k.Conflicts},
		{"held", k.Held}, {"quarantined", k.Quarantined}, {"deleted", k.Deleted},
	} {
		counter(descRecords, o.v, o.outcome)
	}
	counter(descConsumed, k.Consumed)
	counter(descCovered, k.Covered)
	counter(descTombstonesPruned, k.TombstonesPruned)
	counter(descLost, k.Lost)
	counter(descNewLogs, k.NewLogs)
	counter(descBatches, k.Batches)
	counter(descFenced, k.Fenced)
	counter(descGapsOpened, k.GapsOpened)
	counter(descGapsClosed, k.ClosedByWait, "wait")
	counter(descGapsClosed, k.ClosedByReread, "reread")
	counter(descGapsClosed, k.ClosedBySnapshot, "snapshot")
	counter(descAuthority, k.AuthorityOK, "ok")
	counter(descAuthority, k.AuthorityNotFound, "not_found")
	counter(descAuthority, k.AuthorityError, "error")
	counter(descAuthorityTimeouts, k.AuthorityTimeouts)
	if l, ok := c.s.AuthorityLanes(); ok {
		gauge(descAuthorityInFlight, float64(l.Main), "main")
		gauge(descAuthorityInFlight, float64(l.Slow), "slow")
		counter(descAuthoritySlowMoves, l.Moved)
		counter(descAuthoritySlowFull, l.Full)
		counter(descAuthoritySlowCut, l.Cut)
		counter(descAuthoritySlowStarts, l.Started)
		gauge(descAuthoritySlowAfter, l.SlowAfter.Seconds())
	}
	counter(descDBErrors, k.DatabaseErrors)
	counter(descStalls, k.Stalls)
	gauge(descHeldJobs, float64(k.HeldJobs))
	var oldest time.Time
	for _, ps := range s.Partitions {
		part := strconv.Itoa(ps.Partition)
		if !ps.LagUnknown {
			gauge(descLag, float64(ps.Lag), part)
		}
		waited := 0.0
		if ps.OpenTransaction != nil {
			waited = time.Since(ps.OpenTransaction.Since).Seconds()
		}
		gauge(descOpenTxn, waited, part)
		gauge(descPosition, float64(ps.Position), part)
		gauge(descEpoch, float64(ps.Epoch), part)
		// A partition's view is sorted oldest first.
		if len(ps.View) > 0 && (oldest.IsZero() || ps.View[0].Since.Before(oldest)) {
			oldest = ps.View[0].Since
		}
	}
	age := 0.0
	if !oldest.IsZero() {
		age = time.Since(oldest).Seconds()
	}
	gauge(descOldestHeld, age)
	if q := s.SQS; q != nil {
		if q.Counts != nil {
			gauge(descSQSMessages, float64(q.Counts.Visible), "visible")
			gauge(descSQSMessages, float64(q.Counts.InFlight), "in_flight")
		}
		qc := q.Counters
		for _, e := range []struct {
			name string
			v    int64
		}{{"received", qc.Received}, {"redelivered", qc.Redelivered}, {"group_not_job_id", qc.GroupNotJobID},
			{"deleted", qc.Deleted}, {"delete_failed", qc.DeleteFailed}, {"visibility_extend_failed", qc.VisibilityFailures}} {
			counter(descSQSEvents, e.v, e.name)
		}
	}
	ready := 0.0
	if s.Ready {
		ready = 1
	}
	gauge(descReady, ready)
}

// EveryFamily exports one sample of every family of [NewCollector]'s
// collector, its labels empty, for the metric reference.
type EveryFamily struct{}

func (EveryFamily) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range families {
		ch <- f.desc
	}
}

func (EveryFamily) Collect(ch chan<- prometheus.Metric) {
	for _, f := range families {
		ch <- prometheus.MustNewConstMetric(f.desc, f.kind, 0, make([]string, len(f.labels))...)
	}
}

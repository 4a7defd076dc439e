package projection

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/projector/projector/event"
	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/snapshot"
)

// metrics are one Projector's Prometheus metrics, in a registry of its
// own so several projectors can run in one process.
type metrics struct {
	reg           *prometheus.Registry
	batchDuration prometheus.Histogram
	batchRecords  prometheus.Histogram
}

func newMetrics(p *Projector) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
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
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.batchDuration, m.batchRecords,
		&projectorCollector{p: p},
	)
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "projector_build_info",
		Help: "Always 1; the labels say which build runs.",
		ConstLabels: prometheus.Labels{
			"version": p.cfg.Version, "revision": p.cfg.Revision, "goversion": Build().GoVersion,
		},
	})
	build.Set(1)
	m.reg.MustRegister(build)
	return m
}

// Metrics is the Projector's registry: what /metrics serves. A program
// embedding the Projector may gather it into its own endpoint.
func (p *Projector) Metrics() prometheus.Gatherer { return p.metrics.reg }

// RegisterMetrics adds collectors of a program embedding the Projector
// (the waiters of package wait) to its registry, served on /metrics.
func (p *Projector) RegisterMetrics(cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := p.metrics.reg.Register(c); err != nil {
			return fmt.Errorf("projection: register metrics: %w", err)
		}
	}
	return nil
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

func (m *metrics) batch(d time.Duration, records int) {
	m.batchDuration.Observe(d.Seconds())
	if records > 0 {
		m.batchRecords.Observe(float64(records))
	}
}

var (
	descRecords = prometheus.NewDesc("projector_records_total",
		"Records by outcome: applied (changed the read model), stale (snapshot at or below the row's version), duplicate (delta at or below it), conflict (same version, other content; the first won), held (delta waiting behind a gap), quarantined (broke the contract; stored with its error), deleted (a delete removed the job).",
		[]string{"outcome"}, nil)
	descCovered = prometheus.NewDesc("projector_held_covered_total",
		"Held deltas dropped because a snapshot or a delete covered them.", nil, nil)
	descTombstonesPruned = prometheus.NewDesc("projector_tombstones_pruned_total",
		"Tombstones removed after the tombstone retention.", nil, nil)
	descConsumed = prometheus.NewDesc("projector_records_consumed_total",
		"Records read from Kafka and committed in a batch.", nil, nil)
	descLost = prometheus.NewDesc("projector_records_lost_total",
		"Records deleted from the log (retention, compaction) before they were read.", nil, nil)
	descNewLogs = prometheus.NewDesc("projector_new_logs_total",
		"Partitions found reading a new log under the same name (a topic deleted and recreated: the stored position past the log's end, or another record at the offset last read) and read again from the new log's start.", nil, nil)
	descBatches = prometheus.NewDesc("projector_batches_total",
		"Batch transactions committed.", nil, nil)
	descFenced = prometheus.NewDesc("projector_fenced_total",
		"Batches rolled back because another owner claimed the partition.", nil, nil)
	descGapsOpened = prometheus.NewDesc("projector_gaps_opened_total",
		"Jobs that started waiting behind a gap.", nil, nil)
	descGapsClosed = prometheus.NewDesc("projector_gaps_closed_total",
		"Gaps closed, by the step that closed them: wait (the versions arrived), reread (found in the store or the log again), snapshot (a trusted snapshot).",
		[]string{"by"}, nil)
	descAuthority = prometheus.NewDesc("projector_authority_requests_total",
		"Snapshot fetches from the authority by result: ok, not_found, error (after its retries).",
		[]string{"result"}, nil)
	descAuthorityTimeouts = prometheus.NewDesc("projector_authority_timeouts_total",
		"Snapshot fetches whose request to the authority was cut by its timeout (counted in projector_authority_requests_total{result=\"error\"} too); each doubles its job's next timeout, from --snapshot-timeout up to --snapshot-timeout-max, until the gap closes.", nil, nil)
	descAuthorityInFlight = prometheus.NewDesc("projector_authority_requests_in_flight",
		"Requests to the authority in flight, by the lane they count against: main (--snapshot-concurrency) or slow (requests past a few median answer times, up to --snapshot-concurrency more).",
		[]string{"lane"}, nil)
	descAuthoritySlowMoves = prometheus.NewDesc("projector_authority_slow_lane_moves_total",
		"Requests to the authority that ran past the slow threshold and moved to the slow lane, freeing their main slot.", nil, nil)
	descAuthoritySlowFull = prometheus.NewDesc("projector_authority_slow_lane_full_total",
		"Requests to the authority that ran past the slow threshold while the slow lane was full, and so were cut (counted in projector_authority_slow_cut_total too).", nil, nil)
	descAuthoritySlowCut = prometheus.NewDesc("projector_authority_slow_cut_total",
		"Requests to the authority cut for slowness: past the slow threshold with the slow lane full (the job is asked in the main lane again), or moved to it and still running at 3 x the threshold (the job is found slow: its next requests start in the slow lane).", nil, nil)
	descAuthoritySlowStarts = prometheus.NewDesc("projector_authority_slow_lane_starts_total",
		"Requests to the authority started in the slow lane, for jobs found slow (their last request was cut at 3 x the slow threshold after a move, or timed out); they run to --snapshot-timeout.", nil, nil)
	descAuthoritySlowAfter = prometheus.NewDesc("projector_authority_slow_after_seconds",
		"How long a request to the authority runs before it leaves the main lane: 3 x the median of the last 64 answers, at least 0.05; 0 until 8 answers have been seen.", nil, nil)
	descDBErrors = prometheus.NewDesc("projector_database_errors_total",
		"Failed PostgreSQL operations (batches, claims, reloads, pings); each is retried.", nil, nil)
	descStalls = prometheus.NewDesc("projector_stalls_total",
		"Partitions found with lag and no progress for the stall timeout; the instance stops at the first.", nil, nil)
	descHeldJobs = prometheus.NewDesc("projector_held_jobs",
		"Jobs held behind a gap right now, on this instance's partitions.", nil, nil)
	descOldestHeld = prometheus.NewDesc("projector_oldest_held_seconds",
		"Age of the oldest hold on this instance's partitions; 0 when nothing is held.", nil, nil)
	descLag = prometheus.NewDesc("projector_partition_lag",
		"Records between the stored position and where this instance can read to, read at least every 5 s: the last stable offset with --kafka-isolation read_committed (a transaction still open is waited on, not lag), the high watermark with read_uncommitted.",
		[]string{"partition"}, nil)
	descOpenTxn = prometheus.NewDesc("projector_partition_open_transaction_seconds",
		"How long the partition has waited on a transaction still open (read_committed: every record before it is projected, the rest waits until it commits or is aborted); 0 when it waits on none.",
		[]string{"partition"}, nil)
	descPosition = prometheus.NewDesc("projector_partition_position",
		"Next offset to read, as committed in PostgreSQL (-1: none yet).", []string{"partition"}, nil)
	descEpoch = prometheus.NewDesc("projector_partition_epoch",
		"Fencing epoch this instance holds the partition under.", []string{"partition"}, nil)
	descReady = prometheus.NewDesc("projector_ready",
		"1 when /readyz answers 200.", nil, nil)
	descSQSMessages = prometheus.NewDesc("projector_sqs_queue_messages",
		"With --source sqs: the queue's approximate messages, visible (waiting) or in_flight (received, not deleted), read every 5 s; their sum is the lag.",
		[]string{"state"}, nil)
	descSQSEvents = prometheus.NewDesc("projector_sqs_messages_total",
		"With --source sqs: messages received, redelivered (received more than once), group_not_job_id (MessageGroupId is not the job id: no order), deleted, delete_failed (delivered again), visibility_extend_failed.",
		[]string{"event"}, nil)
)

// projectorCollector reads the counters and the partition book at scrape
// time: they stay the one source of truth for /status and /metrics.
type projectorCollector struct{ p *Projector }

func (c *projectorCollector) Describe(ch chan<- *prometheus.Desc) {
	prometheus.DescribeByCollect(c, ch)
}

func (c *projectorCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.p.Status()
	k := s.Counters
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
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
	if sc := c.p.snapshots; sc != nil {
		l := sc.Lanes()
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
		if len(ps.view) > 0 && (oldest.IsZero() || ps.view[0].Since.Before(oldest)) {
			oldest = ps.view[0].Since
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

// countedSnapshots counts the authority's answers.
type countedSnapshots struct {
	src gapfill.SnapshotSource
	c   *counters
}

func (s countedSnapshots) Fetch(ctx context.Context, jobID string) (event.Event, error) {
	ev, err := s.src.Fetch(ctx, jobID)
	var timeout *snapshot.TimeoutError
	switch {
	case err == nil:
		s.c.authorityOK.Add(1)
	case errors.Is(err, snapshot.ErrNotFound):
		s.c.authorityNotFound.Add(1)
	case ctx.Err() != nil:
		// stopped, not answered
	default:
		s.c.authorityError.Add(1)
		if errors.As(err, &timeout) {
			s.c.authorityTimeouts.Add(1)
		}
	}
	return ev, err
}

package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/util/teststorage"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/kafkatest"
	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/projection"

	_ "github.com/projector/projector/source/kafka"
)

// scrapeInterval is how far apart the scrapes of the test are placed in the
// evaluation's storage, Prometheus's default: the alerts' windows and for:
// durations are minutes, which a test cannot wait, so each scrape stands
// for one scrape interval of such a run. A state that lasts (PostgreSQL
// cut) is scraped once per interval it stands for.
const scrapeInterval = time.Minute

// The scrape target's labels, as Prometheus would attach them.
const (
	targetInstance = "projector-1:8080"
	targetJob      = "projector"
)

// engineRun is a projector running in the test.
type engineRun struct {
	p    *projection.Projector
	srv  *httptest.Server
	stop func()
}

func startProjector(t *testing.T, cfg projection.Config) *engineRun {
	t.Helper()
	p, err := projection.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	srv := httptest.NewServer(p.Handler())
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		srv.Close()
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("the projector did not stop within 30 s")
		}
	}
	t.Cleanup(stop)
	return &engineRun{p: p, srv: srv, stop: stop}
}

func eventually(t *testing.T, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s: %s", within, what, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// scrape reads /metrics as Prometheus's text format.
func scrape(t *testing.T, run *engineRun) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(run.srv.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// appendScrape stores one scrape's samples at ts, labelled with the
// target's instance and job, as Prometheus's scrape loop stores them.
func appendScrape(t *testing.T, st *teststorage.TestStorage, fams map[string]*dto.MetricFamily, ts time.Time) {
	t.Helper()
	app := st.Appender(context.Background())
	ms := ts.UnixMilli()
	add := func(name string, lbls []*dto.LabelPair, v float64, extra ...string) {
		m := map[string]string{labels.MetricName: name, "instance": targetInstance, "job": targetJob}
		for _, l := range lbls {
			m[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(extra); i += 2 {
			m[extra[i]] = extra[i+1]
		}
		_, err := app.Append(0, labels.FromMap(m), ms, v)
		require.NoError(t, err, "%s", name)
	}
	add("up", nil, 1) // the scrape answered
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				add(name, m.GetLabel(), m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(name, m.GetLabel(), m.GetGauge().GetValue())
			case dto.MetricType_UNTYPED:
				add(name, m.GetLabel(), m.GetUntyped().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				inf := false
				for _, b := range h.GetBucket() {
					inf = inf || math.IsInf(b.GetUpperBound(), 1)
					add(name+"_bucket", m.GetLabel(), float64(b.GetCumulativeCount()), "le", formatFloat(b.GetUpperBound()))
				}
				if !inf {
					add(name+"_bucket", m.GetLabel(), float64(h.GetSampleCount()), "le", "+Inf")
				}
				add(name+"_sum", m.GetLabel(), h.GetSampleSum())
				add(name+"_count", m.GetLabel(), float64(h.GetSampleCount()))
			case dto.MetricType_SUMMARY:
				s := m.GetSummary()
				for _, q := range s.GetQuantile() {
					add(name, m.GetLabel(), q.GetValue(), "quantile", formatFloat(q.GetQuantile()))
				}
				add(name+"_sum", m.GetLabel(), s.GetSampleSum())
				add(name+"_count", m.GetLabel(), float64(s.GetSampleCount()))
			}
		}
	}
	require.NoError(t, app.Commit())
}

func formatFloat(f float64) string {
	if math.IsInf(f, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

func statusOf(run *engineRun) projection.Status { return run.p.Status() }

func lagOf(s projection.Status) int64 {
	var n int64
	for _, p := range s.Partitions {
		n += p.Lag
	}
	return n
}

// TestAlertsFireOnHeldGapAndLag drives a projector (kfake over TCP, the
// real PostgreSQL behind a proxy that can cut it, a snapshot authority
// that answers 500) into what the alerts are for, scrapes /metrics (once
// per interval a state stands for), stores the scrapes one scrape interval
// apart as Prometheus would, and evaluates every alerting rule of the rule
// file with Prometheus's rule evaluation and query engine before the cut
// (where only the first two troubles must show) and at the last scrape:
//
//   - a job held behind a gap for an hour (its durable held row dated back
//     an hour, as a restart reloads it),
//   - a record quarantined,
//   - then PostgreSQL cut for 12 intervals: records produced twice, so the
//     lag grows while no batch commits, database errors are counted and
//     /readyz fails.
//
// The alerts for each must be active, their descriptions naming the
// partition where the series carry one; those for a stall and an open
// transaction, which the run does not have, must not. An alert with a
// for: duration is active as pending: its expression holds at that
// instant, and it fires once it holds for that long, which the test does
// not wait.
//
// Before that, every family the dashboard and the rules read must be in
// the scrapes, except those only --source sqs and --api-addr export.
func TestAlertsFireOnHeldGapAndLag(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kc := kafkatest.New(t)
	topic := kafkatest.Topic(t, kc, 1)
	proxy := pgtest.NewProxy(t)
	st := proxy.Store(t)
	authority := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "the authority is down", http.StatusInternalServerError)
	}))
	defer authority.Close()
	cfg := projection.Config{
		Brokers:                kc.Addrs(),
		Topic:                  topic,
		Group:                  topic + "-group",
		Store:                  st,
		Owner:                  "projector-1",
		Logger:                 slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		BatchSize:              500,
		BatchLinger:            20 * time.Millisecond,
		MaxWait:                200 * time.Millisecond,
		HeartbeatInterval:      kafkatest.GroupHeartbeatInterval,
		SessionTimeout:         kafkatest.GroupSessionTimeout,
		RebalanceTimeout:       kafkatest.GroupRebalanceTimeout,
		JoinGroupBackoff:       kafkatest.GroupJoinBackoff,
		PartitionWatchInterval: kafkatest.GroupPartitionWatchInterval,
		GapWaitOff:             true,
		NoReread:               true,
		SnapshotURL:            authority.URL,
		SnapshotTimeout:        time.Second,
		// A fetch gives up after its retries of half a second, not the
		// default 30 s: the test waits for two of them.
		SnapshotMaxElapsed: 500 * time.Millisecond,
		GapRetryMin:        50 * time.Millisecond,
		GapRetryMax:        500 * time.Millisecond,
	}
	produce := func(recs ...kafkatest.Record) {
		t.Helper()
		_, err := kc.Produce(ctx, topic, recs...)
		require.NoError(t, err)
	}
	event := func(job string, v int64, kind, body string) kafkatest.Record {
		field := map[string]string{"snapshot": "state", "delta": "ops"}[kind]
		return kafkatest.Record{Key: []byte(job), Value: fmt.Appendf(nil, `{"job_id":%q,"version":%d,"kind":%q,%q:%s,"event_id":"e-%s-%d"}`, job, v, kind, field, body, job, v)}
	}

	// A gap: job-7 at version 1, its version 3 held for want of 2.
	first := startProjector(t, cfg)
	produce(event("job-7", 1, "snapshot", `{"n":0}`), event("job-7", 3, "delta", `[{"op":"increment","path":"/n","by":1}]`))
	eventually(t, 30*time.Second, "job-7 is held", func() (bool, string) {
		s := statusOf(first)
		return s.Counters.HeldJobs == 1, fmt.Sprintf("%+v", s.Counters)
	})
	first.stop()
	// Held for an hour, as an instance that starts reloads it.
	tag, err := pgtest.Pool(t).Exec(ctx, `UPDATE `+pgxIdent(st.Schema())+`.projector_held SET held_since = now() - interval '1 hour'`)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())

	run := startProjector(t, cfg)
	eventually(t, 30*time.Second, "the held job is reloaded and asked of the authority", func() (bool, string) {
		s := statusOf(run)
		return s.Ready && s.Counters.HeldJobs == 1 && s.Counters.AuthorityError > 0 && len(s.Partitions) == 1, fmt.Sprintf("%+v", s.Counters)
	})
	scrapes := []map[string]*dto.MetricFamily{scrape(t, run)}
	errorsBefore := statusOf(run).Counters.AuthorityError

	produce(kafkatest.Record{Key: []byte("bad"), Value: []byte("not json")})
	eventually(t, 30*time.Second, "a record is quarantined and the authority failed 3 times more", func() (bool, string) {
		s := statusOf(run)
		return s.Counters.Quarantined == 1 && s.Counters.AuthorityError >= errorsBefore+3 && lagOf(s) == 0, fmt.Sprintf("%+v lag %d", s.Counters, lagOf(s))
	})
	scrapes = append(scrapes, scrape(t, run))

	proxy.Cut()
	t.Cleanup(proxy.Restore)
	var batches int64
	produceLag := func(from, n int, lag int64) {
		t.Helper()
		recs := make([]kafkatest.Record, n)
		for i := range recs {
			job := fmt.Sprintf("lag-%d", from+i)
			recs[i] = event(job, 1, "snapshot", `{"n":1}`)
		}
		produce(recs...)
		errs := statusOf(run).Counters.DatabaseErrors
		eventually(t, 30*time.Second, fmt.Sprintf("the lag reaches %d, not ready, more database errors", lag), func() (bool, string) {
			s := statusOf(run)
			return lagOf(s) >= lag && !s.Ready && s.Counters.DatabaseErrors > errs,
				fmt.Sprintf("lag %d ready %v %+v", lagOf(s), s.Ready, s.Counters)
		})
	}
	// The cut lasts 12 scrape intervals, longer than the windows of the
	// lag and progress alerts: the lag 5 for 8, then 10 for 4. The batch
	// count is read once the instance is not ready (PostgreSQL silent for
	// 5 s): a batch (a held job's attempt) that committed just before the
	// cut may count a moment after it.
	produceLag(0, 5, 5)
	batches = statusOf(run).Counters.Batches
	for range 8 {
		scrapes = append(scrapes, scrape(t, run))
	}
	produceLag(5, 5, 10)
	for range 4 {
		scrapes = append(scrapes, scrape(t, run))
	}
	require.Equal(t, batches, statusOf(run).Counters.Batches, "a batch committed with PostgreSQL cut")

	// What the dashboard and the rules read is there.
	used := usedFamilies(t, readReference(t))
	for f := range used {
		if strings.HasPrefix(f, "projector_sqs_") || strings.HasPrefix(f, "projector_wait") || scrapeSeries[f] {
			continue // --source sqs, --api-addr, Prometheus's own
		}
		_, ok := scrapes[len(scrapes)-1][f]
		require.True(t, ok, "a Kafka run's /metrics has no %s, which the dashboard or the rules read", f)
	}

	// The scrapes, one interval apart, in a Prometheus TSDB.
	tsdb := teststorage.New(t)
	start := time.Unix(1_800_000_000, 0)
	var at time.Time
	var scrapeTimes []time.Time
	for i, s := range scrapes {
		at = start.Add(time.Duration(i) * scrapeInterval)
		scrapeTimes = append(scrapeTimes, at)
		appendScrape(t, tsdb, s, at)
	}
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1_000_000, Timeout: time.Minute})
	t.Cleanup(func() { _ = engine.Close() })
	query := rules.EngineQueryFunc(engine, tsdb)

	// Before the cut (the second scrape): the gap, the quarantine and the
	// authority's failures only.
	judge(t, query, scrapeTimes[1], map[string]bool{
		"ProjectorLagGrowing": false, "ProjectorNoProgress": false, "ProjectorHeldGapTooOld": true,
		"ProjectorQuarantineGrowing": true, "ProjectorAuthorityFailing": true, "ProjectorNotReady": false,
		"ProjectorDatabaseErrors": false, "ProjectorStalled": false, "ProjectorOpenTransactionLong": false,
		"ProjectorDown": false, "ProjectorMemoryNearLimit": false,
	})
	// At the last scrape, PostgreSQL cut for 12 intervals.
	judge(t, query, at, map[string]bool{
		"ProjectorLagGrowing": true, "ProjectorNoProgress": true, "ProjectorHeldGapTooOld": true,
		"ProjectorQuarantineGrowing": true, "ProjectorAuthorityFailing": true, "ProjectorNotReady": true,
		"ProjectorDatabaseErrors": true, "ProjectorStalled": false, "ProjectorOpenTransactionLong": false,
		"ProjectorDown": false, "ProjectorMemoryNearLimit": false,
	})
}

// judge evaluates every alert of the rule file once at at and requires
// those want says to be active (pending when they have a for: duration,
// firing otherwise), with descriptions that name the instance and the
// partition where the series carry one, and the others inactive.
func judge(t *testing.T, query rules.QueryFunc, at time.Time, want map[string]bool) {
	t.Helper()
	all := alerts(t)
	require.Len(t, all, len(want), "an alert this test does not judge")
	for _, a := range all {
		fire, judged := want[a.Alert]
		require.True(t, judged, "alert %s: the test does not judge it", a.Alert)
		rule := newRule(t, a)
		_, err := rule.Eval(context.Background(), 0, at, query, nil, 0)
		require.NoError(t, err, "alert %s", a.Alert)
		active := rule.ActiveAlerts()
		if !fire {
			require.Empty(t, active, "alert %s is active at %s on a run that has no such trouble then", a.Alert, at)
			continue
		}
		require.NotEmpty(t, active, "alert %s would not fire at %s: %s", a.Alert, at, a.Expr)
		for _, al := range active {
			want := rules.StateFiring
			if a.For > 0 {
				want = rules.StatePending
			}
			require.Equal(t, want, al.State, "alert %s", a.Alert)
			desc := al.Annotations.Get("description")
			require.NotContains(t, desc, "<error expanding template", "alert %s", a.Alert)
			require.NotContains(t, desc, "<no value>", "alert %s", a.Alert)
			require.Contains(t, desc, targetInstance, "alert %s: the description names no instance", a.Alert)
			if p := al.Labels.Get("partition"); p != "" {
				require.Contains(t, desc, "Partition "+p+" ", "alert %s: the description names no partition", a.Alert)
			}
			b, _ := json.Marshal(al.Annotations.Map())
			t.Logf("%s %s %s value %g: %s", a.Alert, al.State, al.Labels, al.Value, b)
		}
	}
}

// newRule is a as Prometheus's rule manager builds it.
func newRule(t *testing.T, a rulefmt.Rule) *rules.AlertingRule {
	t.Helper()
	expr, err := promqlParser.ParseExpr(a.Expr)
	require.NoError(t, err, "alert %s", a.Alert)
	return rules.NewAlertingRule(a.Alert, expr, time.Duration(a.For), time.Duration(a.KeepFiringFor),
		labels.FromMap(a.Labels), labels.FromMap(a.Annotations), labels.EmptyLabels(), "", false, slog.New(slog.DiscardHandler))
}

func pgxIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

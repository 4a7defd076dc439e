package projection

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/kafkatest"
	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/observe"
	kafkasrc "github.com/projector/projector/source/kafka"
)

// logLines keeps a projector's log lines for a test to read, and passes
// them on to t.Log.
type logLines struct {
	t     *testing.T
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Write(p []byte) (int, error) {
	line := strings.TrimSuffix(string(p), "\n")
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
	l.t.Log(line)
	return len(p), nil
}

func (l *logLines) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// matching returns the lines that contain every one of parts.
func (l *logLines) matching(parts ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
next:
	for _, line := range l.lines {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

// probe GETs path from the projector's handler and decodes its JSON.
func probe(t *testing.T, srv *httptest.Server, path string) (int, Health) {
	t.Helper()
	resp, err := http.Get(srv.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	var h Health
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&h))
	return resp.StatusCode, h
}

func failing(h Health) string {
	var out []string
	for _, c := range h.Checks {
		if !c.OK {
			out = append(out, c.Name+": "+c.Detail)
		}
	}
	return strings.Join(out, "; ")
}

// TestReadyzFollowsDatabaseOutage cuts PostgreSQL off (a proxy in front of
// the shared server drops every connection) while records wait: /readyz
// turns 503 within 10 s and says the database is why, /healthz stays 200,
// the outage is logged once at its start (not once per retry) and once at
// its end, and after the cut is restored /readyz is 200 again and every
// record lands, without a restart.
func TestReadyzFollowsDatabaseOutage(t *testing.T) {
	t.Parallel()
	proxy := pgtest.NewProxy(t)
	c := kafkatest.New(t)
	r := &rig{t: t, kafka: c, topic: kafkatest.Topic(t, c, 2), store: proxy.Store(t), parts: 2}
	logs := &logLines{t: t}
	run := r.start(r.config(func(c *Config) { c.Logger = logs.logger() }))
	srv := httptest.NewServer(run.p.Handler())
	defer srv.Close()

	s := newStream(2)
	for _, j := range jobIDs("before", 20) {
		s.snapshots(j, 1)
	}
	s.flush(r)
	r.caughtUp(20*time.Second, run)
	r.eventually(10*time.Second, "/readyz 200", func() (bool, string) {
		code, h := probe(t, srv, "/readyz")
		return code == http.StatusOK, failing(h)
	})

	cutAt := time.Now()
	proxy.Cut()
	for _, j := range jobIDs("during", 200) {
		s.snapshots(j, 1)
	}
	s.flush(r)
	var notReadyAt time.Time
	r.eventually(10*time.Second, "/readyz turns 503 within 10 s of the cut", func() (bool, string) {
		code, h := probe(t, srv, "/readyz")
		if code != http.StatusServiceUnavailable {
			return false, fmt.Sprintf("%d", code)
		}
		notReadyAt = time.Now()
		for _, c := range h.Checks {
			if c.Name == "database" {
				return !c.OK && strings.Contains(c.Detail, "PostgreSQL has not answered"), c.Detail
			}
		}
		return false, "no database check"
	})
	code, h := probe(t, srv, "/healthz")
	require.Equal(t, http.StatusOK, code, "an outage is not a wedge: %s", failing(h))
	r.eventually(10*time.Second, "the outage's start is logged", func() (bool, string) {
		return len(logs.matching("PostgreSQL is failing; retrying", "attempt=", "next_retry=")) > 0, ""
	})
	// Hold the outage a few seconds: retries go on, quietly.
	time.Sleep(3 * time.Second) // the outage's length, not synchronisation
	require.Len(t, logs.matching("PostgreSQL is failing; retrying"), 1, "an outage is logged at its start, then at most every 30 s")

	restoredAt := time.Now()
	proxy.Restore()
	var readyAt time.Time
	r.eventually(30*time.Second, "/readyz is 200 again", func() (bool, string) {
		code, h := probe(t, srv, "/readyz")
		readyAt = time.Now()
		return code == http.StatusOK, failing(h)
	})
	r.caughtUp(60*time.Second, run)
	r.requireModel(s)
	r.eventually(10*time.Second, "the outage's end is logged", func() (bool, string) {
		return len(logs.matching("PostgreSQL answers again", "failed_for=")) == 1, ""
	})
	require.Positive(t, run.p.Status().Counters.DatabaseErrors)
	t.Logf("outage timeline: cut at 0s, /readyz 503 at %s, restored at %s, /readyz 200 at %s (%s after the restore)",
		notReadyAt.Sub(cutAt).Round(time.Millisecond), restoredAt.Sub(cutAt).Round(time.Millisecond),
		readyAt.Sub(cutAt).Round(time.Millisecond), readyAt.Sub(restoredAt).Round(time.Millisecond))
}

// TestHealthzFailsWhenWorkerWedged: a partition worker stuck inside a
// batch for longer than StallTimeout, with lag, fails /healthz, naming the
// worker and the partition that makes no progress, counts the stall in
// projector_stalls_total, and ends Run with ErrStalled, so the process
// exits non-zero and its supervisor starts it again; a new instance goes
// on from the stored position.
func TestHealthzFailsWhenWorkerWedged(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	var calls atomic.Int32
	hook := applyHook(func(int) {
		if calls.Add(1) == 1 {
			<-release
		}
	})
	logs := &logLines{t: t}
	const stall = 3 * time.Second
	p, err := New(r.config(func(c *Config) { c.StallTimeout = stall; c.Logger = logs.logger() }, hook))
	require.NoError(t, err)
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- p.Run(ctx) }()
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()

	code, h := probe(t, srv, "/healthz")
	require.Equal(t, http.StatusOK, code, failing(h))
	r.produce(rec{0, "a", snap("a", 1, `{}`)})
	r.eventually(20*time.Second, "/healthz fails naming the wedged worker and the stalled partition", func() (bool, string) {
		code, h := probe(t, srv, "/healthz")
		f := failing(h)
		return code == http.StatusServiceUnavailable && strings.Contains(f, "partition 0 worker: wedged") &&
			strings.Contains(f, "progress: projection: partition stalled: partition 0 has lag 1"), f
	})
	resp, err := http.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Contains(t, string(body), "projector_stalls_total 1")
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrStalled)
	case <-time.After(stall + observe.StallExitGrace + 10*time.Second):
		t.Fatal("Run did not end after the stall")
	}
	require.Len(t, logs.matching("partition stalled"), 1)
	unblock()

	// The supervisor's restart: a new instance goes on from the stored
	// position.
	again := r.start(r.config())
	r.caughtUp(30*time.Second, again)
}

// TestMissingTopicIsWaitedFor: a projector started on a topic that does
// not exist joins no group (no rebalance loop), is not ready and says why,
// logs the topic's name once (at most every 30 s); once the topic is
// created it joins and projects.
func TestMissingTopicIsWaitedFor(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	r := &rig{t: t, kafka: c, topic: "missing-" + strings.ReplaceAll(t.Name(), "/", "_"), store: pgtest.Store(t), parts: 1}
	logs := &logLines{t: t}
	run := r.start(r.config(func(c *Config) { c.Logger = logs.logger() }))
	srv := httptest.NewServer(run.p.Handler())
	defer srv.Close()

	r.eventually(10*time.Second, "/readyz says the topic is missing", func() (bool, string) {
		code, h := probe(t, srv, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(failing(h), "topic: topic \""+r.topic+"\" does not exist"), failing(h)
	})
	// A few seconds of waiting: one log line, no generation.
	time.Sleep(3 * time.Second) // the length of the wait, not synchronisation
	require.Len(t, logs.matching("topic does not exist", r.topic), 1)
	require.Empty(t, logs.matching("generation joined"))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, c.CreateTopic(ctx, r.topic, 1))
	r.produce(rec{0, "a", snap("a", 1, `{"n":1}`)})
	r.caughtUp(30*time.Second, run)
	r.eventually(10*time.Second, "/readyz 200", func() (bool, string) {
		code, h := probe(t, srv, "/readyz")
		return code == http.StatusOK, failing(h)
	})
	require.Len(t, logs.matching("generation joined"), 1)
}

// TestReadyMaxLag: with ReadyMaxLag, /readyz fails while the lag is above
// it. The worker is stuck before its commit, so the lag can only come from
// the broker's high watermark, read in the background: projector_partition_lag
// shows it too.
func TestReadyMaxLag(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	blocked := make(chan struct{}, 1)
	hook := applyHook(func(int) {
		select {
		case blocked <- struct{}{}:
		default:
		}
		<-release
	})
	run := r.start(r.config(func(c *Config) { c.ReadyMaxLag = 5 }, hook))
	srv := httptest.NewServer(run.p.Handler())
	defer srv.Close()
	r.eventually(20*time.Second, "/readyz 200 on an empty topic", func() (bool, string) {
		code, h := probe(t, srv, "/readyz")
		return code == http.StatusOK, failing(h)
	})
	s := newStream(1)
	for _, j := range jobIDs("j", 50) {
		s.snapshots(j, 1)
	}
	s.flush(r)
	r.eventually(20*time.Second, "/readyz fails on the lag", func() (bool, string) {
		code, h := probe(t, srv, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(failing(h), "lag: total lag 50 records (ready at 5 or less)"), failing(h)
	})
	require.Equal(t, 50.0, scrape(t, run.p)[`projector_partition_lag{partition="0"}`])
	unblock()
	r.caughtUp(20*time.Second, run)
	r.eventually(20*time.Second, "/readyz 200 once caught up", func() (bool, string) {
		code, h := probe(t, srv, "/readyz")
		return code == http.StatusOK, failing(h)
	})
}

// TestDeletedTopicWaitsWithoutRebalanceLoop: a topic deleted under a
// running instance sends it out of the group to wait (not ready, the topic
// named once in the log), not into a loop of generations; recreated, it is
// projected again.
func TestDeletedTopicWaitsWithoutRebalanceLoop(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	logs := &logLines{t: t}
	run := r.start(r.config(func(c *Config) { c.Logger = logs.logger() }))
	r.produce(rec{0, "a", snap("a", 1, `{}`)})
	r.caughtUp(20*time.Second, run)
	r.eventually(10*time.Second, "ready", func() (bool, string) { return run.p.Ready(), failing(run.p.Readiness()) })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	admin := &kafka.Client{Addr: kafka.TCP(r.kafka.Addrs()...), Transport: tr}
	res, err := admin.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{r.topic}})
	require.NoError(t, err)
	require.NoError(t, res.Errors[r.topic])
	r.eventually(20*time.Second, "not ready: the topic is missing", func() (bool, string) {
		f := failing(run.p.Readiness())
		return strings.Contains(f, "topic: topic \""+r.topic+"\" does not exist"), f
	})
	time.Sleep(3 * time.Second) // the length of the wait, not synchronisation
	require.LessOrEqual(t, len(logs.matching("generation joined")), 3, "no rebalance loop")
	require.LessOrEqual(t, len(logs.matching("does not exist", r.topic)), 2, "the missing topic is logged once (and once on leaving the group)")

	require.NoError(t, r.kafka.CreateTopic(ctx, r.topic, 1))
	// The projection stored next offset 1 for the old topic: offset 0 of the
	// new one counts as read (a recreated topic calls for a rebuild).
	r.produce(rec{0, "a", snap("a", 2, `{}`)}, rec{0, "b", snap("b", 1, `{}`)})
	r.eventually(30*time.Second, "b is projected after the topic came back", func() (bool, string) {
		_, ok := r.rows()["b"]
		return ok, failing(run.p.Readiness())
	})
	r.eventually(10*time.Second, "ready again", func() (bool, string) { return run.p.Ready(), failing(run.p.Readiness()) })
}

// TestCatchUpProgressLogged: while the lag is large, run logs the lag, the
// rate and the time left every 10 s; once it falls, "caught up" once.
func TestCatchUpProgressLogged(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	hook := applyHook(func(int) { <-release })
	logs := &logLines{t: t}
	run := r.start(r.config(func(c *Config) { c.Logger = logs.logger() }, hook))
	s := newStream(1)
	for _, j := range jobIDs("p", 1500) {
		s.snapshots(j, 1)
	}
	s.flush(r)
	r.eventually(25*time.Second, "catch-up progress is logged", func() (bool, string) {
		return len(logs.matching("catching up", "lag=1500", "rate_per_second=", "eta=")) > 0, ""
	})
	unblock()
	r.caughtUp(30*time.Second, run)
	r.eventually(25*time.Second, "caught up is logged", func() (bool, string) {
		return len(logs.matching("caught up", "lag=0")) == 1, ""
	})
}

// TestDatabaseOutageIsNotAStall: a PostgreSQL outage longer than
// StallTimeout, with records waiting, is not a stall: nothing inside or
// outside the process is wedged, and a restart would not bring the
// database back. Run goes on, /readyz says the database is why, and once
// the database answers every record lands without a restart.
func TestDatabaseOutageIsNotAStall(t *testing.T) {
	t.Parallel()
	proxy := pgtest.NewProxy(t)
	c := kafkatest.New(t)
	r := &rig{t: t, kafka: c, topic: kafkatest.Topic(t, c, 1), store: proxy.Store(t), parts: 1}
	logs := &logLines{t: t}
	const stall = 2 * time.Second
	run := r.start(r.config(func(c *Config) { c.Logger = logs.logger(); c.StallTimeout = stall }))
	s := newStream(1)
	s.snapshots("before", 1)
	s.flush(r)
	r.caughtUp(20*time.Second, run)

	proxy.Cut()
	for _, j := range jobIDs("during", 20) {
		s.snapshots(j, 1)
	}
	s.flush(r)
	r.eventually(10*time.Second, "the outage's start is logged", func() (bool, string) {
		return len(logs.matching("PostgreSQL is failing; retrying")) > 0, ""
	})
	// Hold the outage until the lag is measured against the broker, then
	// for more than twice the stall timeout.
	time.Sleep(brokerPollEvery + 3*stall) // the outage's length, not synchronisation
	require.Positive(t, run.p.Status().Partitions[0].Lag, "the records waiting show as lag")
	select {
	case err := <-run.done:
		t.Fatalf("Run ended during the outage: %v", err)
	default:
	}
	require.Empty(t, logs.matching("partition stalled"), "an outage is not a stall")

	proxy.Restore()
	r.caughtUp(60*time.Second, run)
	r.requireModel(s)
}

// TestShortStallTimeoutKeepsIdleMonitorsLive: the background monitors turn
// every few seconds by design (the broker poll every 5 s); a StallTimeout
// shorter than that must not make /healthz call them wedged between two
// turns. Liveness is watched over more than two broker polls.
//
// The stall timeout is below the broker poll, which is what is tested, but
// well above the idle worker's own wake-up (idleWake): a worker idle for
// exactly its limit has no margin on a loaded machine, and its beat is not
// what this test is about.
func TestShortStallTimeoutKeepsIdleMonitorsLive(t *testing.T) {
	t.Parallel()
	stall := 3 * idleWake
	require.Less(t, stall, brokerPollEvery, "the stall timeout must be shorter than the broker monitor's turn for this test to mean anything")
	r := newRig(t, 1)
	run := r.start(r.config(func(c *Config) { c.StallTimeout = stall }))
	r.produce(rec{0, "a", snap("a", 1, `{}`)})
	r.caughtUp(20*time.Second, run)
	// The observation window, not synchronisation: every sample must be
	// live.
	until := time.Now().Add(2*brokerPollEvery + 2*time.Second)
	for time.Now().Before(until) {
		h := run.p.Liveness()
		require.True(t, h.OK, "/healthz of an idle instance: %s", failing(h))
		time.Sleep(100 * time.Millisecond)
	}
}

// brokerPollEvery is the Kafka source's turn of reading the log ends.
const brokerPollEvery = kafkasrc.EndsEvery

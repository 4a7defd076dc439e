package projection

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/internal/testkit/sqstest"
)

// refusing is an SQS endpoint in front of the emulator that answers the
// requests refuse picks with an SQS error of its own, and passes the rest.
func refusing(t *testing.T, endpoint string, refuse func(*http.Request) (status int, header, body string)) string {
	t.Helper()
	u, err := url.Parse(endpoint)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	front := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status, header, body := refuse(r); status != 0 {
			w.Header().Set("Content-Type", "application/x-amz-json-1.0")
			if header != "" {
				w.Header().Set("x-amzn-query-error", header)
			}
			w.WriteHeader(status)
			fmt.Fprint(w, body)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	front.Start()
	// Registered before the engine starts, so closed after it stopped: a
	// long poll still open would hold Close.
	t.Cleanup(front.Close)
	return front.URL
}

func sqsAction(r *http.Request) string {
	return strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.")
}

// TestSQSReceivesFailingWhileCountsAnswerIsAnOutage: the queue's receives
// fail (its KMS key refuses the role) for 25 s while GetQueueAttributes
// answers. Only a receive that answers ends the outage: /readyz turns 503
// within the 5 s an outage is given (plus a receive's wait) and stays 503
// while the receives fail; the outage is logged once, and "SQS answers
// again" only once receiving works; the watchdog counts none of it (stall
// timeout 8 s, with messages waiting). Then the waiting messages are
// projected and /readyz is 200 again. Before the receive outage was its
// own, every count that answered ended it: /readyz stayed 200 and the log
// flapped.
func TestSQSReceivesFailingWhileCountsAnswerIsAnOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("an outage of 25 s")
	}
	e := sqstest.New(t)
	queue := sqstest.Queue(t, e, 2*time.Second)
	var cut atomic.Bool
	var refused atomic.Int64
	endpoint := refusing(t, e.Endpoint, func(r *http.Request) (int, string, string) {
		if cut.Load() && sqsAction(r) == "ReceiveMessage" {
			refused.Add(1)
			return 400, "KMS.AccessDeniedException;Sender",
				`{"__type":"com.amazonaws.sqs#KmsAccessDenied","message":"The ciphertext refers to a customer master key that does not exist"}`
		}
		return 0, "", ""
	})
	st := pgtest.Store(t)
	logs := &logLines{t: t}
	cfg := Config{
		Source: SourceSQS, SQS: emulatorSQS(e, queue, 2*time.Second), Store: st, Logger: logs.logger(),
		BatchSize: 500, BatchLinger: 20 * time.Millisecond, GapWaitOff: true, StallTimeout: 8 * time.Second,
	}
	cfg.SQS.Endpoint = endpoint
	run := startEngine(t, cfg)
	srv := httptest.NewServer(run.p.Handler())
	defer srv.Close()
	version := func(id string) int64 {
		rows, err := st.LoadJobs(t.Context(), []string{id})
		require.NoError(t, err)
		return rows[id].Version
	}
	sendSQS(t, e, queue, "before", qsnap("before", 1, `{"n":1}`))
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, h := probe(t, srv, "/readyz")
		if code == http.StatusOK && version("before") == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "not ready: %s", failing(h))
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}

	cutAt := time.Now()
	cut.Store(true)
	// The receive in flight at the cut passed it: the messages are sent
	// once one was refused.
	for refused.Load() == 0 {
		require.Less(t, time.Since(cutAt), 10*time.Second, "no receive refused")
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
	}
	var jobs []string
	for i := range 5 {
		id := fmt.Sprintf("during-%d", i)
		jobs = append(jobs, id)
		sendSQS(t, e, queue, id, qsnap(id, 1, `{"n":1}`))
	}
	ended := func() {
		t.Helper()
		select {
		case err := <-run.done:
			run.done <- err
			t.Fatalf("Run ended during the outage of the receives: %v", err)
		default:
		}
	}
	// 5 s of outage, after the receive in flight (1 s wait) and its retry.
	var notReady time.Duration
	for {
		ended()
		code, h := probe(t, srv, "/readyz")
		if code == http.StatusServiceUnavailable {
			require.Contains(t, failing(h), "receives from queue "+queue+" have been failing")
			notReady = time.Since(cutAt)
			break
		}
		require.Less(t, time.Since(cutAt), 10*time.Second, "/readyz still 200 while every receive fails")
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}
	probes := 0
	for time.Since(cutAt) < 25*time.Second {
		ended()
		code, h := probe(t, srv, "/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code, "/readyz while every receive fails, %s after the cut: %+v", time.Since(cutAt), h.Checks)
		probes++
		time.Sleep(100 * time.Millisecond) // the outage's length, not synchronisation
	}
	require.Len(t, logs.matching("SQS is failing; retrying"), 1, "one outage, logged once")
	require.Empty(t, logs.matching("SQS answers again"), "no receive answered")
	require.Empty(t, logs.matching("stalled"), "an outage of the receives is not a stall")
	for _, id := range jobs {
		require.Zero(t, version(id), "%s projected while no receive answered", id)
	}

	restoredAt := time.Now()
	cut.Store(false)
	var ready time.Duration
	deadline = time.Now().Add(20 * time.Second)
	for {
		code, h := probe(t, srv, "/readyz")
		if code == http.StatusOK && ready == 0 {
			ready = time.Since(restoredAt)
		}
		done := ready > 0
		for _, id := range jobs {
			done = done && version(id) == 1
		}
		if done {
			break
		}
		require.True(t, time.Now().Before(deadline), "not ready and caught up after the receives answer again: %s", failing(h))
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}
	require.Len(t, logs.matching("SQS answers again"), 1)
	t.Logf("receives refused for %s (counts answering): /readyz 503 %s after the cut and on all %d probes after; 200 again %s after the receives answered",
		restoredAt.Sub(cutAt).Round(time.Millisecond), notReady.Round(time.Millisecond), probes, ready.Round(time.Millisecond))
}

// TestSQSCountsRefusedLeaveReadinessAlone: the role lacks
// sqs:GetQueueAttributes, receives work, the queue is idle and long polls
// last the default 20 s. For 45 s (two long polls and more) /readyz is 200
// on every probe, with ReadyMaxLag set; the lag is unknown (the status
// and the lag check say so); the refusal is warned of, at most every 30 s,
// naming the permission, and never logged as an SQS outage; and a message
// sent meanwhile is projected. Before, each refused count fed the
// receives' outage, and /readyz failed for most of each long poll.
func TestSQSCountsRefusedLeaveReadinessAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("45 s of long polls")
	}
	e := sqstest.New(t)
	queue := sqstest.Queue(t, e, 2*time.Second)
	endpoint := refusing(t, e.Endpoint, func(r *http.Request) (int, string, string) {
		if sqsAction(r) == "GetQueueAttributes" {
			return 400, "", `{"__type":"com.amazon.coral.service#AccessDeniedException","message":"not authorized to perform: sqs:getqueueattributes"}`
		}
		return 0, "", ""
	})
	st := pgtest.Store(t)
	logs := &logLines{t: t}
	cfg := Config{
		Source: SourceSQS, SQS: emulatorSQS(e, queue, 2*time.Second), Store: st, Logger: logs.logger(),
		BatchSize: 500, BatchLinger: 20 * time.Millisecond, GapWaitOff: true, ReadyMaxLag: 1000,
	}
	cfg.SQS.Endpoint = endpoint
	cfg.SQS.Wait = 20 * time.Second
	run := startEngine(t, cfg)
	srv := httptest.NewServer(run.p.Handler())
	defer srv.Close()
	version := func(id string) int64 {
		rows, err := st.LoadJobs(t.Context(), []string{id})
		require.NoError(t, err)
		return rows[id].Version
	}
	sendSQS(t, e, queue, "before", qsnap("before", 1, `{"n":1}`))
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, h := probe(t, srv, "/readyz")
		if code == http.StatusOK && version("before") == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "not ready: %s", failing(h))
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}

	start := time.Now()
	sent := false
	probes := 0
	for time.Since(start) < 45*time.Second {
		select {
		case err := <-run.done:
			run.done <- err
			t.Fatalf("Run ended: %v", err)
		default:
		}
		code, h := probe(t, srv, "/readyz")
		require.Equal(t, http.StatusOK, code, "/readyz %s after ready, receives answering, counts refused: %s", time.Since(start), failing(h))
		probes++
		if !sent && time.Since(start) > 25*time.Second {
			sendSQS(t, e, queue, "later", qsnap("later", 1, `{"n":2}`))
			sent = true
		}
		time.Sleep(100 * time.Millisecond) // the test's length, not synchronisation
	}
	require.EqualValues(t, 1, version("later"), "a message sent while the counts were refused")
	require.Empty(t, logs.matching("SQS is failing"), "refused counts are no SQS outage")
	warned := logs.matching("cannot read the queue's counts", "sqs:GetQueueAttributes")
	require.NotEmpty(t, warned)
	require.LessOrEqual(t, len(warned), 3, "warned at most every 30 s: %v", warned)

	s := run.p.Status()
	require.Len(t, s.Partitions, 1)
	require.True(t, s.Partitions[0].LagUnknown)
	require.Zero(t, s.Partitions[0].Lag)
	require.Nil(t, s.SQS.Counts)
	require.Contains(t, s.SQS.CountsError, "AccessDeniedException")
	_, h := probe(t, srv, "/readyz")
	var lag Check
	for _, c := range h.Checks {
		if c.Name == "lag" {
			lag = c
		}
	}
	require.True(t, lag.OK)
	require.Contains(t, lag.Detail, "lag unknown")
	t.Logf("receives answering, counts refused, 45 s: /readyz 200 on all %d probes; %d warnings", probes, len(warned))
}

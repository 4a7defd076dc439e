package projection

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/faulttest"
	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/internal/testkit/sqstest"
	sqssrc "github.com/projector/projector/source/sqs"
)

// TestSQSOutageIsNotAStall cuts the queue's endpoint (a proxy in front of
// the emulator drops every connection and refuses new ones) while messages
// wait, for 2.5 times the stall timeout. An outage is not a wedge: Run
// goes on, no stall is found, /healthz stays 200, and /readyz turns 503
// within 10 s naming the queue. Once the endpoint answers again the
// projector resumes in place, and every job ends exact.
func TestSQSOutageIsNotAStall(t *testing.T) {
	if testing.Short() {
		t.Skip("an outage of 10 s")
	}
	e := sqstest.New(t)
	queue := sqstest.Queue(t, e, 2*time.Second)
	u, err := url.Parse(e.Endpoint)
	require.NoError(t, err)
	proxy := faulttest.NewProxy(t, u.Host)
	st := pgtest.Store(t)
	logs := &logLines{t: t}
	const stall = 4 * time.Second

	// The batch after the waiting messages is held before its commit
	// until the queue's count has shown them: the lag the watchdog sees
	// through the outage.
	hold := make(chan struct{})
	var released atomic.Bool
	release := func() {
		if released.CompareAndSwap(false, true) {
			close(hold)
		}
	}
	defer release()
	var gated atomic.Bool
	cfg := Config{
		Source: SourceSQS, SQS: emulatorSQS(e, queue, 2*time.Second), Store: st, Logger: logs.logger(),
		BatchSize: 500, BatchLinger: 20 * time.Millisecond, GapWaitOff: true, StallTimeout: stall,
		testBeforeApply: func(int) {
			if gated.Load() {
				<-hold
			}
		},
	}
	cfg.SQS.Endpoint = "http://" + proxy.Addr()
	run := startEngine(t, cfg)
	srv := httptest.NewServer(run.p.Handler())
	defer srv.Close()
	eventually := func(within time.Duration, what string, cond func() (bool, string)) {
		t.Helper()
		deadline := time.Now().Add(within)
		last := ""
		for time.Now().Before(deadline) {
			ok, why := cond()
			if ok {
				return
			}
			last = why
			time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
		}
		t.Fatalf("%s: not within %s: %s", what, within, last)
	}
	row := func(id string) (int64, string) {
		rows, err := st.LoadJobs(t.Context(), []string{id})
		require.NoError(t, err)
		return rows[id].Version, string(rows[id].State)
	}

	sendSQS(t, e, queue, "before", qsnap("before", 1, `{"n":1}`))
	eventually(20*time.Second, "before is projected and the instance ready", func() (bool, string) {
		v, _ := row("before")
		code, h := probe(t, srv, "/readyz")
		return v == 1 && code == http.StatusOK, fmt.Sprintf("before at %d, /readyz %d %s", v, code, failing(h))
	})

	gated.Store(true)
	var jobs []string
	for i := range 10 {
		id := fmt.Sprintf("during-%d", i)
		jobs = append(jobs, id)
		sendSQS(t, e, queue, id, qsnap(id, 1, `{"n":1}`), id, qincr(id, 2, 10))
	}
	eventually(20*time.Second, "the waiting messages show as lag", func() (bool, string) {
		s := run.p.Status()
		return len(s.Partitions) == 1 && s.Partitions[0].Lag > 0, fmt.Sprintf("%+v", s.Partitions)
	})

	cutAt := time.Now()
	proxy.Cut()
	gated.Store(false)
	release()
	var notReadyAt time.Time
	eventually(10*time.Second, "/readyz turns 503 naming the queue", func() (bool, string) {
		code, h := probe(t, srv, "/readyz")
		for _, c := range h.Checks {
			if c.Name == "queue" && code == http.StatusServiceUnavailable && !c.OK && strings.Contains(c.Detail, queue) {
				notReadyAt = time.Now()
				return true, ""
			}
		}
		return false, fmt.Sprintf("/readyz %d %+v", code, h.Checks)
	})
	// The outage lasts 2.5 stall timeouts in all: Run must not end.
	for time.Since(cutAt) < 5*stall/2 {
		select {
		case err := <-run.done:
			run.done <- err
			t.Fatalf("Run ended during the queue's outage: %v", err)
		case <-time.After(100 * time.Millisecond): // the outage's length, not synchronisation
		}
		code, h := probe(t, srv, "/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code, "/readyz during the outage: %+v", h.Checks)
	}
	require.Empty(t, logs.matching("stalled"), "an outage of the queue is not a stall")
	code, h := probe(t, srv, "/healthz")
	require.Equal(t, http.StatusOK, code, "an outage is not a wedge: %s", failing(h))
	require.NotEmpty(t, logs.matching("SQS is failing; retrying"))

	restoredAt := time.Now()
	proxy.Restore()
	var caughtUpAt time.Time
	eventually(30*time.Second, "every job is exact", func() (bool, string) {
		for _, id := range jobs {
			if v, state := row(id); v != 2 || state != `{"n": 11}` {
				return false, fmt.Sprintf("%s at %d: %s", id, v, state)
			}
		}
		caughtUpAt = time.Now()
		return true, ""
	})
	var readyAt time.Time
	eventually(30*time.Second, "/readyz is 200 again", func() (bool, string) {
		code, h := probe(t, srv, "/readyz")
		readyAt = time.Now()
		return code == http.StatusOK, failing(h)
	})
	require.NotEmpty(t, logs.matching("SQS answers again"))
	t.Logf("outage timeline: cut at 0s, /readyz 503 at %s, restored at %s, jobs exact at %s, /readyz 200 at %s",
		notReadyAt.Sub(cutAt).Round(time.Millisecond), restoredAt.Sub(cutAt).Round(time.Millisecond),
		caughtUpAt.Sub(cutAt).Round(time.Millisecond), readyAt.Sub(cutAt).Round(time.Millisecond))
}

// TestSQSHungReceiveIsCutAndCounted stalls the queue's endpoint: a proxy
// in front of the emulator accepts connections and passes no byte either
// way, so a receive neither answers nor fails (the SDK's HTTP client has
// no timeout of its own). Each receive is cut at its long poll (1 s) plus
// 10 s and counted as a failed receive: the outage is logged naming the
// bound, /readyz turns 503 naming the queue, and Run goes on with no
// stall. Once the endpoint answers again the waiting messages are
// projected and /readyz is 200 again. Without the bound the receive hangs
// until the endpoint comes back (for ever, on a connection that never
// does) and no receive failure is ever seen.
func TestSQSHungReceiveIsCutAndCounted(t *testing.T) {
	if testing.Short() {
		t.Skip("a stall of 20 s")
	}
	e := sqstest.New(t)
	queue := sqstest.Queue(t, e, 2*time.Second)
	u, err := url.Parse(e.Endpoint)
	require.NoError(t, err)
	proxy := faulttest.NewProxy(t, u.Host)
	st := pgtest.Store(t)
	logs := &logLines{t: t}
	cfg := Config{
		Source: SourceSQS, SQS: emulatorSQS(e, queue, 2*time.Second), Store: st, Logger: logs.logger(),
		BatchSize: 500, BatchLinger: 20 * time.Millisecond, GapWaitOff: true, StallTimeout: 4 * time.Second,
	}
	cfg.SQS.Endpoint = "http://" + proxy.Addr()
	run := startEngine(t, cfg)
	srv := httptest.NewServer(run.p.Handler())
	defer srv.Close()
	eventually := func(within time.Duration, what string, cond func() (bool, string)) {
		t.Helper()
		deadline := time.Now().Add(within)
		last := ""
		for time.Now().Before(deadline) {
			select {
			case err := <-run.done:
				run.done <- err
				t.Fatalf("Run ended: %v", err)
			default:
			}
			ok, why := cond()
			if ok {
				return
			}
			last = why
			time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
		}
		t.Fatalf("%s: not within %s: %s", what, within, last)
	}
	version := func(id string) int64 {
		rows, err := st.LoadJobs(t.Context(), []string{id})
		require.NoError(t, err)
		return rows[id].Version
	}
	sendSQS(t, e, queue, "before", qsnap("before", 1, `{"n":1}`))
	eventually(20*time.Second, "before is projected and the instance ready", func() (bool, string) {
		code, h := probe(t, srv, "/readyz")
		return version("before") == 1 && code == http.StatusOK, failing(h)
	})

	stalledAt := time.Now()
	proxy.Stall()
	var jobs []string
	for i := range 5 {
		id := fmt.Sprintf("during-%d", i)
		jobs = append(jobs, id)
		sendSQS(t, e, queue, id, qsnap(id, 1, `{"n":1}`))
	}
	bound := time.Second + sqssrc.ReceiveSlack
	var cutAt, notReadyAt time.Time
	eventually(bound+5*time.Second, "a hung receive is cut and counted as failed", func() (bool, string) {
		if len(logs.matching("SQS is failing; retrying", "receive from", "no answer within "+bound.String())) == 0 {
			return false, fmt.Sprintf("%d lines logged", len(logs.matching()))
		}
		cutAt = time.Now()
		return true, ""
	})
	eventually(10*time.Second, "/readyz turns 503 naming the queue", func() (bool, string) {
		code, h := probe(t, srv, "/readyz")
		if code == http.StatusServiceUnavailable && strings.Contains(failing(h), queue) {
			notReadyAt = time.Now()
			return true, ""
		}
		return false, fmt.Sprintf("/readyz %d %s", code, failing(h))
	})
	require.Empty(t, logs.matching("stalled"), "a hung endpoint is an outage, not a stall")
	code, h := probe(t, srv, "/healthz")
	require.Equal(t, http.StatusOK, code, "an outage is not a wedge: %s", failing(h))
	for _, id := range jobs {
		require.Zero(t, version(id))
	}

	restoredAt := time.Now()
	proxy.Restore()
	var readyAt time.Time
	eventually(30*time.Second, "every job is projected and /readyz is 200 again", func() (bool, string) {
		for _, id := range jobs {
			if v := version(id); v != 1 {
				return false, fmt.Sprintf("%s at %d", id, v)
			}
		}
		code, h := probe(t, srv, "/readyz")
		readyAt = time.Now()
		return code == http.StatusOK, failing(h)
	})
	require.NotEmpty(t, logs.matching("SQS answers again"))
	t.Logf("endpoint stalled at 0s: receive cut and logged at %s, /readyz 503 at %s, restored at %s, caught up and /readyz 200 at %s",
		cutAt.Sub(stalledAt).Round(time.Millisecond), notReadyAt.Sub(stalledAt).Round(time.Millisecond),
		restoredAt.Sub(stalledAt).Round(time.Millisecond), readyAt.Sub(stalledAt).Round(time.Millisecond))
}

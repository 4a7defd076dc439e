package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// apiAddr waits for the "serving /wait" log line and returns its address.
func (p *proc) apiAddr(within time.Duration) string {
	p.t.Helper()
	var addr string
	eventually(p.t, within, p.name+" serves /wait", func() (bool, string) {
		p.requireAlive()
		for _, line := range p.logs.lines() {
			var l struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "serving /wait" && l.Addr != "" {
				addr = l.Addr
				return true, ""
			}
		}
		return false, "no 'serving /wait' log line yet"
	})
	return addr
}

func metrics(t *testing.T, httpAddr string) string {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(raw)
}

type waitAnswer struct {
	code int
	body map[string]any
	err  error
}

func getWait(url string) waitAnswer {
	resp, err := http.Get(url)
	if err != nil {
		return waitAnswer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	a := waitAnswer{code: resp.StatusCode, err: err}
	if err == nil {
		a.err = json.Unmarshal(raw, &a.body)
	}
	return a
}

// TestRunServesWait: `projector run --api-addr` answers a long-poll once
// the write it waits for is visible, by job and by position (a quarantined
// record's position too), counts the waits in /metrics, and answers the
// waits it holds when it stops.
func TestRunServesWait(t *testing.T) {
	t.Parallel()
	s := newStory(t, 1)
	p := startBin(t, "run", dbEnv(), s.runArgs("g-wait", "waiter", "--api-addr", "127.0.0.1:0")...)
	api := "http://" + p.apiAddr(15*time.Second)
	httpAddr := p.httpAddr(15 * time.Second)

	byJob := make(chan waitAnswer, 1)
	go func() { byJob <- getWait(api + "/wait?job=job-42&version=2&timeout=30s") }()
	byOffset := make(chan waitAnswer, 1)
	go func() { byOffset <- getWait(api + "/wait?partition=0&offset=2&timeout=30s") }()
	eventually(t, 10*time.Second, "two waiters", func() (bool, string) {
		return strings.Contains(metrics(t, httpAddr), "projector_waiters 2\n"), "not held yet"
	})
	s.seedStory(false)                                // offsets 0 and 1: job-42 v1, v2
	s.produce(rec(0, "bad", []byte("not json at 2"))) // offset 2, quarantined

	a := <-byJob
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.code, "%v", a.body)
	require.Equal(t, map[string]any{"reached": true, "job_id": "job-42", "version": 2.0, "deleted": false, "missing": []any{}}, a.body)
	a = <-byOffset
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.code, "%v", a.body)
	require.Equal(t, true, a.body["reached"])
	require.Equal(t, 3.0, a.body["position"], "the quarantined record's position passed")

	a = getWait(api + "/wait?job=job-42&version=3&timeout=10ms")
	require.NoError(t, a.err)
	require.Equal(t, http.StatusGatewayTimeout, a.code)
	a = getWait(api + "/wait?job=job-42")
	require.Equal(t, http.StatusBadRequest, a.code)
	require.Contains(t, a.body["error"], "version")

	raw := metrics(t, httpAddr)
	require.Contains(t, raw, `projector_waits_total{outcome="reached"} 2`)
	require.Contains(t, raw, `projector_waits_total{outcome="timeout"} 1`)
	require.Contains(t, raw, `projector_wait_duration_seconds_count 3`)

	held := make(chan waitAnswer, 1)
	go func() { held <- getWait(api + "/wait?job=never&version=1&timeout=60s") }()
	eventually(t, 10*time.Second, "a held waiter", func() (bool, string) {
		return strings.Contains(metrics(t, httpAddr), "projector_waiters 1\n"), "not held yet"
	})
	p.stop(stopWithin)
	a = <-held
	require.NoError(t, a.err, "a held wait is answered, not dropped, when the instance stops")
	require.Equal(t, http.StatusServiceUnavailable, a.code, "%v", a.body)
	require.Equal(t, false, a.body["reached"])
}

// TestRunAPIAddrInUse: clients depend on --api-addr, so a taken address
// stops the start (exit 1), unlike a taken default --http-addr.
func TestRunAPIAddrInUse(t *testing.T) {
	t.Parallel()
	s := newStory(t, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	r := runBin(t, 30*time.Second, dbEnv(), s.runArgs("g-api", "api", "--api-addr", ln.Addr().String())...)
	require.Equal(t, 1, r.code, "%s", r)
	require.Contains(t, r.stderr, "--api-addr "+ln.Addr().String(), "%s", r)
}

package wait_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
	"github.com/projector/projector/wait"
)

func get(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var body map[string]any
	require.NoError(t, json.Unmarshal(raw, &body), "%s", raw)
	return resp.StatusCode, body
}

func TestHTTPWait(t *testing.T) {
	t.Parallel()
	r := newRig(t, wait.Config{})
	srv := httptest.NewServer(wait.Handler(r.waiter, "t"))
	t.Cleanup(srv.Close)
	r.apply(t, map[string]int64{"x": 2}, store.Held{JobID: "x", Version: 5, Offset: 1, Ops: json.RawMessage(`[]`), Since: time.Now()})

	code, body := get(t, srv.URL+"/wait?job=x&version=2&timeout=2s")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, map[string]any{"reached": true, "job_id": "x", "version": 2.0, "deleted": false, "missing": []any{3.0, 4.0}}, body)

	code, body = get(t, srv.URL+"/wait?job=x&version=5&timeout=50ms")
	require.Equal(t, http.StatusGatewayTimeout, code)
	require.Equal(t, false, body["reached"])
	require.Equal(t, []any{3.0, 4.0}, body["missing"], "a job held behind a gap says what it waits for")

	code, body = get(t, srv.URL+"/wait?job=nobody&version=1&timeout=50ms")
	require.Equal(t, http.StatusGatewayTimeout, code)
	require.Equal(t, map[string]any{"reached": false, "job_id": "nobody", "version": 0.0, "deleted": false, "missing": []any{}}, body)

	code, body = get(t, srv.URL+"/wait?partition=0&offset=1&timeout=2s")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, map[string]any{"reached": true, "topic": "t", "partition": 0.0, "offset": 1.0, "position": 2.0}, body)

	code, body = get(t, srv.URL+"/wait?partition=0&offset=2&timeout=50ms")
	require.Equal(t, http.StatusGatewayTimeout, code)
	require.Equal(t, false, body["reached"])
	require.Equal(t, 2.0, body["position"])

	code, body = get(t, srv.URL+"/wait?partition=1&offset=0&timeout=50ms")
	require.Equal(t, http.StatusGatewayTimeout, code)
	require.Equal(t, -1.0, body["position"], "a partition never projected has no position")
}

func TestHTTPWaitRefusesBadParameters(t *testing.T) {
	t.Parallel()
	w, err := wait.New(wait.Config{Store: pgtest.Store(t)})
	require.NoError(t, err)
	kafka := httptest.NewServer(wait.Handler(w, "t"))
	t.Cleanup(kafka.Close)
	sqs := httptest.NewServer(wait.Handler(w, ""))
	t.Cleanup(sqs.Close)
	for _, c := range []struct {
		srv    *httptest.Server
		query  string
		reason string
	}{
		{kafka, "", "want job and version"},
		{kafka, "job=x", "version"},
		{kafka, "job=x&version=0", "version \"0\""},
		{kafka, "job=x&version=seven", "version \"seven\""},
		{kafka, "version=3", "job: missing"},
		{kafka, "job=x&version=1&partition=0&offset=1", "not both"},
		{kafka, "partition=-1&offset=1", "partition \"-1\""},
		{kafka, "partition=0", "offset"},
		{kafka, "partition=0&offset=x", "offset \"x\""},
		{kafka, "job=x&version=1&timeout=2", "timeout \"2\""},
		{kafka, "job=x&version=1&timeout=61s", "at most 1m0s"},
		{kafka, "job=x&version=1&timeout=-1s", "timeout"},
		{kafka, "partition=0&offset=1&topic=", "stores no positions"},
		{sqs, "partition=0&offset=1", "stores no positions"},
	} {
		code, body := get(t, c.srv.URL+"/wait?"+c.query)
		require.Equal(t, http.StatusBadRequest, code, c.query)
		require.Contains(t, body["error"], c.reason, c.query)
	}
}

func TestHTTPWaitTooManyAndShutdown(t *testing.T) {
	t.Parallel()
	w, err := wait.New(wait.Config{Store: pgtest.Store(t), MaxWaiters: 1})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	srv := httptest.NewServer(wait.Handler(w, "t"))
	t.Cleanup(srv.Close)
	type answer struct {
		code int
		body map[string]any
	}
	held := make(chan answer, 1)
	go func() {
		code, body := get(t, srv.URL+"/wait?job=x&version=1&timeout=30s")
		held <- answer{code, body}
	}()
	require.Eventually(t, func() bool { return w.Waiting() == 1 }, 5*time.Second, time.Millisecond)
	code, body := get(t, srv.URL+"/wait?partition=0&offset=0&timeout=30s")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body["error"], "too many waiters")

	stop()
	require.NoError(t, <-ran)
	a := <-held
	require.Equal(t, http.StatusServiceUnavailable, a.code, "a waiter is answered when the instance stops")
	require.Equal(t, map[string]any{"reached": false, "job_id": "x", "version": 0.0, "deleted": false, "missing": []any{},
		"error": "this instance is stopping; ask again, or another instance"}, a.body)
}

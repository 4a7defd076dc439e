package projection

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/observe"
	"github.com/projector/projector/store"
)

func getBody(t *testing.T, u string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, string(b)
}

// TestStatusPageShowsHeldGapEscaped: GET / renders the partitions, the
// readiness, the quarantine count and the held gap of a job whose id
// carries terminal escapes, a newline, a bidi override and HTML: the id
// appears as projector status prints it (Go escapes), HTML-escaped on top,
// with no control character in the page; its link leads to GET
// /explain/{job_id}, which answers the job's explanation as JSON.
func TestStatusPageShowsHeldGapEscaped(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	run := r.start(r.config(func(c *Config) { c.GapWait, c.GapWaitOff = time.Hour, false; c.NoReread = true }))
	evil := "job\x1b[2J\nFORGED\u202e\x07<b>&"
	ev := func(v int64, kind string) map[string]any {
		m := map[string]any{"job_id": evil, "version": v, "kind": kind, "event_id": "e" + kind}
		if kind == "snapshot" {
			m["state"] = map[string]any{"n": 0}
		} else {
			m["ops"] = []map[string]any{{"op": "increment", "path": "/n", "by": 1}}
		}
		return m
	}
	r.produce(
		rec{0, evil, ev(1, "snapshot")},
		rec{0, evil, ev(3, "delta")},
		rec{0, "q", "not json"},
	)
	r.caughtUp(20*time.Second, run)
	r.eventually(10*time.Second, "the job is held", func() (bool, string) {
		c := run.p.Status().Counters
		return c.HeldJobs == 1 && c.Quarantined == 1, ""
	})

	srv := httptest.NewServer(run.p.Handler())
	defer srv.Close()
	code, hdr, page := getBody(t, srv.URL+"/")
	require.Equal(t, http.StatusOK, code, page)
	require.Equal(t, "text/html; charset=utf-8", hdr.Get("Content-Type"))
	require.Contains(t, hdr.Get("Content-Security-Policy"), "default-src 'none'")
	require.Contains(t, hdr.Get("Content-Security-Policy"), "frame-ancestors 'none'", "another site could frame the page")
	require.Equal(t, "DENY", hdr.Get("X-Frame-Options"))
	for _, c := range page {
		if c != '\n' && (c < 0x20 || c == 0x7f || c == '\u202e') {
			t.Fatalf("the page carries control character %U:\n%s", c, page)
		}
	}
	require.NotContains(t, page, "<script")
	require.NotContains(t, page, "<b>&", "record text reached the page unescaped")
	// As projector status prints it, then HTML-escaped.
	shown := Printable(evil)
	require.Equal(t, `job\x1b[2J\nFORGED\u202e\a<b>&`, shown)
	require.Contains(t, page, `<code>job\x1b[2J\nFORGED\u202e\a&lt;b&gt;&amp;</code>`)
	require.Contains(t, page, `<h2>Held jobs: 1</h2>`)
	require.Contains(t, page, `<td>1</td><td>2</td><td>1</td>`, "row version 1, missing 2, one held delta")
	require.Contains(t, page, `<span id="quarantined">1</span>`)
	require.Contains(t, page, `<span class="ok" id="ready">ready</span>`)
	require.Contains(t, page, `<tr><td>0</td><td>3</td>`, "partition 0 at next offset 3")

	// The job's link, followed as a browser would.
	i := strings.Index(page, `<a href="explain/`)
	require.Positive(t, i, page)
	href := page[i+len(`<a href="`):]
	href = href[:strings.IndexByte(href, '"')]
	href = strings.ReplaceAll(href, "&amp;", "&")
	u, err := url.Parse(srv.URL + "/")
	require.NoError(t, err)
	ref, err := url.Parse(href)
	require.NoError(t, err)
	code, hdr, body := getBody(t, u.ResolveReference(ref).String())
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "application/json", hdr.Get("Content-Type"))
	require.Equal(t, "nosniff", hdr.Get("X-Content-Type-Options"), "a job id of HTML could be sniffed as a page")
	var ex Explanation
	require.NoError(t, json.Unmarshal([]byte(body), &ex))
	require.Equal(t, evil, ex.JobID)
	require.Equal(t, int64(1), ex.Version)
	require.Equal(t, []int64{2}, ex.WaitingFor)
	require.Len(t, ex.Held, 1)
	require.Equal(t, int64(3), ex.Held[0].Version)
	require.NotContains(t, body, "\x1b", "JSON escapes control characters")

	code, _, body = getBody(t, srv.URL+"/explain/no-such-job")
	require.Equal(t, http.StatusNotFound, code, body)
	code, _, body = getBody(t, srv.URL+"/?held_limit=0")
	require.Equal(t, http.StatusBadRequest, code, body)
}

// TestExplainLink: a job id of any bytes, slashes and dots included, is
// one link that the instance's GET /explain answers for that very id.
func TestExplainLink(t *testing.T) {
	t.Parallel()
	p, err := New(Config{Brokers: []string{"127.0.0.1:9"}, Topic: "t", Store: pgtest.Store(t)})
	require.NoError(t, err)
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()
	base, err := url.Parse(srv.URL + "/")
	require.NoError(t, err)
	for _, job := range []string{"job-42", "a/b", "x y?z#w", ".", "..", "../x", "%2F", "job\x1b[2J\n\u202e"} {
		ref, err := url.Parse(observe.ExplainLink(job))
		require.NoError(t, err, "%q", job)
		code, _, body := getBody(t, base.ResolveReference(ref).String())
		require.Equal(t, http.StatusNotFound, code, "%q: %s", job, body)
		var answer map[string]string
		require.NoError(t, json.Unmarshal([]byte(body), &answer))
		require.Equal(t, "job "+strconv.QuoteToGraphic(job)+" is neither in the read model nor held nor deleted", answer["error"])
	}
}

// TestExplainBoundedWhenPostgresHangs: with a PostgreSQL that accepts
// connections and never answers, GET /explain answers 503 saying so once
// its timeout passes instead of hanging with the client, and while one
// explanation is in flight at the bound, the next is refused 503 at once
// (with Retry-After) instead of queueing behind it.
func TestExplainBoundedWhenPostgresHangs(t *testing.T) {
	t.Parallel()
	// A black hole: connections accepted, held open, never answered.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var held sync.WaitGroup
	conns := make(chan net.Conn, 16)
	held.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		held.Wait()
		close(conns)
		for c := range conns {
			_ = c.Close()
		}
	})
	pool, err := pgxpool.New(context.Background(), "postgres://u@"+ln.Addr().String()+"/db?sslmode=disable&connect_timeout=60")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	st, err := store.New(pool, store.Config{})
	require.NoError(t, err)
	p, err := New(Config{Brokers: []string{"127.0.0.1:9"}, Topic: "t", Store: st})
	require.NoError(t, err)
	ex := newExplainer(p, 500*time.Millisecond, 1)
	srv := httptest.NewServer(p.handler(ex))
	defer srv.Close()
	// Without the bound the first request would hang with PostgreSQL:
	// the client gives up long before, and the test says so.
	client := &http.Client{Timeout: 30 * time.Second}
	get := func(path string) (int, http.Header, map[string]string) {
		resp, err := client.Get(srv.URL + path)
		require.NoError(t, err, "GET %s", path)
		defer resp.Body.Close()
		var body map[string]string
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		return resp.StatusCode, resp.Header, body
	}

	type answer struct {
		code int
		body map[string]string
	}
	first := make(chan answer, 1)
	go func() {
		code, _, body := get("/explain/job-1")
		first <- answer{code, body}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for len(ex.slots) == 0 {
		require.True(t, time.Now().Before(deadline), "the first explanation never started")
		time.Sleep(5 * time.Millisecond)
	}
	code, hdr, body := get("/explain/job-2")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body["error"], "busy")
	require.Equal(t, "1", hdr.Get("Retry-After"))

	a := <-first
	require.Equal(t, http.StatusServiceUnavailable, a.code, a.body)
	require.Equal(t, "PostgreSQL did not answer within 500ms", a.body["error"])
	require.Empty(t, ex.slots, "the slot is given back")
}

package projection

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
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
	run := r.start(r.config(func(c *Config) { c.GapWait = time.Hour; c.NoReread = true }))
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
		ref, err := url.Parse(explainLink(job))
		require.NoError(t, err, "%q", job)
		code, _, body := getBody(t, base.ResolveReference(ref).String())
		require.Equal(t, http.StatusNotFound, code, "%q: %s", job, body)
		var answer map[string]string
		require.NoError(t, json.Unmarshal([]byte(body), &answer))
		require.Equal(t, "job "+strconv.QuoteToGraphic(job)+" is neither in the read model nor held nor deleted", answer["error"])
	}
}

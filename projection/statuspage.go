package projection

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The status page: what /status says, as a small HTML page for a person
// with a browser, from the binary alone (no script, no style sheet from
// elsewhere). Text from records goes through [Printable], as projector
// status prints it, and is HTML-escaped on top.

var statusPage = template.Must(template.New("status").Funcs(template.FuncMap{
	"p":       Printable,
	"explain": explainLink,
	"since":   func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"ago":     func(t time.Time) string { return time.Since(t).Round(time.Second).String() },
	"join": func(vs []int64) string {
		s := make([]string, len(vs))
		for i, v := range vs {
			s[i] = strconv.FormatInt(v, 10)
		}
		return strings.Join(s, ",")
	},
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>projector {{p .Topic}}</title>
<style>body{font:14px sans-serif;margin:1em 2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}.bad{color:#b00}.ok{color:#070}code{white-space:pre}</style>
</head><body>
<h1>projector: {{p .Topic}}</h1>
<p>source {{.Source}}{{with .Group}}, group <code>{{p .}}</code>{{end}}, owner <code>{{p .Owner}}</code>{{if eq .Source "kafka"}}, generation {{.Generation}}, lag measured to the {{.LagMeasuredTo}}{{end}}.
<a href="status">/status</a> · <a href="metrics">/metrics</a> · <a href="readyz">/readyz</a> · <a href="healthz">/healthz</a></p>

<h2>Readiness: {{if .Ready}}<span class="ok" id="ready">ready</span>{{else}}<span class="bad" id="ready">not ready</span>{{end}}</h2>
<table><tr><th>check</th><th>ok</th><th>detail</th></tr>
{{range .Readiness.Checks}}<tr><td>{{.Name}}</td><td{{if not .OK}} class="bad"{{end}}>{{.OK}}</td><td><code>{{p .Detail}}</code></td></tr>
{{end}}</table>

<h2>Partitions: {{len .Partitions}}</h2>
{{if .Partitions}}<table><tr><th>partition</th><th>next offset</th><th>high watermark</th><th>last stable</th><th>lag</th><th>epoch</th><th>held jobs</th><th>updated</th></tr>
{{range .Partitions}}<tr><td>{{.Partition}}</td><td>{{.Position}}</td><td>{{.HighWatermark}}</td><td>{{.LastStable}}</td><td>{{if .LagUnknown}}unknown{{else}}{{.Lag}}{{end}}</td><td>{{.Epoch}}</td><td>{{.HeldJobs}}</td><td>{{since .UpdatedAt}}</td></tr>
{{end}}</table>{{else}}<p>This instance works no partition.</p>{{end}}
{{with .SQS}}{{with .Counts}}<p>queue: {{.Visible}} visible, {{.InFlight}} in flight.</p>{{end}}{{end}}

<h2>Held jobs: {{.Counters.HeldJobs}}</h2>
{{if .Held}}<table><tr><th>job</th><th>partition</th><th>row version</th><th>missing</th><th>held deltas</th><th>held since</th><th>held for</th><th>attempts</th><th>last step</th><th>last error</th></tr>
{{range .Held}}<tr><td><a href="{{explain .JobID}}"><code>{{p .JobID}}</code></a></td><td>{{.Partition}}</td><td>{{.Version}}</td><td>{{join .Missing}}</td><td>{{.HeldDeltas}}</td><td>{{since .Since}}</td><td>{{ago .Since}}</td><td>{{.Attempts}}</td><td>{{p .LastStep}}</td><td><code>{{p .LastError}}</code></td></tr>
{{end}}</table>
<p>{{.Page.Listed}} listed, oldest first; {{.Page.Omitted}} not listed{{with .Page.Next}} (<a href="?held_after={{.}}&amp;held_limit={{$.Page.Limit}}">next</a>){{end}}. Each job links to its explanation as JSON (<code>projector explain JOB_ID</code> prints the same).</p>{{end}}

<h2>Quarantine</h2>
<p>Records quarantined by this instance since it started: <span id="quarantined">{{.Counters.Quarantined}}</span>. <code>projector quarantine list</code> lists them all, from PostgreSQL.</p>

<h2>Records</h2>
<table><tr><th>consumed</th><th>applied</th><th>stale</th><th>duplicate</th><th>conflict</th><th>held</th><th>deleted</th><th>batches</th><th>fenced</th><th>gaps opened</th><th>database errors</th><th>stalls</th></tr>
{{with .Counters}}<tr><td>{{.Consumed}}</td><td>{{.Applied}}</td><td>{{.Stale}}</td><td>{{.Duplicates}}</td><td>{{.Conflicts}}</td><td>{{.Held}}</td><td>{{.Deleted}}</td><td>{{.Batches}}</td><td>{{.Fenced}}</td><td>{{.GapsOpened}}</td><td>{{.DatabaseErrors}}</td><td>{{.Stalls}}</td></tr>{{end}}
</table>
</body></html>
`))

// explainLink is the page's link to a job's explanation, relative to it:
// explain/{job_id}, or explain?job_id= for an id that a path cannot
// carry (. and .., which a URL's path resolves away).
func explainLink(job string) string {
	if job == "." || job == ".." {
		return "explain?" + url.Values{"job_id": {job}}.Encode()
	}
	return "explain/" + url.PathEscape(job)
}

// statusView is a [Status] as the page lays it out.
type statusView struct {
	Status
	Held []heldRow
	Page HeldPage
}

type heldRow struct {
	HeldJob
	Partition int
}

func viewOf(s Status) statusView {
	v := statusView{Status: s, Page: s.HeldPage}
	for _, ps := range s.Partitions {
		for _, h := range ps.Held {
			v.Held = append(v.Held, heldRow{HeldJob: h, Partition: ps.Partition})
		}
	}
	// Oldest first across partitions, the order /status pages them in.
	sort.Slice(v.Held, func(i, j int) bool {
		return keyOf(v.Held[i].Partition, v.Held[i].HeldJob).before(keyOf(v.Held[j].Partition, v.Held[j].HeldJob))
	})
	return v
}

// serveStatusPage answers GET / with the status page; held_limit and
// held_after page the held jobs as on /status.
func (p *Projector) serveStatusPage(w http.ResponseWriter, r *http.Request) {
	q, err := heldQueryOf(r.URL.Query())
	var s Status
	if err == nil {
		s, err = p.StatusPage(q)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// Nothing but the page itself: no script, no fetch, no form, no base
	// to move its links; and no other site may frame it (default-src does
	// not cover frame-ancestors).
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if err := statusPage.Execute(w, viewOf(s)); err != nil {
		p.cfg.Logger.Warn("status page", "err", err)
	}
}

// explainer answers GET /explain/{job_id} (or /explain?job_id=). Each
// answer is a PostgreSQL transaction on the pool the workers commit with,
// and anyone who reaches the HTTP port can ask: so at most limit are in
// flight (one more is answered 503 at once rather than queued, so a
// client looping on it cannot pile up goroutines or take the workers'
// connections), and each is cut after timeout (a PostgreSQL that does not
// answer makes /explain answer 503, not hang, and lets the server's
// shutdown finish).
type explainer struct {
	p       *Projector
	timeout time.Duration
	slots   chan struct{}
}

// Explain's bounds on the HTTP port.
const (
	explainTimeout  = 5 * time.Second
	explainInFlight = 2
)

func newExplainer(p *Projector, timeout time.Duration, limit int) *explainer {
	return &explainer{p: p, timeout: timeout, slots: make(chan struct{}, limit)}
}

// ServeHTTP answers with what explain says of the job, as JSON; 404 when
// the store knows nothing of it, 503 when busy or PostgreSQL fails or
// does not answer within the timeout.
func (e *explainer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	job := r.PathValue("job_id")
	if job == "" {
		job = r.URL.Query().Get("job_id")
	}
	if job == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "want a job id: /explain/{job_id} or /explain?job_id="})
		return
	}
	if len(job) > maxExplainJobID {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("job id of %d bytes: at most %d", len(job), maxExplainJobID)})
		return
	}
	select {
	case e.slots <- struct{}{}:
		defer func() { <-e.slots }()
	default:
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": fmt.Sprintf("busy: %d explanations in flight, the most this instance answers at once; try again", cap(e.slots))})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), e.timeout)
	defer cancel()
	ex, err := e.p.cfg.Store.Explain(ctx, job, DefaultExplainGaps)
	if err != nil {
		if r.Context().Err() != nil {
			return // the client left
		}
		msg := err.Error()
		if ctx.Err() != nil {
			msg = fmt.Sprintf("PostgreSQL did not answer within %s", e.timeout)
		}
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": msg})
		return
	}
	if !Known(ex) {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "job " + strconv.QuoteToGraphic(job) + " is neither in the read model nor held nor deleted"})
		return
	}
	writeJSON(w, http.StatusOK, ExplanationOf(job, ex))
}

// maxExplainJobID bounds the job id /explain looks up, as /wait does.
const maxExplainJobID = 512

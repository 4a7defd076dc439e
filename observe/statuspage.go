package observe

import (
	"html/template"
	"log/slog"
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
	"explain": ExplainLink,
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

// ExplainLink is the page's link to a job's explanation, relative to it:
// explain/{job_id}, or explain?job_id= for an id that a path cannot
// carry (. and .., which a URL's path resolves away).
func ExplainLink(job string) string {
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
func serveStatusPage(e Engine, log *slog.Logger, w http.ResponseWriter, r *http.Request) {
	q, err := heldQueryOf(r.URL.Query())
	var s Status
	if err == nil {
		s, err = e.StatusPage(q)
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
		log.Warn("status page", "err", err)
	}
}

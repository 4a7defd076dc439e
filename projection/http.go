package projection

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/projector/projector/observe"
)

// Handler serves /healthz (every loop of the instance is alive), /readyz
// (the topic exists, the instance is in a group generation, PostgreSQL
// answered in the last 5 s, and with ReadyMaxLag the lag is small enough),
// /status (JSON) and /metrics (Prometheus). /healthz and /readyz answer 200
// or 503 with a JSON body that says, check by check, why. /status lists
// the oldest held jobs, held_limit of them (default DefaultHeldLimit, at
// most MaxHeldLimit) after the cursor held_after, so that its size and
// cost do not grow with the number held; a bad query is answered 400.
// GET / is the status page: /status as HTML for a browser, each held job
// linking to GET /explain/{job_id}, what projector explain says of it as
// JSON (a few at a time, each cut after a few seconds: see [explainer]).
// The handler itself is [observe.Handler]; the explainer reads the store,
// so it stays with the engine.
func (p *Projector) Handler() http.Handler {
	return p.handler(newExplainer(p, explainTimeout, explainInFlight))
}

func (p *Projector) handler(explain *explainer) http.Handler {
	return observe.Handler(p, p.metrics.Handler(), explain, p.cfg.Logger)
}

// What a status pages through, in package observe.
type (
	HeldQuery = observe.HeldQuery
	HeldPage  = observe.HeldPage
)

// The bounds of the held jobs a status lists ([observe.DefaultHeldLimit],
// [observe.MaxHeldLimit]).
const (
	DefaultHeldLimit = observe.DefaultHeldLimit
	MaxHeldLimit     = observe.MaxHeldLimit
)

// Printable escapes what a terminal would interpret in text from records
// or the database ([observe.Printable]).
func Printable(s string) string { return observe.Printable(s) }

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
		observe.WriteJSON(w, http.StatusBadRequest, map[string]string{"error": "want a job id: /explain/{job_id} or /explain?job_id="})
		return
	}
	if len(job) > maxExplainJobID {
		observe.WriteJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("job id of %d bytes: at most %d", len(job), maxExplainJobID)})
		return
	}
	select {
	case e.slots <- struct{}{}:
		defer func() { <-e.slots }()
	default:
		w.Header().Set("Retry-After", "1")
		observe.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"error": fmt.Sprintf("busy: %d explanations in flight, the most this instance answers at once; try again", cap(e.slots))})
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
		observe.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"error": msg})
		return
	}
	if !Known(ex) {
		observe.WriteJSON(w, http.StatusNotFound, map[string]string{"error": "job " + strconv.QuoteToGraphic(job) + " is neither in the read model nor held nor deleted"})
		return
	}
	observe.WriteJSON(w, http.StatusOK, ExplanationOf(job, ex))
}

// maxExplainJobID bounds the job id /explain looks up, as /wait does.
const maxExplainJobID = 512

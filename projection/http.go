package projection

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
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
func (p *Projector) Handler() http.Handler {
	return p.handler(newExplainer(p, explainTimeout, explainInFlight))
}

func (p *Projector) handler(explain *explainer) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeHealth(w, p.Liveness())
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		writeHealth(w, p.Readiness())
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		q, err := heldQueryOf(r.URL.Query())
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		s, err := p.StatusPage(q)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, s)
	})
	mux.Handle("GET /metrics", p.metrics.handler())
	mux.HandleFunc("GET /{$}", p.serveStatusPage)
	mux.Handle("GET /explain/{job_id}", explain)
	mux.Handle("GET /explain", explain)
	return mux
}

// heldQueryOf reads /status's held_limit and held_after.
func heldQueryOf(v url.Values) (HeldQuery, error) {
	var q HeldQuery
	if s := v.Get("held_limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxHeldLimit {
			return q, fmt.Errorf("%w: held_limit %q: want a number from 1 to %d", errHeldQuery, clipString(s), MaxHeldLimit)
		}
		q.Limit = n
	}
	q.After = v.Get("held_after")
	return q, nil
}

func writeHealth(w http.ResponseWriter, h Health) {
	code := http.StatusOK
	if !h.OK {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, h)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	// Record text (a job id in /explain's answer) is never sniffed as HTML.
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

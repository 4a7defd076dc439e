package observe

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
)

// Engine is what the HTTP handler serves from: the engine's liveness,
// readiness and status.
type Engine interface {
	Liveness() Health
	Readiness() Health
	StatusPage(HeldQuery) (Status, error)
}

// Handler serves /healthz (every loop of the instance is alive), /readyz
// (the instance does its work), /status (JSON) and /metrics (metrics, the
// engine's Prometheus handler). /healthz and /readyz answer 200 or 503
// with a JSON body that says, check by check, why. /status lists the
// oldest held jobs, held_limit of them (default DefaultHeldLimit, at most
// MaxHeldLimit) after the cursor held_after, so that its size and cost do
// not grow with the number held; a bad query is answered 400. GET / is
// the status page: /status as HTML for a browser, each held job linking
// to GET /explain/{job_id} (or /explain?job_id=), which explain answers.
// A status page that cannot be written is logged to log.
func Handler(e Engine, metrics, explain http.Handler, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeHealth(w, e.Liveness())
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		writeHealth(w, e.Readiness())
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		q, err := heldQueryOf(r.URL.Query())
		if err != nil {
			WriteJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		s, err := e.StatusPage(q)
		if err != nil {
			WriteJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		WriteJSON(w, http.StatusOK, s)
	})
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		serveStatusPage(e, log, w, r)
	})
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
	WriteJSON(w, code, h)
}

// WriteJSON answers v as indented JSON with code, never cached nor
// sniffed.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	// Record text (a job id in /explain's answer) is never sniffed as HTML.
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

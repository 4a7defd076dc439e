package projection

import (
	"encoding/json"
	"net/http"
)

// Handler serves /healthz (every loop of the instance is alive), /readyz
// (the topic exists, the instance is in a group generation, PostgreSQL
// answered in the last 5 s, and with ReadyMaxLag the lag is small enough),
// /status (JSON) and /metrics (Prometheus). /healthz and /readyz answer 200
// or 503 with a JSON body that says, check by check, why.
func (p *Projector) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeHealth(w, p.Liveness())
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		writeHealth(w, p.Readiness())
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, p.Status())
	})
	mux.Handle("GET /metrics", p.metrics.handler())
	return mux
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
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

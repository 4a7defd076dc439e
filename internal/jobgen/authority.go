package jobgen

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
)

// Authority serves the reference model as the trusted snapshot endpoint:
// GET /jobs/{job_id} answers 200 with a snapshot record value at the job's
// final version, or 404 for a job it does not know.
type Authority struct {
	truth    map[string]Truth
	Requests atomic.Int64
}

// NewAuthority serves truth.
func NewAuthority(truth map[string]Truth) *Authority { return &Authority{truth: truth} }

func (a *Authority) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.Requests.Add(1)
	id, ok := strings.CutPrefix(r.URL.Path, "/jobs/")
	if r.Method != http.MethodGet || !ok || id == "" {
		http.NotFound(w, r)
		return
	}
	t, ok := a.truth[id]
	if !ok {
		http.Error(w, "unknown job", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"job_id": id, "version": t.Version, "kind": "snapshot", "state": t.State, "event_id": "authority",
	})
}

package jobgen

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
)

// Authority serves the reference model as the trusted snapshot endpoint:
// GET /jobs/{job_id} answers 200 with a snapshot record value at the job's
// final version, or 404 for a job it does not know. A deleted job is
// answered both ways the contract allows, by job: 200 with a delete
// record, or 410 Gone with the delete's version.
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
	if t.Deleted {
		if PartitionOf(id, 2) == 0 {
			w.WriteHeader(http.StatusGone)
			_ = json.NewEncoder(w).Encode(map[string]any{"version": t.Version, "event_id": "authority"})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"job_id": id, "version": t.Version, "kind": "delete", "event_id": "authority"})
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{
		"job_id": id, "version": t.Version, "kind": "snapshot", "state": t.State, "event_id": "authority",
	})
}

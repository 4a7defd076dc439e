package projection

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Jobs whose ids look like paths heal through an authority behind Go's
// ServeMux (GET /jobs/{id}), which cleans dot segments: each gets its own
// snapshot, none another job's.
func TestPathLikeJobIDsHealThroughServeMux(t *testing.T) {
	t.Parallel()
	ids := []string{".", "..", "a/../b", "a/b", "b", "a", "./a"}
	auth := &authority{snaps: map[string][]byte{}}
	for _, id := range ids {
		auth.snaps[id] = []byte(snap(id, 3, fmt.Sprintf(`{"id":%q}`, id)))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /jobs/{id}", auth.serve)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	r := newRig(t, 1)
	var recs []rec
	for _, id := range ids {
		// v2 is missing: v3 is held until the authority's v3 closes it.
		recs = append(recs, rec{0, id, snap(id, 1, `{"v":1}`)}, rec{0, id, dlt(id, 3, `[{"op":"set","path":"/v","value":3}]`)})
	}
	r.produce(recs...)
	run := r.start(r.config(func(c *Config) {
		c.NoReread = true
		c.SnapshotURL = srv.URL
		c.SnapshotMaxElapsed = scenarioSnapshotMaxElapsed
		c.SnapshotTimeout = scenarioSnapshotTimeout
	}))
	r.eventually(30*time.Second, "every job healed by the authority", func() (bool, string) {
		c := run.p.Status().Counters
		return c.ClosedBySnapshot == int64(len(ids)) && c.HeldJobs == 0, fmt.Sprintf("%+v", c)
	})
	rows := r.rows()
	for _, id := range ids {
		require.Equal(t, int64(3), rows[id].Version, "job %q", id)
		require.JSONEq(t, fmt.Sprintf(`{"id":%q}`, id), string(rows[id].State), "job %q got its own snapshot", id)
	}
}

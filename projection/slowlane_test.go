package projection

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestASlowAnswerMovesToTheSlowLaneAndStillHeals: with
// --snapshot-concurrency 1, a request whose answer takes 4 s no longer
// holds the only slot once it has run past a few median answer times: the
// jobs held after it heal long before its answer comes. Moved to the slow
// lane, it is cut at 3 x the threshold; the job's next request starts in
// the slow lane and runs to --snapshot-timeout, so the slow job heals when
// that answer comes. /metrics shows the move, the cut and the start.
func TestASlowAnswerMovesToTheSlowLaneAndStillHeals(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	auth := newSlowAuthority(t)
	const (
		gapWait = 300 * time.Millisecond
		slow    = 4 * time.Second
	)
	inc := `[{"op":"increment","path":"/count","by":1}]`
	held := func(ids ...string) {
		var recs []rec
		for _, id := range ids {
			recs = append(recs, rec{0, id, snap(id, 1, counterStateOf(1))}, rec{0, id, dlt(id, 3, inc)})
		}
		r.produce(recs...)
	}
	versions := func(ids ...string) map[string]int64 {
		rows, err := r.store.LoadJobs(context.Background(), ids)
		require.NoError(t, err)
		out := map[string]int64{}
		for _, id := range ids {
			out[id] = rows[id].Version
		}
		return out
	}
	healed := func(ids ...string) (bool, string) {
		v := versions(ids...)
		for _, id := range ids {
			if v[id] != 3 {
				return false, fmt.Sprintf("versions %v", v)
			}
		}
		return true, ""
	}
	var warm, prompt []string
	for i := range 10 {
		warm = append(warm, fmt.Sprintf("warm-%d", i))
		prompt = append(prompt, fmt.Sprintf("prompt-%d", i))
		auth.set(warm[i], 2, 0, false)
		auth.set(prompt[i], 2, 0, false)
	}
	auth.set("slow", 2, slow, false)

	run := r.start(r.config(func(c *Config) {
		c.GapWait, c.GapWaitOff = gapWait, false
		c.NoReread = true
		c.SnapshotURL = auth.url
		c.SnapshotConcurrency = 1
		c.SnapshotTimeout = 20 * time.Second
	}))
	// Enough prompt answers for a median.
	held(warm...)
	r.eventually(15*time.Second, "the warm-up jobs heal", func() (bool, string) { return healed(warm...) })
	require.Positive(t, scrape(t, run.p)["projector_authority_slow_after_seconds"], "no slow threshold after 10 answers")

	held("slow")
	r.eventually(15*time.Second, "the slow job's request reaches the authority", func() (bool, string) {
		return len(auth.asked("slow")) > 0, "not asked yet"
	})
	asked := auth.asked("slow")[0]
	r.eventually(5*time.Second, "the slow request moves to the slow lane", func() (bool, string) {
		m := scrape(t, run.p)
		return m[`projector_authority_requests_in_flight{lane="slow"}`] == 1 && m["projector_authority_slow_lane_moves_total"] >= 1,
			fmt.Sprintf("in flight main %v slow %v, moves %v", m[`projector_authority_requests_in_flight{lane="main"}`],
				m[`projector_authority_requests_in_flight{lane="slow"}`], m["projector_authority_slow_lane_moves_total"])
	})

	held(prompt...)
	r.eventually(15*time.Second, "the jobs held after the slow one heal", func() (bool, string) { return healed(prompt...) })
	promptDone := time.Now()
	require.Less(t, promptDone.Sub(asked), slow, "the prompt jobs waited for the slow answer")
	require.Equal(t, int64(1), versions("slow")["slow"], "the slow job healed before its answer came")
	_, stillHeld := heldJob(run, "slow")
	require.True(t, stillHeld)

	r.eventually(2*slow+15*time.Second, "the slow job heals when an answer comes", func() (bool, string) { return healed("slow") })
	// The moved request was cut; one started in the slow lane was given
	// the whole --snapshot-timeout and answered.
	require.GreaterOrEqual(t, len(auth.asked("slow")), 2, "the moved request was not cut at 3 x the threshold")
	m := scrape(t, run.p)
	requireMetrics(t, m, map[string]float64{
		`projector_authority_requests_in_flight{lane="main"}`: 0,
		`projector_authority_requests_in_flight{lane="slow"}`: 0,
		`projector_authority_requests_total{result="ok"}`:     21,
	})
	// A prompt answer delayed past the threshold on a busy machine moves
	// too: at least the slow one did.
	require.GreaterOrEqual(t, m["projector_authority_slow_lane_moves_total"], 1.0)
	require.GreaterOrEqual(t, m["projector_authority_slow_cut_total"], 1.0)
	require.GreaterOrEqual(t, m["projector_authority_slow_lane_starts_total"], 1.0)
	require.Contains(t, m, "projector_authority_slow_lane_full_total")
}

package gapfill_test

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/gapfill"
)

// TestDetectorScripts runs the golden scripts of testdata/detector. Run
// with -rewrite to regenerate their expected output.
func TestDetectorScripts(t *testing.T) {
	t.Parallel()
	runScripts(t, "testdata/detector", func(t *testing.T) func(*scriptCmd) string {
		r := &detectorRunner{t: t, t0: time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)}
		r.d = gapfill.NewDetector(gapfill.Policy{})
		return r.run
	})
}

type detectorRunner struct {
	t  *testing.T
	t0 time.Time
	d  *gapfill.Detector
}

func (r *detectorRunner) run(c *scriptCmd) string {
	a := argsOf(r.t, c.pos(), c.args)
	defer a.done()
	require.Empty(r.t, c.input, "%s: detector commands take no input", c.pos())
	at := func() time.Time { return r.t0.Add(a.dur("at", 0)) }
	switch c.name {
	case "policy":
		r.d = gapfill.NewDetector(gapfill.Policy{
			Wait:     a.dur("wait", 0),
			Reread:   a.has("reread"),
			Snapshot: a.has("snapshot"),
			RetryMin: a.dur("retry-min", 0),
			RetryMax: a.dur("retry-max", 0),

			SnapshotTimeout:    a.dur("snapshot-timeout", 0),
			SnapshotTimeoutMax: a.dur("snapshot-timeout-max", 0),
		})
		p := r.d.Policy()
		return fmt.Sprintf("policy wait=%s reread=%t snapshot=%t retry=%s..%s timeout=%s..%s steps=%v",
			p.Wait, p.Reread, p.Snapshot, p.RetryMin, p.RetryMax, p.SnapshotTimeout, p.SnapshotTimeoutMax, r.d.Steps())
	case "hold":
		r.d.Hold(a.str("job", ""), at())
		return r.gaps()
	case "progress":
		r.d.Progress(a.str("job", ""), at())
		return r.gaps()
	case "failed":
		step := gapfill.Step(a.str("step", string(gapfill.StepReread)))
		r.d.Failed(a.str("job", ""), at(), step, a.str("err", ""))
		return r.gaps()
	case "timed-out":
		r.d.TimedOut(a.str("job", ""))
		return r.gaps()
	case "close":
		r.d.Close(a.str("job", ""))
		return r.gaps()
	case "reset":
		r.d.Reset()
		return r.gaps()
	case "gaps":
		return r.gaps()
	case "due":
		return fmt.Sprintf("due=[%s]", strings.Join(r.d.Due(at()), " "))
	case "next-due":
		next, ok := r.d.NextDue()
		if !ok {
			require.True(r.t, next.IsZero(), "%s: NextDue gave a time with false", c.pos())
			return "next-due=none"
		}
		return "next-due=" + rel(r.t0, next)
	}
	r.t.Fatalf("%s: unknown command %q", c.pos(), c.name)
	return ""
}

// gaps prints every held job's record, one a line, and checks that Len,
// Gap and Gaps agree.
func (r *detectorRunner) gaps() string {
	gaps := r.d.Gaps()
	require.Len(r.t, gaps, r.d.Len())
	if len(gaps) == 0 {
		return "no gaps"
	}
	lines := make([]string, len(gaps))
	for i, g := range gaps {
		one, ok := r.d.Gap(g.JobID)
		require.True(r.t, ok)
		require.Equal(r.t, g, one)
		lines[i] = fmt.Sprintf("%s since=%s attempts=%d next=%s last=%s", g.JobID, rel(r.t0, g.Since), g.Attempts, rel(r.t0, g.NextAttempt), g.LastStep)
		if g.LastErr != "" {
			lines[i] += " err=" + strconv.Quote(g.LastErr)
		}
		if g.TimedOut > 0 {
			lines[i] += fmt.Sprintf(" timed-out=%d timeout=%s", g.TimedOut, g.Timeout)
		}
	}
	return strings.Join(lines, "\n")
}

// TestDetectorBackoff checks the retry schedule: doubling from RetryMin,
// capped at RetryMax, counted from the failed attempt's time.
func TestDetectorBackoff(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		min, max time.Duration
		want     []time.Duration // after the 1st, 2nd, ... failure
	}{
		{"defaults", 0, 0, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}},
		{"capped", time.Second, 5 * time.Second, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}},
		{"max below min", 10 * time.Second, 3 * time.Second, []time.Duration{3 * time.Second, 3 * time.Second}},
		{"min equals max", 2 * time.Second, 2 * time.Second, []time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := gapfill.NewDetector(gapfill.Policy{Reread: true, RetryMin: tt.min, RetryMax: tt.max})
			d.Hold("a", t0)
			now := t0
			for i, want := range tt.want {
				d.Failed("a", now, gapfill.StepReread, "x")
				g, ok := d.Gap("a")
				require.True(t, ok)
				require.Equal(t, i+1, g.Attempts)
				require.Equal(t, want, g.NextAttempt.Sub(now), "failure %d", i+1)
				now = g.NextAttempt
			}
		})
	}

	t.Run("many failures stay at the cap", func(t *testing.T) {
		t.Parallel()
		d := gapfill.NewDetector(gapfill.Policy{Snapshot: true, RetryMin: time.Millisecond, RetryMax: time.Hour})
		d.Hold("a", t0)
		for range 200 {
			d.Failed("a", t0, gapfill.StepSnapshot, "x")
		}
		g, _ := d.Gap("a")
		require.Equal(t, time.Hour, g.NextAttempt.Sub(t0))
	})
}

// TestDetectorSlowLaneFullCutsInARowFindTheJobSlow: a cut with the slow
// lane full says nothing of the job once, but LaneFullCuts of them in a
// row count as found slow, so the job's next request can start in the
// slow lane instead of being cut at the threshold for ever; any other end
// of an attempt starts the count again.
func TestDetectorSlowLaneFullCutsInARowFindTheJobSlow(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	d := gapfill.NewDetector(gapfill.Policy{Snapshot: true})
	d.Hold("a", t0)
	slow := func() int {
		g, ok := d.Gap("a")
		require.True(t, ok)
		return g.Slow
	}
	for range gapfill.LaneFullCuts - 1 {
		d.SlowLaneFull("a")
	}
	require.Zero(t, slow(), "fewer cuts than LaneFullCuts found the job slow")
	d.Slow("a", false) // an attempt that ended otherwise
	for range gapfill.LaneFullCuts - 1 {
		d.SlowLaneFull("a")
	}
	require.Zero(t, slow(), "the count of cuts in a row did not start again after another end")
	d.SlowLaneFull("a")
	require.Equal(t, 1, slow(), "LaneFullCuts cuts in a row did not find the job slow")
	d.SlowLaneFull("b") // not held: nothing happens
}

// TestDetectorOldest: Oldest gives the n jobs held longest, oldest first
// and by job among equals, the same as sorting every gap would.
func TestDetectorOldest(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	d := gapfill.NewDetector(gapfill.Policy{Wait: time.Minute})
	require.Empty(t, d.Oldest(10))
	for i := range 500 {
		// Many share a Since: the job orders them.
		d.Hold(fmt.Sprintf("job-%03d", (i*7919)%500), t0.Add(time.Duration(i%37)*time.Second))
	}
	all := d.Gaps()
	sort.Slice(all, func(i, j int) bool {
		if !all[i].Since.Equal(all[j].Since) {
			return all[i].Since.Before(all[j].Since)
		}
		return all[i].JobID < all[j].JobID
	})
	for _, n := range []int{0, 1, 16, 100, 499, 500, 1000} {
		want := all[:min(n, len(all))]
		if n == 0 {
			want = nil
		}
		require.Equal(t, want, d.Oldest(n), "n=%d", n)
	}
	// A job that moves forward waits afresh: it is the youngest now.
	d.Progress(all[0].JobID, t0.Add(time.Hour))
	require.NotEqual(t, all[0].JobID, d.Oldest(1)[0].JobID)
	require.Equal(t, all[1].JobID, d.Oldest(1)[0].JobID)
}

// TestFirstAttemptWaitsForTheLaneToReadAsFarAsItsLogEnded: a job held
// while its lane is behind is not taken, beyond Wait, before the lane has
// read as far as its log ended then; the put-off counts no attempt; past
// logWaitFactor Waits, or once read that far, it is taken. Without a log,
// with waiting off, or on a later attempt nothing is put off.
func TestFirstAttemptWaitsForTheLaneToReadAsFarAsItsLogEnded(t *testing.T) {
	t0 := time.Unix(1000, 0)
	wait := 10 * time.Second
	pol := gapfill.Policy{Wait: wait, Reread: true}

	d := gapfill.NewDetector(pol)
	d.HoldUntil("j", t0, 100)
	require.Empty(t, d.Take(t0.Add(wait), 10, 50), "due by time, but the lane has not read as far as its log ended")
	g, _ := d.Gap("j")
	require.Zero(t, g.Attempts, "a put-off is no attempt")
	require.Equal(t, int64(100), g.ReadsTo, "the status says how far the lane must read")
	require.Equal(t, t0.Add(10*wait), g.NextAttempt, "put off to the bound of the wait")
	require.Empty(t, d.Take(t0.Add(wait+time.Second), 10, 99), "not read that far yet")
	require.Equal(t, []string{"j"}, d.Take(t0.Add(wait+time.Second), 10, 100), "read that far: due again at once, and taken")

	d = gapfill.NewDetector(pol)
	d.HoldUntil("j", t0, 100)
	require.Equal(t, []string{"j"}, d.Take(t0.Add(10*wait), 10, 50), "past ten Waits the lane is not waited for")

	for name, tc := range map[string]struct {
		pol      gapfill.Policy
		end, pos int64
	}{
		"not a log":   {pol, 100, -1},
		"end unknown": {pol, -1, 50},
		"waiting off": {gapfill.Policy{Reread: true}, 100, 50},
	} {
		d = gapfill.NewDetector(tc.pol)
		d.HoldUntil("j", t0, tc.end)
		require.Equal(t, []string{"j"}, d.Take(t0.Add(tc.pol.Wait), 10, tc.pos), name)
	}

	d = gapfill.NewDetector(pol)
	d.HoldUntil("j", t0, 100)
	require.Equal(t, []string{"j"}, d.Take(t0.Add(wait), 10, 100))
	d.Failed("j", t0.Add(wait), gapfill.StepReread, "not found")
	g, _ = d.Gap("j")
	require.Equal(t, int64(-1), g.ReadsTo, "a later attempt does not wait for the lane")
	require.Equal(t, []string{"j"}, d.Take(g.NextAttempt, 10, 50), "a later attempt is not put off")

	d = gapfill.NewDetector(pol)
	d.HoldUntil("j", t0, 100)
	d.ProgressUntil("j", t0.Add(time.Second), 200)
	require.Empty(t, d.Take(t0.Add(time.Second+wait), 10, 150), "moved forward: it waits for the log's end as it is then")
}

// TestPutOffJobsCostOnceEach: many jobs waiting for the lane are put off
// once and let go once; a Take in between walks none of them, and the
// jobs let go come out oldest due first, within the limit.
func TestPutOffJobsCostOnceEach(t *testing.T) {
	t0 := time.Unix(1000, 0)
	wait := 10 * time.Second
	d := gapfill.NewDetector(gapfill.Policy{Wait: wait, Reread: true})
	for i := range 1000 {
		d.HoldUntil(fmt.Sprintf("j%04d", i), t0.Add(time.Duration(i)*time.Millisecond), int64(1000+i))
	}
	now := t0.Add(2 * wait)
	require.Empty(t, d.Take(now, 10, 0), "every one put off")
	v := d.Version()
	require.Empty(t, d.Take(now.Add(time.Second), 10, 0), "still waiting")
	require.Equal(t, v, d.Version(), "nothing walked or changed")
	due, ok := d.NextDue()
	require.True(t, ok)
	require.Equal(t, t0.Add(10*wait), due, "the next wake-up is the first bound, not a poll")
	got := d.Take(now.Add(time.Second), 10, 1500)
	require.Equal(t, []string{"j0000", "j0001", "j0002", "j0003", "j0004", "j0005", "j0006", "j0007", "j0008", "j0009"}, got)
	require.Len(t, d.Take(now.Add(time.Second), 1000, 1500), 491, "the rest let go up to 1500")
	require.Empty(t, d.Take(now.Add(time.Second), 1000, 1500))
	// The lane moved at now+1s: the others wait ten Waits from then.
	require.Empty(t, d.Take(t0.Add(11*wait), 1000, 1500), "the lane moved: the bound is counted from its move")
	require.Len(t, d.Take(now.Add(time.Second+10*wait), 1000, 1500), 499, "past the bound the others go too")
}

// TestAGateWaitsWhileItsLaneReads: a first attempt waits for its lane as
// long as the lane keeps reading towards where its log ended (a lane far
// behind on a log whose jobs' events are far apart), up to sixty Waits in
// all; once the lane stops moving, it waits ten Waits more and no longer.
// A move the lane reports on its own turn ([gapfill.Detector.Lane]) counts
// as one a Take sees does.
func TestAGateWaitsWhileItsLaneReads(t *testing.T) {
	t0 := time.Unix(1000, 0)
	wait := 10 * time.Second
	pol := gapfill.Policy{Wait: wait, Reread: true}
	d := gapfill.NewDetector(pol)
	d.HoldUntil("j", t0, 100_000)
	pos := int64(0)
	now := t0
	for range 40 { // four times the bound of a lane that stands still
		now = now.Add(wait)
		pos += 100
		require.Empty(t, d.Take(now, 10, pos), "the lane reads on at %d", pos)
		g, ok := d.Gap("j")
		require.True(t, ok)
		require.Zero(t, g.Attempts)
		require.Equal(t, int64(100_000), g.ReadsTo)
	}
	// The lane stops.
	require.Empty(t, d.Take(now.Add(10*wait-time.Second), 10, pos), "within ten Waits of its last move")
	require.Equal(t, []string{"j"}, d.Take(now.Add(10*wait), 10, pos), "ten Waits after the lane last moved")

	// A lane that never stops: sixty Waits in all.
	d = gapfill.NewDetector(pol)
	d.HoldUntil("j", t0, 100_000)
	pos, now = 0, t0
	for range 59 {
		now = now.Add(wait)
		pos += 100
		require.Empty(t, d.Take(now, 10, pos), "the lane reads on at %d", pos)
	}
	require.Equal(t, []string{"j"}, d.Take(t0.Add(60*wait), 10, pos+100), "sixty Waits after it began, however the lane reads")

	// Moves seen between Takes (no attempt could be taken then) count.
	d = gapfill.NewDetector(pol)
	d.HoldUntil("j", t0, 1000)
	require.Empty(t, d.Take(t0.Add(wait), 10, 10), "put off")
	d.Lane(20, 1000, t0.Add(2*wait))
	require.Empty(t, d.Take(t0.Add(11*wait), 10, 20), "ten Waits from the move the lane reported, not from the Take before")
	require.Equal(t, []string{"j"}, d.Take(t0.Add(12*wait), 10, 20))
}

// TestGatedJobsOfKnownAndUnknownEndsGoTheirOwnWays: a job whose lane's
// end is not known yet sits in the gate with those whose end is, and
// holds none of them up: each known one goes once the lane reads to its
// end.
func TestGatedJobsOfKnownAndUnknownEndsGoTheirOwnWays(t *testing.T) {
	t0 := time.Unix(100_000, 0)
	wait := 10 * time.Second
	d := gapfill.NewDetector(gapfill.Policy{Wait: wait, Reread: true})
	d.HoldRestored("r", t0.Add(-time.Hour), t0)
	d.HoldUntil("k", t0, 60)
	require.Empty(t, d.Take(t0.Add(wait), 10, 50), "both put off")
	require.Equal(t, []string{"k"}, d.Take(t0.Add(wait+time.Second), 10, 60), "k's end is read; r's is not known")
	require.Empty(t, d.Take(t0.Add(wait+2*time.Second), 10, 70))
}

// TestAJobThatStopsWaitingForAnEndIsNotLookedFor: once no held job waits
// for the lane's end, telling the detector the end walks nothing (a
// restored job closed, or moved forward, before the end was known).
func TestAJobThatStopsWaitingForAnEndIsNotLookedFor(t *testing.T) {
	t0 := time.Unix(100_000, 0)
	wait := 10 * time.Second
	for name, stop := range map[string]func(d *gapfill.Detector){
		"closed":         func(d *gapfill.Detector) { d.Close("r") },
		"moved forward":  func(d *gapfill.Detector) { d.ProgressUntil("r", t0, 500) },
		"detector reset": func(d *gapfill.Detector) { d.Reset() },
	} {
		d := gapfill.NewDetector(gapfill.Policy{Wait: wait, Reread: true})
		d.HoldRestored("r", t0.Add(-time.Hour), t0)
		stop(d)
		v := d.Version()
		d.Lane(10, 100, t0.Add(time.Second))
		require.Equal(t, v, d.Version(), "%s: no job waits for the end", name)
	}
	d := gapfill.NewDetector(gapfill.Policy{Wait: wait, Reread: true})
	d.HoldRestored("r", t0.Add(-time.Hour), t0)
	v := d.Version()
	d.Lane(10, 100, t0.Add(time.Second))
	require.NotEqual(t, v, d.Version(), "one waits: it learns the end")
	g, _ := d.Gap("r")
	require.Equal(t, int64(100), g.ReadsTo)
}

// TestARestoredJobWaitsForItsLaneToReadToItsEnd: a job restored by a new
// owner of its lane, held long ago, is not taken at once while the lane's
// end is unknown: once the end is known, its first attempt waits for the
// lane to read that far; with the end never known, for ten Waits from
// the restore, not from when it was first held. A job that moves forward
// waits for the end as given then.
func TestARestoredJobWaitsForItsLaneToReadToItsEnd(t *testing.T) {
	t0 := time.Unix(100_000, 0)
	wait := 10 * time.Second
	pol := gapfill.Policy{Wait: wait, Reread: true}

	d := gapfill.NewDetector(pol)
	d.HoldRestored("j", t0.Add(-time.Hour), t0)
	require.Empty(t, d.Take(t0, 10, 50), "the lane's end is not known yet")
	g, _ := d.Gap("j")
	require.Equal(t, int64(-1), g.ReadsTo, "no offset to show yet")
	require.Equal(t, t0.Add(-time.Hour), g.Since, "held since when it was first held")
	d.Lane(50, 0, t0.Add(time.Second)) // not known: nothing changes
	require.Empty(t, d.Take(t0.Add(time.Second), 10, 50))
	d.Lane(50, 100, t0.Add(time.Second))
	g, _ = d.Gap("j")
	require.Equal(t, int64(100), g.ReadsTo)
	require.Empty(t, d.Take(t0.Add(time.Second), 10, 99), "not read that far yet")
	require.Equal(t, []string{"j"}, d.Take(t0.Add(time.Second), 10, 100), "read that far")

	d = gapfill.NewDetector(pol)
	d.HoldRestored("j", t0.Add(-time.Hour), t0)
	require.Empty(t, d.Take(t0.Add(10*wait-time.Second), 10, 50), "the bound counts from the restore")
	require.Equal(t, []string{"j"}, d.Take(t0.Add(10*wait), 10, 50), "ten Waits after the restore, with no end known")

	// With no end known, the lane's moves bring nothing nearer.
	d = gapfill.NewDetector(pol)
	d.HoldRestored("j", t0.Add(-time.Hour), t0)
	for i := range 9 {
		require.Empty(t, d.Take(t0.Add(time.Duration(i+1)*wait), 10, int64(50+i)))
	}
	require.Equal(t, []string{"j"}, d.Take(t0.Add(10*wait), 10, 60), "ten Waits after the restore, though the lane moved")

	d = gapfill.NewDetector(pol)
	d.HoldRestored("j", t0.Add(-time.Hour), t0)
	d.ProgressUntil("j", t0.Add(time.Second), 200)
	d.Lane(50, 100, t0.Add(time.Second))
	g, _ = d.Gap("j")
	require.Equal(t, int64(200), g.ReadsTo, "moved forward: it waits for the end as it was then")
	require.Empty(t, d.Take(t0.Add(time.Second+wait), 10, 150))
	require.Equal(t, []string{"j"}, d.Take(t0.Add(time.Second+wait), 10, 200))

	d = gapfill.NewDetector(gapfill.Policy{Reread: true}) // waiting off
	d.HoldRestored("j", t0.Add(-time.Hour), t0)
	require.Equal(t, []string{"j"}, d.Take(t0, 10, 50), "with waiting off nothing is put off")
}

// TestTheGateFollowsALaneWhoseLogStartsAgain: a lane whose position goes
// back (a new log, or one truncated) has moved: its gated jobs keep
// waiting while it reads the new log, not only once it passes where the
// old one was read.
func TestTheGateFollowsALaneWhoseLogStartsAgain(t *testing.T) {
	t0 := time.Unix(1000, 0)
	wait := 10 * time.Second
	d := gapfill.NewDetector(gapfill.Policy{Wait: wait, Reread: true})
	d.Lane(100_000, 100_000, t0)
	d.HoldUntil("j", t0, 150_000)
	require.Empty(t, d.Take(t0.Add(wait), 10, 100_000))
	for i := range 20 { // the new log, read from 0
		now := t0.Add(time.Duration(2+i) * wait)
		d.Lane(int64(i)*1000, 50_000, now)
		require.Empty(t, d.Take(now, 10, int64(i)*1000), "the lane reads the new log at %d", i*1000)
	}
}

// TestLearningTheEndKeepsTheGateInOrder: jobs whose end was unknown take
// their place in the gate by the end learnt, among those whose end was
// known: each goes once the lane has read to its own end.
func TestLearningTheEndKeepsTheGateInOrder(t *testing.T) {
	t0 := time.Unix(100_000, 0)
	wait := 10 * time.Second
	d := gapfill.NewDetector(gapfill.Policy{Wait: wait, Reread: true})
	d.HoldUntil("k60", t0, 60)
	d.HoldRestored("r", t0.Add(-time.Hour), t0)
	d.HoldUntil("k200", t0, 200)
	require.Empty(t, d.Take(t0.Add(wait), 10, 10), "all put off")
	d.Lane(10, 100, t0.Add(wait)) // r learns 100
	now := t0.Add(wait + time.Second)
	require.Equal(t, []string{"k60"}, d.Take(now, 10, 60))
	require.Empty(t, d.Take(now, 10, 99))
	require.Equal(t, []string{"r"}, d.Take(now, 10, 100))
	require.Equal(t, []string{"k200"}, d.Take(now, 10, 200))
}

// TestTheWholeWaitCountsFromTheHold: a job that moves forward waits
// afresh, sixty Waits from then; a restored job's sixty count from when it
// was first held, but it waits ten after the restore at least.
func TestTheWholeWaitCountsFromTheHold(t *testing.T) {
	t0 := time.Unix(100_000, 0)
	wait := 10 * time.Second
	pol := gapfill.Policy{Wait: wait, Reread: true}
	reads := func(d *gapfill.Detector, from, to time.Time, pos int64) (time.Time, int64) {
		for now := from; now.Before(to); now = now.Add(wait) {
			pos += 10
			require.Empty(t, d.Take(now, 10, pos), "at %s the lane reads on", now.Sub(t0))
		}
		return to, pos
	}

	d := gapfill.NewDetector(pol)
	d.HoldUntil("j", t0, 1_000_000)
	_, pos := reads(d, t0.Add(wait), t0.Add(50*wait), 0)
	d.ProgressUntil("j", t0.Add(50*wait), 1_000_000)
	_, pos = reads(d, t0.Add(51*wait), t0.Add(110*wait), pos)
	require.Equal(t, []string{"j"}, d.Take(t0.Add(110*wait), 10, pos+10), "sixty Waits after it moved forward")

	d = gapfill.NewDetector(pol)
	d.HoldRestored("r", t0.Add(-55*wait), t0) // held 55 Waits before the restore
	d.Lane(0, 1_000_000, t0)
	_, pos = reads(d, t0, t0.Add(10*wait), 0)
	require.Equal(t, []string{"r"}, d.Take(t0.Add(10*wait), 10, pos+10), "ten Waits after the restore, past sixty since it was held")

	d = gapfill.NewDetector(pol)
	d.HoldRestored("r", t0.Add(-20*wait), t0) // held 20 Waits before the restore
	d.Lane(0, 1_000_000, t0)
	_, pos = reads(d, t0, t0.Add(40*wait), 0)
	require.Equal(t, []string{"r"}, d.Take(t0.Add(40*wait), 10, pos+10), "sixty Waits since it was first held")
}

// TestAnEndLearntDeepInTheGateComesFirst: a job whose end is learnt while
// jobs with further ends sit above it in the gate goes first once read.
func TestAnEndLearntDeepInTheGateComesFirst(t *testing.T) {
	t0 := time.Unix(100_000, 0)
	wait := time.Hour
	d := gapfill.NewDetector(gapfill.Policy{Wait: wait, Reread: true})
	// Put off in this order (by when each falls due): k300, r, k400, k600.
	d.HoldUntil("k300", t0.Add(-3*time.Minute), 300)
	d.HoldRestored("r", t0.Add(-2*time.Minute), t0)
	d.HoldUntil("k400", t0.Add(-time.Minute), 400)
	d.HoldUntil("k600", t0, 600)
	now := t0.Add(wait + time.Second)
	require.Empty(t, d.Take(now, 10, 10), "all put off")
	d.Lane(10, 100, now) // r learns 100
	require.Equal(t, []string{"r"}, d.Take(now, 10, 100))
}

// TestMovingForwardStartsTheBoundAgain: a job that moves forward while its
// lane stands still waits ten Waits from then, not from its first hold.
func TestMovingForwardStartsTheBoundAgain(t *testing.T) {
	t0 := time.Unix(1000, 0)
	wait := 10 * time.Second
	d := gapfill.NewDetector(gapfill.Policy{Wait: wait, Reread: true})
	d.HoldUntil("j", t0, 1000)
	require.Empty(t, d.Take(t0.Add(wait), 10, 10))
	d.ProgressUntil("j", t0.Add(5*wait), 1000)
	require.Empty(t, d.Take(t0.Add(12*wait), 10, 10), "ten Waits from moving forward, not from the hold")
	require.Equal(t, []string{"j"}, d.Take(t0.Add(15*wait), 10, 10))
}

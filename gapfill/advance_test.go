package gapfill_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
	"github.com/projector/projector/gapfill"
)

// TestAdvanceScripts runs the golden scripts of testdata/advance. Run with
// -rewrite to regenerate their expected output, then read the diff.
func TestAdvanceScripts(t *testing.T) {
	t.Parallel()
	runScripts(t, "testdata/advance", func(t *testing.T) func(*scriptCmd) string {
		r := &advanceRunner{t: t, t0: time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)}
		r.reset("job-1")
		return r.run
	})
}

type advanceRunner struct {
	t      *testing.T
	t0     time.Time
	job    gapfill.Job
	offset int64         // the next input's offset when none is given
	at     time.Duration // the clock of the last feed or hold
}

func (r *advanceRunner) reset(id string) {
	r.job = gapfill.Job{ID: id}
	r.offset = 0
	r.at = 0
}

func (r *advanceRunner) run(c *scriptCmd) string {
	a := argsOf(r.t, c.pos(), c.args)
	defer a.done()
	switch c.name {
	case "row":
		r.reset(a.str("id", r.job.ID))
		r.job.Version = a.int("v", 0)
		r.job.EventID = a.str("event", "")
		if raw, ok := a.get("state"); ok {
			state, err := delta.DecodeState(json.RawMessage(raw))
			require.NoError(r.t, err, "%s", c.pos())
			r.job.State, r.job.Raw = state, json.RawMessage(raw)
		}
		if a.has("deleted") {
			require.False(r.t, a.has("state"), "%s: a deleted row has no state", c.pos())
			r.job.Deleted = true
		}
		require.Empty(r.t, c.input, "%s: row takes no input", c.pos())
		return r.describe(r.job)
	case "hold":
		// Held deltas as a restart restores them from the store: straight
		// into the job, with no Advance.
		r.at = a.dur("at", r.at)
		held := maps.Clone(r.job.Held)
		if held == nil {
			held = map[int64]gapfill.Held{}
		}
		for _, in := range r.inputs(c) {
			require.Equal(r.t, event.Delta, in.Event.Kind, "%s: only deltas are held", c.pos())
			held[in.Event.Version] = gapfill.Held{Input: in, Since: in.At}
		}
		r.job.Held = held
		return r.describe(r.job)
	case "feed":
		r.at = a.dur("at", r.at)
		ins := r.inputs(c)
		before := fingerprint(r.job)
		next, out := gapfill.Advance(r.job, ins)
		require.Equal(r.t, before, fingerprint(r.job), "%s: Advance modified the job it was given", c.pos())
		r.check(c, next, out)
		r.job = next
		return r.describeOutcome(out) + "\n" + r.describe(next)
	case "missing":
		return fmt.Sprintf("missing=%v", listOf(r.job.Missing(int(a.int("limit", 10)))))
	}
	r.t.Fatalf("%s: unknown command %q", c.pos(), c.name)
	return ""
}

// inputs builds a command's input lines into inputs, each decoded from a
// record value by event.Decode as the consumer would.
//
//	delta v=3 ops=[...] [id=evt-3] [source=log|reread|authority] [p=0] [o=12] [job=other]
//	snapshot v=10 state={...} [id=...] [source=...] [p=0] [o=12] [job=other]
func (r *advanceRunner) inputs(c *scriptCmd) []gapfill.Input {
	var ins []gapfill.Input
	for k, line := range c.input {
		pos := fmt.Sprintf("%s (input %d)", c.pos(), k+1)
		list, err := parseArgs(line)
		require.NoError(r.t, err, "%s", pos)
		require.NotEmpty(r.t, list, "%s", pos)
		kind := list[0]
		require.True(r.t, kind.bare && (kind.key == "delta" || kind.key == "snapshot" || kind.key == "delete"), "%s: want delta, snapshot or delete", pos)
		a := argsOf(r.t, pos, list[1:])
		v := a.int("v", 0)
		value := map[string]any{
			"job_id":   a.str("job", r.job.ID),
			"version":  v,
			"kind":     kind.key,
			"event_id": a.str("id", "evt-"+strconv.FormatInt(v, 10)),
		}
		if raw, ok := a.get("ops"); ok {
			value["ops"] = json.RawMessage(raw)
		}
		if raw, ok := a.get("state"); ok {
			value["state"] = json.RawMessage(raw)
		}
		src := gapfill.FromLog
		switch s := a.str("source", "log"); s {
		case "log":
		case "reread":
			src = gapfill.FromReread
		case "authority":
			src = gapfill.FromAuthority
		default:
			r.t.Fatalf("%s: unknown source %q", pos, s)
		}
		partition := int(a.int("p", 0))
		offset := a.int("o", r.offset)
		r.offset = offset + 1
		a.done()
		b, err := json.Marshal(value)
		require.NoError(r.t, err, "%s", pos)
		ev, err := event.Decode(nil, b)
		require.NoError(r.t, err, "%s: %s", pos, b)
		ins = append(ins, gapfill.Input{Event: ev, Partition: partition, Offset: offset, Source: src, At: r.t0.Add(r.at)})
	}
	return ins
}

// check asserts what holds after every Advance, whatever the script.
func (r *advanceRunner) check(c *scriptCmd, next gapfill.Job, out gapfill.Outcome) {
	pos := c.pos()
	require.GreaterOrEqual(r.t, next.Version, r.job.Version, "%s: the version went back", pos)
	require.Equal(r.t, out.Changed, next.Version != r.job.Version, "%s: Changed", pos)
	require.Equal(r.t, out.Changed, out.Applied+out.Deleted > 0, "%s: Changed without Applied or Deleted", pos)
	for v, h := range next.Held {
		require.Greater(r.t, v, next.Version+1, "%s: held v%d is not above the row's next version", pos, v)
		require.Equal(r.t, v, h.Event.Version, "%s: held under the wrong key", pos)
	}
	if next.Deleted {
		require.Nil(r.t, next.State, "%s: a deleted job has a state", pos)
		require.Nil(r.t, next.Raw, "%s: a deleted job has a state", pos)
	}
	if out.Changed && !next.Deleted {
		require.NotNil(r.t, next.Raw, "%s: a changed job's state is not encoded", pos)
		stateOf(r.t, next) // Raw and State, when both are known, agree
	}
	for _, h := range out.NewlyHeld {
		require.Contains(r.t, next.Held, h.Event.Version, "%s: newly held v%d is not held", pos, h.Event.Version)
	}
	require.Equal(r.t, out.Closed, len(next.Held) == 0 && (len(r.job.Held) > 0 || out.Held > 0), "%s: Closed", pos)
}

// fingerprint captures what Advance must leave alone in the job it is given.
func fingerprint(j gapfill.Job) string {
	raw, _ := delta.EncodeState(j.State) // this very map: Advance must not change it
	return fmt.Sprintf("v=%d deleted=%t state=%s raw=%s held=%v", j.Version, j.Deleted, raw, j.Raw, listOf(slices.Sorted(maps.Keys(j.Held))))
}

func (r *advanceRunner) describe(j gapfill.Job) string {
	raw := stateOf(r.t, j)
	var b strings.Builder
	fmt.Fprintf(&b, "row v=%d", j.Version)
	if j.EventID != "" {
		fmt.Fprintf(&b, " event=%s", j.EventID)
	}
	if j.Deleted {
		b.WriteString(" deleted")
	} else {
		fmt.Fprintf(&b, " state=%s", raw)
	}
	held := slices.Sorted(maps.Keys(j.Held))
	fmt.Fprintf(&b, "\nheld=%v", listOf(held))
	if len(held) > 0 {
		fmt.Fprintf(&b, " missing=%v", listOf(j.Missing(10)))
	}
	return b.String()
}

func (r *advanceRunner) describeOutcome(out gapfill.Outcome) string {
	var f []string
	num := func(name string, n int) {
		if n != 0 {
			f = append(f, fmt.Sprintf("%s=%d", name, n))
		}
	}
	num("applied", out.Applied)
	num("deleted", out.Deleted)
	num("stale", out.Stale)
	num("duplicates", out.Duplicates)
	num("held", out.Held)
	num("covered", out.Covered)
	if len(out.Released) > 0 {
		// Released follows map order where a snapshot covers several.
		f = append(f, fmt.Sprintf("released=%v", listOf(slices.Sorted(slices.Values(out.Released)))))
	}
	if out.Closed {
		f = append(f, "closed="+out.ClosedBy.String())
	}
	if out.Changed {
		f = append(f, fmt.Sprintf("last=%s@%d", out.LastEventID, out.LastOffset))
	}
	lines := []string{strings.Join(f, " ")}
	if len(f) == 0 {
		lines[0] = "no change"
	}
	for _, c := range out.Conflicts {
		lines = append(lines, fmt.Sprintf("conflict v=%d kept=%s dropped=%s@p%d/%d",
			c.Version, c.KeptEventID, c.DroppedEventID, c.DroppedPartition, c.DroppedOffset))
	}
	for _, rj := range out.Rejected {
		lines = append(lines, fmt.Sprintf("rejected v=%d %s@%d: %v", rj.Event.Version, rj.Event.EventID, rj.Offset, rj.Err))
	}
	for _, h := range out.NewlyHeld {
		lines = append(lines, fmt.Sprintf("newly-held v=%d %s@%d since=%s", h.Event.Version, h.Event.EventID, h.Offset, rel(r.t0, h.Since)))
	}
	return strings.Join(lines, "\n")
}

// listOf prints versions as [1 2 3], and an empty list as [].
func listOf(vs []int64) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.FormatInt(v, 10)
	}
	return "[" + strings.Join(s, " ") + "]"
}

// stateOf is a job's state as compact JSON with its members in order:
// State encoded when Advance decoded it (and then Raw, if known, must say
// the same), else Raw as it came (a snapshot Advance had no delta to apply
// to is not decoded), else {}.
func stateOf(t require.TestingT, j gapfill.Job) string {
	switch {
	case j.State != nil:
		raw, err := delta.EncodeState(j.State)
		require.NoError(t, err)
		if j.Raw != nil {
			require.True(t, delta.SameState(raw, j.Raw), "Raw %s is not State %s", j.Raw, raw)
		}
		return string(raw)
	case j.Raw != nil:
		raw, err := delta.ApplyJSON(j.Raw, nil)
		require.NoError(t, err)
		return string(raw)
	}
	return "{}"
}

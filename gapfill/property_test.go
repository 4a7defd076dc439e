package gapfill_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
	"github.com/projector/projector/gapfill"
)

// The property tests drive Advance with random histories, delivered in
// any order, with duplicates, in chunks, and check it against:
//
//   - the reference fold: the state at every version, computed once from
//     {} by a big-integer model of the ops and cross-checked with
//     delta.Apply, so a skipped, repeated or rounded increment shows;
//   - a model of the version rules (docs/contract.md, section 2) that predicts,
//     per Advance, the row's version, the held set and every counter.
//
// Run more cases with -rapid.checks=2000.

// history is one job's valid history: versions 1..N, each a snapshot, a
// delta or a delete (never followed by a delta: a deleted job has no state
// to change), and the reference state at every version.
type history struct {
	id     string
	events []event.Event     // events[v-1] makes version v
	ref    []json.RawMessage // ref[v] is the state at version v; ref[0] is {}; nil when deleted
	kinds  []event.Kind      // kinds[v-1]
	model  []map[string]any  // model[v]: ints as *big.Int, for the generator
}

// The members the ops touch; "x/y" makes the pointers need an escape.
var stateKeys = []string{"a", "b", "c", "x/y"}

// Integers near the edges where float64 or int64 arithmetic would drift.
var edgeInts = []string{
	"0", "1", "-1", "2", "7", "-3",
	"9007199254740991", "9007199254740992", "9007199254740993", "-9007199254740993",
	"9223372036854775807", "-9223372036854775808", "9223372036854775808",
}

func genInt(t *rapid.T, label string) *big.Int {
	var s string
	if rapid.Bool().Draw(t, label+"-edge") {
		s = rapid.SampledFrom(edgeInts).Draw(t, label)
	} else {
		s = fmt.Sprint(rapid.IntRange(-5, 5).Draw(t, label))
	}
	n, _ := new(big.Int).SetString(s, 10)
	return n
}

func genValue(t *rapid.T, label string) any {
	if rapid.IntRange(0, 3).Draw(t, label+"-kind") == 0 {
		return rapid.SampledFrom([]string{"x", "done", ""}).Draw(t, label)
	}
	return genInt(t, label)
}

// pointerOf escapes a member name into a JSON Pointer.
func pointerOf(key string) string {
	return "/" + strings.ReplaceAll(strings.ReplaceAll(key, "~", "~0"), "/", "~1")
}

// encodeModel encodes a model state canonically (keys sorted, integers as
// written by big.Int).
func encodeModel(tb require.TestingT, m map[string]any) json.RawMessage {
	state := map[string]any{}
	for k, v := range m {
		switch v := v.(type) {
		case *big.Int:
			state[k] = json.Number(v.String())
		default:
			state[k] = v
		}
	}
	raw, err := delta.EncodeState(state)
	require.NoError(tb, err)
	return raw
}

func decodeEvent(tb require.TestingT, value map[string]any) event.Event {
	b, err := json.Marshal(value)
	require.NoError(tb, err)
	ev, err := event.Decode(nil, b)
	require.NoError(tb, err, "%s", b)
	return ev
}

func genHistory(t *rapid.T, id string) history {
	n := rapid.IntRange(1, 12).Draw(t, id+"-n")
	h := history{id: id, ref: []json.RawMessage{json.RawMessage(`{}`)}, model: []map[string]any{{}}}
	for v := int64(1); v <= int64(n); v++ {
		prev := h.model[v-1]
		label := fmt.Sprintf("%s-v%d", id, v)
		evID := fmt.Sprintf("%s-e%d", id, v)
		afterDelete := v > 1 && h.kinds[v-2] == event.Delete
		if !afterDelete && rapid.IntRange(0, 5).Draw(t, label+"-delete") == 0 {
			h.events = append(h.events, decodeEvent(t, map[string]any{
				"job_id": id, "version": v, "kind": "delete", "event_id": evID,
			}))
			h.kinds = append(h.kinds, event.Delete)
			h.model = append(h.model, map[string]any{})
			h.ref = append(h.ref, nil)
			continue
		}
		if afterDelete || rapid.IntRange(0, 3).Draw(t, label+"-snapshot") == 0 {
			next := map[string]any{}
			for _, k := range stateKeys {
				if rapid.Bool().Draw(t, label+"-has-"+k) {
					next[k] = genValue(t, label+"-"+k)
				}
			}
			raw := encodeModel(t, next)
			h.events = append(h.events, decodeEvent(t, map[string]any{
				"job_id": id, "version": v, "kind": "snapshot", "state": raw, "event_id": evID,
			}))
			h.kinds = append(h.kinds, event.Snapshot)
			h.model = append(h.model, next)
			h.ref = append(h.ref, raw)
			continue
		}
		next := maps.Clone(prev)
		var ops []map[string]any
		for k := range rapid.IntRange(1, 4).Draw(t, label+"-ops") {
			key := rapid.SampledFrom(stateKeys).Draw(t, fmt.Sprintf("%s-op%d-key", label, k))
			cur, has := next[key]
			_, isInt := cur.(*big.Int)
			kinds := []string{"set", "remove"}
			if !has || isInt {
				kinds = append(kinds, "increment", "increment")
			}
			switch rapid.SampledFrom(kinds).Draw(t, fmt.Sprintf("%s-op%d", label, k)) {
			case "set":
				val := genValue(t, fmt.Sprintf("%s-op%d-value", label, k))
				next[key] = val
				var raw json.RawMessage
				if n, ok := val.(*big.Int); ok {
					raw = json.RawMessage(n.String())
				} else {
					raw, _ = json.Marshal(val)
				}
				ops = append(ops, map[string]any{"op": "set", "path": pointerOf(key), "value": raw})
			case "remove":
				delete(next, key)
				ops = append(ops, map[string]any{"op": "remove", "path": pointerOf(key)})
			case "increment":
				by := genInt(t, fmt.Sprintf("%s-op%d-by", label, k))
				sum := new(big.Int).Set(by)
				if isInt {
					sum.Add(sum, cur.(*big.Int))
				}
				next[key] = sum
				ops = append(ops, map[string]any{"op": "increment", "path": pointerOf(key), "by": json.RawMessage(by.String())})
			}
		}
		ev := decodeEvent(t, map[string]any{"job_id": id, "version": v, "kind": "delta", "ops": ops, "event_id": evID})
		raw := encodeModel(t, next)
		// The reference fold through delta.Apply must agree with the
		// big-integer model exactly.
		prevState, err := delta.DecodeState(h.ref[v-1])
		require.NoError(t, err)
		applied, err := delta.Apply(prevState, ev.Ops)
		require.NoError(t, err)
		got, err := delta.EncodeState(applied)
		require.NoError(t, err)
		require.Equal(t, string(raw), string(got), "delta.Apply drifted from the integer model at %s v%d", id, v)
		h.events = append(h.events, ev)
		h.kinds = append(h.kinds, event.Delta)
		h.model = append(h.model, next)
		h.ref = append(h.ref, raw)
	}
	return h
}

func (h history) n() int64 { return int64(len(h.events)) }

// delivery is one copy of one event on its way to Advance.
type delivery struct {
	job     int
	version int64
	source  gapfill.Source
}

// deliveries draws which events arrive (dropping deltas with drop) and
// how many copies of each, and shuffles every job's copies together.
func deliveries(t *rapid.T, hs []history, drop bool) ([]delivery, []map[int64]bool) {
	var all []delivery
	received := make([]map[int64]bool, len(hs))
	for j, h := range hs {
		received[j] = map[int64]bool{}
		for v := int64(1); v <= h.n(); v++ {
			if drop && h.kinds[v-1] == event.Delta && rapid.IntRange(0, 3).Draw(t, fmt.Sprintf("%s-drop-%d", h.id, v)) == 0 {
				continue
			}
			received[j][v] = true
			copies := 1
			if rapid.IntRange(0, 3).Draw(t, fmt.Sprintf("%s-dup-%d", h.id, v)) == 0 {
				copies += rapid.IntRange(1, 2).Draw(t, fmt.Sprintf("%s-copies-%d", h.id, v))
			}
			sources := []gapfill.Source{gapfill.FromLog, gapfill.FromLog, gapfill.FromReread}
			if h.kinds[v-1].WholeState() {
				sources = append(sources, gapfill.FromAuthority)
			}
			for c := range copies {
				src := rapid.SampledFrom(sources).Draw(t, fmt.Sprintf("%s-source-%d-%d", h.id, v, c))
				all = append(all, delivery{job: j, version: v, source: src})
			}
		}
	}
	if len(all) > 1 {
		all = rapid.Permutation(all).Draw(t, "order")
	}
	return all, received
}

// chunks splits deliveries into consecutive runs of 1..8.
func chunks(t *rapid.T, all []delivery) [][]delivery {
	var out [][]delivery
	for len(all) > 0 {
		n := min(rapid.IntRange(1, 8).Draw(t, "chunk"), len(all))
		out = append(out, all[:n])
		all = all[n:]
	}
	return out
}

// ruleModel is the version rules of docs/contract.md section 2 for one job,
// tracking versions only.
type ruleModel struct {
	version int64
	deleted bool
	held    map[int64]time.Time // version -> since
}

// expected is what the model predicts for one Advance.
type expected struct {
	applied, deleted, stale, duplicates, heldCount, covered int
	released                                                []int64
	newlyHeld                                               map[int64]time.Time
	closed                                                  bool
	closedBy                                                gapfill.Source
}

func (m *ruleModel) advance(ins []gapfill.Input) (e expected) {
	e.newlyHeld = map[int64]time.Time{}
	everHeld := len(m.held) > 0
	newly := map[int64]bool{}
	var drain func()
	defer func() {
		e.released = slices.DeleteFunc(e.released, func(v int64) bool { return newly[v] })
		slices.Sort(e.released)
		if len(e.released) == 0 {
			e.released = nil
		}
		for v := range newly {
			if since, ok := m.held[v]; ok {
				e.newlyHeld[v] = since
			}
		}
		e.closed = everHeld && len(m.held) == 0
	}()
	drain = func() {
		for {
			if _, ok := m.held[m.version+1]; !ok || m.deleted {
				return
			}
			delete(m.held, m.version+1)
			e.released = append(e.released, m.version+1)
			m.version++
			e.applied++
		}
	}
	// A row moved under held deltas (by another writer) settles them
	// first, as a re-read of the store.
	if len(m.held) > 0 {
		for v := range m.held {
			if v <= m.version {
				delete(m.held, v)
				e.released = append(e.released, v)
				e.duplicates++
			}
		}
		drain()
		if len(m.held) == 0 {
			e.closedBy = gapfill.FromReread
		}
	}
	for _, in := range ins {
		ev := in.Event
		wasHeld := len(m.held) > 0
		changed := false
		switch {
		case ev.Kind.WholeState() && ev.Version > m.version:
			m.version = ev.Version
			m.deleted = ev.Kind == event.Delete
			if m.deleted {
				e.deleted++
			} else {
				e.applied++
			}
			changed = true
			for v := range m.held {
				if v <= m.version {
					delete(m.held, v)
					e.released = append(e.released, v)
					e.covered++
				}
			}
			drain()
		case ev.Kind.WholeState():
			if in.Source == gapfill.FromLog {
				e.stale++
			}
		case ev.Version <= m.version:
			if in.Source == gapfill.FromLog {
				e.duplicates++
			}
		case ev.Version == m.version+1:
			if m.deleted {
				panic("a valid history has no delta after a delete")
			}
			m.version++
			e.applied++
			changed = true
			drain()
		default:
			if _, ok := m.held[ev.Version]; ok {
				if in.Source == gapfill.FromLog {
					e.duplicates++
				}
				continue
			}
			m.held[ev.Version] = in.At
			newly[ev.Version] = true
			everHeld = true
			e.heldCount++
		}
		if changed && wasHeld && len(m.held) == 0 {
			e.closedBy = in.Source
		}
	}
	return e
}

// feeder carries every job's Job value and model from one Advance to the
// next and checks each step.
type feeder struct {
	t       *rapid.T
	hs      []history
	jobs    []gapfill.Job
	models  []ruleModel
	arrived []map[int64]bool // versions delivered so far
	applied []int            // sum of Outcome.Applied since base
	base    []int64          // the version another writer last moved the row to
	offset  int64
	t0      time.Time
}

func newFeeder(t *rapid.T, hs []history) *feeder {
	f := &feeder{t: t, hs: hs, t0: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	for _, h := range hs {
		f.jobs = append(f.jobs, gapfill.Job{ID: h.id})
		f.models = append(f.models, ruleModel{held: map[int64]time.Time{}})
		f.arrived = append(f.arrived, map[int64]bool{})
		f.applied = append(f.applied, 0)
		f.base = append(f.base, 0)
	}
	return f
}

// feed offers one chunk: each job's deliveries, in chunk order, to one
// Advance for that job.
func (f *feeder) feed(chunk []delivery, at time.Time) {
	byJob := map[int][]gapfill.Input{}
	var order []int
	for _, d := range chunk {
		if _, ok := byJob[d.job]; !ok {
			order = append(order, d.job)
		}
		byJob[d.job] = append(byJob[d.job], gapfill.Input{
			Event: f.hs[d.job].events[d.version-1], Partition: d.job % 3, Offset: f.offset, Source: d.source, At: at,
		})
		f.offset++
	}
	for _, j := range order {
		f.advance(j, byJob[j])
	}
}

// moveRow moves a job's row to version v of its history, as another
// writer (a previous owner of the partition) would, keeping what it holds,
// and offers it to Advance with no input, as the store re-read does.
func (f *feeder) moveRow(j int, v int64) {
	h := f.hs[j]
	state, err := delta.DecodeState(h.ref[v])
	require.NoError(f.t, err)
	if h.kinds[v-1] == event.Delete {
		state = nil
	}
	f.jobs[j] = gapfill.Job{ID: h.id, Version: v, State: state, Raw: h.ref[v], EventID: h.events[v-1].EventID, Held: f.jobs[j].Held,
		Deleted: h.kinds[v-1] == event.Delete}
	f.models[j].version, f.models[j].deleted = v, h.kinds[v-1] == event.Delete
	f.applied[j], f.base[j] = 0, v // the other writer's applies are not ours to count
	f.advance(j, nil)
}

// maybeMoveRow draws whether another writer moves one job's row forward.
func (f *feeder) maybeMoveRow() {
	if rapid.IntRange(0, 5).Draw(f.t, "move-row") != 0 {
		return
	}
	j := rapid.IntRange(0, len(f.hs)-1).Draw(f.t, "move-job")
	if f.jobs[j].Version >= f.hs[j].n() {
		return
	}
	f.moveRow(j, rapid.Int64Range(f.jobs[j].Version+1, f.hs[j].n()).Draw(f.t, "move-to"))
}

func (f *feeder) advance(j int, ins []gapfill.Input) {
	t, h := f.t, f.hs[j]
	before := fingerprint(f.jobs[j])
	next, out := gapfill.Advance(f.jobs[j], ins)
	require.Equal(t, before, fingerprint(f.jobs[j]), "Advance modified the job it was given")
	want := f.models[j].advance(ins)
	for _, in := range ins {
		f.arrived[j][in.Event.Version] = true
	}

	require.Empty(t, out.Conflicts, "identical copies are never conflicts")
	require.Empty(t, out.Rejected, "a valid history is never rejected")
	require.Equal(t, want.applied, out.Applied, "Applied")
	require.Equal(t, want.deleted, out.Deleted, "Deleted")
	require.Equal(t, want.covered, out.Covered, "Covered")
	require.Equal(t, want.stale, out.Stale, "Stale")
	require.Equal(t, want.duplicates, out.Duplicates, "Duplicates")
	require.Equal(t, want.heldCount, out.Held, "Held")
	require.Equal(t, want.released, slices.Sorted(slices.Values(out.Released)), "Released")
	gotNewly := map[int64]time.Time{}
	for _, nh := range out.NewlyHeld {
		gotNewly[nh.Event.Version] = nh.Since
	}
	require.Equal(t, want.newlyHeld, gotNewly, "NewlyHeld")
	require.Equal(t, want.closed, out.Closed, "Closed")
	if want.closed {
		require.Equal(t, want.closedBy, out.ClosedBy, "ClosedBy")
	}

	m := f.models[j]
	require.Equal(t, m.version, next.Version, "version")
	require.Equal(t, out.Changed, next.Version != f.jobs[j].Version, "Changed")
	if out.Changed {
		made := h.events[next.Version-1].EventID
		require.Equal(t, made, next.EventID, "EventID")
		require.Equal(t, made, out.LastEventID, "LastEventID")
	}
	// The state is exactly the reference at the row's version: never a
	// skipped or repeated increment, and absent exactly when deleted.
	require.Equal(t, m.deleted, next.Deleted, "deleted at v%d", next.Version)
	require.Equal(t, h.ref[next.Version] == nil, next.Deleted, "deleted at v%d", next.Version)
	if next.Deleted {
		require.Nil(t, next.State, "a deleted job's state")
	} else {
		require.Equal(t, string(h.ref[next.Version]), stateOf(t, next), "state at v%d", next.Version)
	}
	if next.Version > 0 && !next.Deleted {
		require.True(t, delta.SameState(h.ref[next.Version], next.Raw), "Raw %s at v%d", next.Raw, next.Version)
	}
	heldSince := map[int64]time.Time{}
	for v, hd := range next.Held {
		heldSince[v] = hd.Since
	}
	require.Equal(t, m.held, heldSince, "held set")

	// Held is exactly the deltas received so far above the row.
	var above []int64
	for v := range f.arrived[j] {
		if v > next.Version && h.kinds[v-1] == event.Delta {
			above = append(above, v)
		}
	}
	require.ElementsMatch(t, above, slices.Collect(maps.Keys(next.Held)), "held vs received deltas above the row")

	f.applied[j] += out.Applied + out.Deleted
	require.LessOrEqual(t, f.applied[j], int(h.n()), "more applies than versions")
	require.LessOrEqual(t, int64(f.applied[j]), next.Version-f.base[j], "more applies than the row has versions")
	f.jobs[j] = next
}

func genHistories(t *rapid.T) []history {
	hs := make([]history, rapid.IntRange(1, 3).Draw(t, "jobs"))
	for i := range hs {
		hs[i] = genHistory(t, fmt.Sprintf("job-%d", i))
	}
	return hs
}

// reach is the highest version a set of received events leads to: a
// snapshot or a delete is reached on its own, a delta when its predecessor
// is.
func reach(h history, received map[int64]bool) int64 {
	reached := int64(0)
	for v := int64(1); v <= h.n(); v++ {
		if received[v] && (h.kinds[v-1].WholeState() || reached == v-1) {
			reached = v
		}
	}
	return reached
}

// (a) Every event arrives, in any order, with duplicates, in chunks: the
// reference final state and version, nothing held.
func TestPropertyEveryEventArrives(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		hs := genHistories(t)
		all, _ := deliveries(t, hs, false)
		f := newFeeder(t, hs)
		for k, c := range chunks(t, all) {
			f.feed(c, f.t0.Add(time.Duration(k)*time.Second))
			f.maybeMoveRow()
		}
		for j, h := range hs {
			require.Equal(t, h.n(), f.jobs[j].Version, "%s: final version", h.id)
			require.Equal(t, h.ref[h.n()] == nil, f.jobs[j].Deleted, "%s: deleted", h.id)
			if !f.jobs[j].Deleted {
				require.Equal(t, string(h.ref[h.n()]), stateOf(t, f.jobs[j]), "%s: final state", h.id)
			}
			require.Empty(t, f.jobs[j].Held, "%s: held", h.id)
		}
	})
}

// (b) Some deltas never arrive; the authority's snapshot at N closes
// every gap: the reference state, nothing held, closed by the snapshot.
func TestPropertyAuthorityClosesGaps(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		hs := genHistories(t)
		all, _ := deliveries(t, hs, true)
		f := newFeeder(t, hs)
		cs := chunks(t, all)
		for k, c := range cs {
			f.feed(c, f.t0.Add(time.Duration(k)*time.Second))
			f.maybeMoveRow()
		}
		for j, h := range hs {
			wasHeld := len(f.jobs[j].Held) > 0
			// The authority answers with the job's whole state at N: a
			// delete when the job is gone.
			answer := map[string]any{"job_id": h.id, "version": h.n(), "kind": "snapshot", "state": h.ref[h.n()], "event_id": "authority"}
			if h.ref[h.n()] == nil {
				answer = map[string]any{"job_id": h.id, "version": h.n(), "kind": "delete", "event_id": "authority"}
			}
			auth := decodeEvent(t, answer)
			in := gapfill.Input{Event: auth, Partition: -1, Offset: -1, Source: gapfill.FromAuthority, At: f.t0.Add(time.Hour)}
			next, out := gapfill.Advance(f.jobs[j], []gapfill.Input{in})
			require.Empty(t, out.Conflicts, "%s", h.id)
			require.Empty(t, out.Rejected, "%s", h.id)
			require.Equal(t, h.n(), next.Version, "%s: version", h.id)
			require.Equal(t, h.ref[h.n()] == nil, next.Deleted, "%s: deleted", h.id)
			if !next.Deleted {
				require.Equal(t, string(h.ref[h.n()]), stateOf(t, next), "%s: state", h.id)
			}
			require.Empty(t, next.Held, "%s: held", h.id)
			require.Equal(t, wasHeld, out.Closed, "%s: Closed", h.id)
			if wasHeld {
				require.Equal(t, gapfill.FromAuthority, out.ClosedBy, "%s: ClosedBy", h.id)
			}
		}
	})
}

// (c) Some deltas never arrive and there is no authority: the row never
// passes the first missing version unless a snapshot above it arrived,
// and it holds exactly the received deltas above it.
func TestPropertyMissingDeltasStayHeld(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		hs := genHistories(t)
		all, received := deliveries(t, hs, true)
		f := newFeeder(t, hs)
		for k, c := range chunks(t, all) {
			f.feed(c, f.t0.Add(time.Duration(k)*time.Second))
			for j, h := range hs {
				first := int64(0) // the first version that never arrives
				for v := int64(1); v <= h.n(); v++ {
					if !received[j][v] {
						first = v
						break
					}
				}
				if first == 0 {
					continue
				}
				snapAbove := false
				for v := first + 1; v <= h.n(); v++ {
					snapAbove = snapAbove || (f.arrived[j][v] && h.kinds[v-1].WholeState())
				}
				if !snapAbove {
					require.LessOrEqual(t, f.jobs[j].Version, first-1, "%s passed missing v%d", h.id, first)
				}
			}
		}
		for j, h := range hs {
			require.Equal(t, reach(h, received[j]), f.jobs[j].Version, "%s: final version", h.id)
			var above []int64
			for v := range received[j] {
				if v > f.jobs[j].Version {
					above = append(above, v)
				}
			}
			require.ElementsMatch(t, above, slices.Collect(maps.Keys(f.jobs[j].Held)), "%s: held", h.id)
			require.Equal(t, len(above) > 0, len(f.jobs[j].Held) > 0, "%s: held iff a received delta is above the row", h.id)
		}
	})
}

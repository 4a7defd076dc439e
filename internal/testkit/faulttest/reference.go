package faulttest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
)

// Reference is what a produced stream must leave in the read model,
// replayed from the records themselves: for each job, the state at every
// version the stream defines, and its final outcome.
//
// A delta's state is its predecessor's with its ops applied, so it is known
// only when the predecessor's is; a version after a delta that never
// arrived is unknown until a snapshot, unless the authority's answer is
// given with [Reference.Authority].
type Reference struct {
	events map[string]map[int64]event.Event
	truth  map[string]outcome
	// built by compute
	jobs map[string]*refJob
}

type outcome struct {
	version int64
	state   json.RawMessage
	deleted bool
}

type refJob struct {
	final   int64
	deleted map[int64]bool
	states  map[int64]any // decoded, for comparison
}

// NewReference returns an empty reference.
func NewReference() *Reference {
	return &Reference{events: map[string]map[int64]event.Event{}, truth: map[string]outcome{}}
}

// Add records one produced record. A record the wire format refuses is
// quarantined by the projector and changes no job, so it is left out; of
// two records at one job and version the first is the one that counts
// (duplicates are identical, conflicts keep the first applied).
func (r *Reference) Add(key, value []byte) {
	ev, err := event.Decode(key, value)
	if err != nil {
		return
	}
	byV := r.events[ev.JobID]
	if byV == nil {
		byV = map[int64]event.Event{}
		r.events[ev.JobID] = byV
	}
	if _, seen := byV[ev.Version]; !seen {
		byV[ev.Version] = ev
	}
	r.jobs = nil
}

// Authority records what the trusted authority answers for job: its state
// at version, or deleted at version. It is the job's final outcome even
// when a delta before it never arrived.
func (r *Reference) Authority(job string, version int64, state json.RawMessage, deleted bool) {
	r.truth[job] = outcome{version, state, deleted}
	r.jobs = nil
}

// Jobs lists the jobs of the reference, sorted.
func (r *Reference) Jobs() []string {
	r.compute()
	out := make([]string, 0, len(r.jobs))
	for id := range r.jobs {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

func (r *Reference) compute() {
	if r.jobs != nil {
		return
	}
	r.jobs = map[string]*refJob{}
	ids := map[string]bool{}
	for id := range r.events {
		ids[id] = true
	}
	for id := range r.truth {
		ids[id] = true
	}
	for id := range ids {
		j := &refJob{deleted: map[int64]bool{}, states: map[int64]any{}}
		byV := r.events[id]
		for v := range byV {
			j.final = max(j.final, v)
		}
		var prev any
		known := false
		for v := int64(1); v <= j.final; v++ {
			ev, ok := byV[v]
			switch {
			case !ok:
				known = false
			case ev.Kind == event.Snapshot:
				prev, known = decode(ev.State), true
			case ev.Kind == event.Delete:
				j.deleted[v] = true
				known = false
			case ev.Kind == event.Delta && known:
				st, err := applyOps(prev, ev.Ops)
				prev, known = st, err == nil
			default:
				known = false
			}
			if known {
				j.states[v] = prev
			}
		}
		if t, ok := r.truth[id]; ok {
			j.final = max(j.final, t.version)
			if t.deleted {
				j.deleted[t.version] = true
			} else {
				j.states[t.version] = decode(t.state)
			}
		}
		r.jobs[id] = j
	}
}

// stateAt is the reference state of job at version v: known reports
// whether the stream defines it, deleted whether v is a delete.
func (r *Reference) stateAt(job string, v int64) (state any, known, deleted bool) {
	r.compute()
	j, ok := r.jobs[job]
	if !ok {
		return nil, false, false
	}
	if j.deleted[v] {
		return nil, true, true
	}
	st, ok := j.states[v]
	return st, ok, false
}

func applyOps(state any, ops []delta.Op) (any, error) {
	m, ok := state.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("state is not an object")
	}
	// Apply works on its own copy of the state's JSON, so the states kept
	// for earlier versions stay as they were.
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	next, err := delta.ApplyJSON(raw, ops)
	if err != nil {
		return nil, err
	}
	return decode(next), nil
}

// decode reads JSON with numbers kept exact, for comparison.
func decode(raw []byte) any {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return fmt.Sprintf("undecodable JSON %q: %v", raw, err)
	}
	return v
}

func sameState(a, b any) bool { return reflect.DeepEqual(a, b) }

func show(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if len(b) > 300 {
		return string(b[:300]) + "..."
	}
	return string(b)
}

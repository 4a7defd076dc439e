package faulttest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options tune [History.Check].
type Options struct {
	// AllowHeld accepts a job below its final version when it is held
	// with a visible reason: deltas in projector_held waiting for a
	// version that never arrived (a test with no authority to heal it).
	AllowHeld bool
}

// Report is what [History.Check] found, for the test's log.
type Report struct {
	Jobs, Exact, Held, Deleted int
	Changes, Checked           int // audited changes, and those compared with a reference state
	Samples                    int // offset samples
	Violations                 []string
}

func (r Report) String() string {
	return fmt.Sprintf("%d jobs (%d exact, %d deleted, %d held); %d audited changes, %d compared with the reference state; %d offset samples; %d violations",
		r.Jobs, r.Exact, r.Deleted, r.Held, r.Changes, r.Checked, r.Samples, len(r.Violations))
}

// Check stops the sampler and checks every invariant over the whole
// history against ref, failing the test with each violation found:
//
//  1. every job of ref is at its final version with exactly the reference
//     state, or deleted at it, or (with AllowHeld) held with a visible
//     reason; no row exists for a job ref does not know;
//  2. a job's version only ever increased, change after change;
//  3. every version written has exactly the reference state of that
//     version, so a delta applied twice or skipped shows even when a
//     later snapshot hid it;
//  4. the group's committed offset never passed the stored position, and
//     neither went backwards (sampled during the test; not for a source
//     without offsets, Target.Kafka nil).
//
// Invariant 5, the lag back at zero, is [History.CaughtUp], called by the
// test once the fault has healed and before Check.
func (h *History) Check(ref *Reference, opts Options) Report {
	h.t.Helper()
	h.halt()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rep Report
	h.mu.Lock()
	rep.Samples = h.samples
	rep.Violations = append(rep.Violations, prefixed("invariant 4: ", h.violations)...)
	h.mu.Unlock()

	final, err := h.final(ctx, ref, opts, &rep)
	if err != nil {
		h.t.Fatal(err)
	}
	rep.Violations = append(rep.Violations, prefixed("invariant 1: ", final)...)
	changes, err := readAudit(ctx, h.tg.Pool, h.tg.Schema)
	if err != nil {
		h.t.Fatal(err)
	}
	rep.Changes = len(changes)
	rep.Violations = append(rep.Violations, historyViolations(ref, changes, &rep)...)
	if rep.Changes > 0 && rep.Checked == 0 {
		rep.Violations = append(rep.Violations, "invariant 3: no audited change could be compared with a reference state")
	}
	if rep.Samples == 0 && h.tg.Kafka != nil {
		rep.Violations = append(rep.Violations, "invariant 4: no sample of the committed offsets and stored positions was taken")
	}
	h.t.Logf("invariants: %s", rep)
	for i, v := range rep.Violations {
		if i == 30 {
			h.t.Errorf("... and %d more violations", len(rep.Violations)-i)
			break
		}
		h.t.Errorf("%s", v)
	}
	return rep
}

func prefixed(p string, vs []string) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = p + v
	}
	return out
}

type row struct {
	version int64
	state   any
}

// final checks invariant 1.
func (h *History) final(ctx context.Context, ref *Reference, opts Options, rep *Report) ([]string, error) {
	q := func(name string) string { return pgx.Identifier{h.tg.Schema, name}.Sanitize() }
	rows := map[string]row{}
	rs, err := h.tg.Pool.Query(ctx, `SELECT job_id, version, state FROM `+q(h.tg.Table))
	if err != nil {
		return nil, fmt.Errorf("faulttest: read the read model: %w", err)
	}
	for rs.Next() {
		var id string
		var r row
		var raw []byte
		if err := rs.Scan(&id, &r.version, &raw); err != nil {
			return nil, err
		}
		r.state = decode(raw)
		rows[id] = r
	}
	if err := rs.Err(); err != nil {
		return nil, err
	}
	tombs := map[string]int64{}
	rs, err = h.tg.Pool.Query(ctx, `SELECT job_id, version FROM `+q("projector_tombstones")+` WHERE projection = $1`, h.tg.Table)
	if err != nil {
		return nil, fmt.Errorf("faulttest: read the tombstones: %w", err)
	}
	for rs.Next() {
		var id string
		var v int64
		if err := rs.Scan(&id, &v); err != nil {
			return nil, err
		}
		tombs[id] = v
	}
	if err := rs.Err(); err != nil {
		return nil, err
	}
	held := map[string][]int64{}
	rs, err = h.tg.Pool.Query(ctx, `SELECT job_id, version FROM `+q("projector_held")+` WHERE projection = $1 ORDER BY job_id, version`, h.tg.Table)
	if err != nil {
		return nil, fmt.Errorf("faulttest: read the held deltas: %w", err)
	}
	for rs.Next() {
		var id string
		var v int64
		if err := rs.Scan(&id, &v); err != nil {
			return nil, err
		}
		held[id] = append(held[id], v)
	}
	if err := rs.Err(); err != nil {
		return nil, err
	}

	var out []string
	jobs := ref.Jobs()
	rep.Jobs = len(jobs)
	for _, id := range jobs {
		j := ref.jobs[id]
		r, hasRow := rows[id]
		tomb, hasTomb := tombs[id]
		switch {
		case j.deleted[j.final]:
			if hasTomb && tomb == j.final && !hasRow {
				rep.Deleted++
				continue
			}
		case hasRow && r.version == j.final:
			want, known := j.states[j.final]
			if !known {
				out = append(out, fmt.Sprintf("job %s: at its final version %d, whose state the test cannot know (give the authority's answer to the reference)", id, j.final))
				continue
			}
			if sameState(r.state, want) {
				rep.Exact++
				continue
			}
			out = append(out, fmt.Sprintf("job %s v%d: state %s, reference %s", id, j.final, show(r.state), show(want)))
			continue
		}
		at := int64(0)
		if hasRow {
			at = r.version
		}
		if hasTomb {
			at = max(at, tomb)
		}
		if hs := held[id]; opts.AllowHeld && len(hs) > 0 && at < j.final && hs[0] > at+1 {
			rep.Held++
			continue
		}
		switch {
		case hasRow:
			out = append(out, fmt.Sprintf("job %s: row at v%d, final version %d (held %v, tombstone %v)", id, r.version, j.final, held[id], tombOf(tomb, hasTomb)))
		case hasTomb:
			out = append(out, fmt.Sprintf("job %s: tombstone at v%d, final version %d (deleted: %v, held %v)", id, tomb, j.final, j.deleted[j.final], held[id]))
		default:
			out = append(out, fmt.Sprintf("job %s: no row and no tombstone, final version %d (held %v)", id, j.final, held[id]))
		}
	}
	known := map[string]bool{}
	for _, id := range jobs {
		known[id] = true
	}
	for _, id := range slices.Sorted(maps.Keys(rows)) {
		if !known[id] {
			out = append(out, fmt.Sprintf("job %s: a row at v%d for a job never produced", id, rows[id].version))
		}
	}
	return out, nil
}

func tombOf(v int64, ok bool) string {
	if !ok {
		return "none"
	}
	return fmt.Sprintf("v%d", v)
}

// historyViolations checks invariants 2 and 3 over the audited changes.
func historyViolations(ref *Reference, changes []change, rep *Report) []string {
	var out []string
	last := map[string]int64{}
	for _, c := range changes {
		if c.op == "DELETE" || c.newVersion == nil {
			continue
		}
		v := *c.newVersion
		where := fmt.Sprintf("change #%d (%s %s) of job %s", c.seq, strings.ToLower(c.op), c.table, c.job)
		if prev, ok := last[c.job]; ok && v <= prev {
			out = append(out, fmt.Sprintf("invariant 2: %s: version %d after version %d", where, v, prev))
		}
		if c.op == "UPDATE" && c.oldVersion != nil && v <= *c.oldVersion {
			out = append(out, fmt.Sprintf("invariant 2: %s: version %d replaced %d", where, v, *c.oldVersion))
		}
		last[c.job] = max(last[c.job], v)
		want, known, deleted := ref.stateAt(c.job, v)
		if !known {
			continue
		}
		rep.Checked++
		switch {
		case c.tombstone() && !deleted:
			out = append(out, fmt.Sprintf("invariant 3: %s: a tombstone at v%d, where the stream has a state", where, v))
		case !c.tombstone() && deleted:
			out = append(out, fmt.Sprintf("invariant 3: %s: a row at v%d, where the stream deletes the job", where, v))
		case !c.tombstone() && !sameState(decode(c.state), want):
			out = append(out, fmt.Sprintf("invariant 3: %s: v%d written as %s, reference %s", where, v, show(decode(c.state)), show(want)))
		}
	}
	return out
}

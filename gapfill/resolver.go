package gapfill

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
)

// Row is a job's row as the store holds it. A deleted job is its
// tombstone: Deleted, at the delete's version, with no state.
type Row struct {
	Version int64
	State   json.RawMessage
	EventID string
	LastOps json.RawMessage
	Deleted bool
}

// Job is the row as a job with the given held deltas, once its state is
// checked to be JSON.
func (r Row) Job(id string, held map[int64]Held) (Job, error) {
	if !r.Deleted && !json.Valid(r.State) {
		return Job{}, fmt.Errorf("job %q: the stored state is not JSON", id)
	}
	return r.TrustedJob(id, held), nil
}

// TrustedJob is [Row.Job] for a row whose state is known to be valid
// JSON, such as PostgreSQL's text of a jsonb value: not checked again, here
// or when a delta needs it decoded (see Job.Raw).
func (r Row) TrustedJob(id string, held map[int64]Held) Job {
	if r.Deleted {
		return Job{ID: id, Version: r.Version, EventID: r.EventID, Deleted: true, Held: held}
	}
	return Job{ID: id, Version: r.Version, Raw: r.State, EventID: r.EventID, LastOps: r.LastOps, Held: held}
}

// StoreReader reads rows again: another writer, a snapshot or a previous
// owner may have closed a gap.
type StoreReader interface {
	Rows(ctx context.Context, ids []string) (map[string]Row, error)
}

// LogReader reads the log again, every partition of the topic from a point
// in time on, for the events of the given jobs (a repartition moves keys).
type LogReader interface {
	Reread(ctx context.Context, jobs []string, from time.Time) ([]Input, error)
}

// SnapshotSource fetches a trusted snapshot from the job's authority. A
// snapshot's state must be a JSON object ([Resolver.Authority] checks it).
type SnapshotSource interface {
	Fetch(ctx context.Context, jobID string) (event.Event, error)
}

// Resolver runs the re-read and snapshot steps for due held jobs. It
// changes nothing itself: it returns what it found, for the caller to
// offer to [Advance] inside its own transaction.
type Resolver struct {
	Store     StoreReader    // nil skips the store half of re-read
	Log       LogReader      // nil skips the log half of re-read
	Snapshots SnapshotSource // nil skips the snapshot step
	// Window is how far before a job's oldest hold the log re-read starts.
	Window time.Duration
	// Concurrency bounds snapshot fetches in flight.
	Concurrency int
}

// Resolution is what an attempt found for one held job.
type Resolution struct {
	JobID string
	// Row is the stored row when it had moved past the job's version.
	Row *Row
	// Inputs are events found by the log re-read or the authority.
	Inputs []Input
	// Closed reports that offering Row and Inputs closes the gap, and By
	// which step.
	Closed bool
	By     Step
	// Last is the last step tried and Err why the job is still held.
	Last Step
	Err  error
}

// Attempt is one held job's attempt in progress: the job as the steps so
// far left it, and what they found.
type Attempt struct {
	Job Job
	Res Resolution
}

// Resolve runs steps, in order, for jobs, stopping for each job at the
// first step that closes its gap. It returns once every job's attempt has
// ended; [Resolver.Reread] and [Resolver.Authority] run the steps one job
// at a time, for callers that let each job's result go on alone.
func (r *Resolver) Resolve(ctx context.Context, steps []Step, jobs []Job, now time.Time) []Resolution {
	atts := make([]Attempt, len(jobs))
	for i, j := range jobs {
		atts[i] = Attempt{Job: j, Res: Resolution{JobID: j.ID}}
	}
	for _, step := range steps {
		if ctx.Err() != nil {
			break
		}
		switch step {
		case StepReread:
			r.Reread(ctx, atts, now)
		case StepSnapshot:
			if r.Snapshots == nil {
				continue
			}
			n := max(r.Concurrency, 1)
			sem := make(chan struct{}, n)
			var wg sync.WaitGroup
			for i := range atts {
				if atts[i].Res.Closed {
					continue
				}
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					r.Authority(ctx, &atts[i], now)
				})
			}
			wg.Wait()
		}
	}
	res := make([]Resolution, len(atts))
	for i := range atts {
		res[i] = atts[i].Res
	}
	return res
}

// Reread runs the re-read step for every attempt not yet closed, in one
// read of the store and one pass over the log for all of them.
func (r *Resolver) Reread(ctx context.Context, atts []Attempt, now time.Time) {
	var idx []int
	for i := range atts {
		if !atts[i].Res.Closed {
			idx = append(idx, i)
			atts[i].Res.Last = StepReread
		}
	}
	if len(idx) == 0 {
		return
	}
	if r.Store != nil {
		ids := make([]string, len(idx))
		for k, i := range idx {
			ids[k] = atts[i].Job.ID
		}
		rows, err := r.Store.Rows(ctx, ids)
		for _, i := range idx {
			a := &atts[i]
			if err != nil {
				a.Res.Err = fmt.Errorf("re-read store: %w", err)
				continue
			}
			row, ok := rows[a.Job.ID]
			if !ok || row.Version <= a.Job.Version {
				continue
			}
			moved, derr := row.Job(a.Job.ID, a.Job.Held)
			if derr != nil {
				a.Res.Err = fmt.Errorf("re-read store: %w", derr)
				continue
			}
			a.Res.Row = &row
			a.Job = moved
			settle(a, nil, StepReread)
		}
	}
	if r.Log == nil {
		return
	}
	var want []string
	from := now
	for _, i := range idx {
		a := &atts[i]
		if a.Res.Closed {
			continue
		}
		want = append(want, a.Job.ID)
		for _, h := range a.Job.Held {
			// The window is measured from the record's broker timestamp
			// where there is one, else from when it was first held.
			at := h.Since
			if !h.LogTime.IsZero() {
				at = h.LogTime
			}
			if at.Before(from) {
				from = at
			}
		}
	}
	if len(want) == 0 {
		return
	}
	start := from.Add(-r.Window)
	found, err := r.Log.Reread(ctx, want, start)
	byJob := map[string][]Input{}
	for _, in := range found {
		in.Source = FromReread
		byJob[in.Event.JobID] = append(byJob[in.Event.JobID], in)
	}
	for _, i := range idx {
		a := &atts[i]
		if a.Res.Closed {
			continue
		}
		// What a cut-short re-read found still counts.
		ins := byJob[a.Job.ID]
		sort.SliceStable(ins, func(x, y int) bool { return ins[x].Event.Version < ins[y].Event.Version })
		var useful []Input
		for _, in := range ins {
			if in.Event.Version > a.Job.Version {
				useful = append(useful, in)
			}
		}
		if settle(a, useful, StepReread) {
			continue
		}
		if err != nil {
			a.Res.Err = fmt.Errorf("re-read log: %w", err)
			continue
		}
		if a.Res.Err == nil {
			a.Res.Err = fmt.Errorf("re-read: versions %v not found in the store or the log since %s",
				a.Job.Missing(5), start.UTC().Format(time.RFC3339))
		}
	}
}

// Authority runs the snapshot step for one attempt: one request to the
// authority (its retries bounded by the source), whatever other jobs are
// waiting for.
func (r *Resolver) Authority(ctx context.Context, a *Attempt, now time.Time) {
	if r.Snapshots == nil || a.Res.Closed {
		return
	}
	a.Res.Last = StepSnapshot
	ev, err := r.Snapshots.Fetch(ctx, a.Job.ID)
	if err != nil {
		a.Res.Err = err // the source names the step
		return
	}
	// The authority answers with the job's whole state: a snapshot, or a
	// delete when the job is gone.
	if !ev.Kind.WholeState() || ev.JobID != a.Job.ID {
		a.Res.Err = fmt.Errorf("snapshot: the authority answered with a %s for %q", ev.Kind, ev.JobID)
		return
	}
	// Advance takes a snapshot's state as the event decoder leaves it, a
	// JSON object, and does not decode it: an authority's answer is
	// checked here, where a bad one is this attempt's failure rather than
	// a write PostgreSQL refuses.
	if ev.Kind == event.Snapshot {
		if _, err := delta.DecodeState(ev.State); err != nil {
			a.Res.Err = fmt.Errorf("snapshot: the authority's state for %q: %w", ev.JobID, err)
			return
		}
	}
	in := Input{Event: ev, Partition: -1, Offset: -1, Source: FromAuthority, At: now}
	if !settle(a, []Input{in}, StepSnapshot) {
		a.Res.Err = fmt.Errorf("snapshot: the authority is at version %d; still missing %v", ev.Version, a.Job.Missing(5))
	}
}

// settle offers inputs to the working copy of a job and records whether
// that closed the gap.
func settle(a *Attempt, ins []Input, step Step) bool {
	next, _ := Advance(a.Job, ins)
	a.Job = next
	a.Res.Inputs = append(a.Res.Inputs, ins...)
	if len(next.Held) == 0 {
		a.Res.Closed, a.Res.By, a.Res.Err = true, step, nil
		return true
	}
	return false
}

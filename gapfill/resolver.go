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

// Job is the row as a job with the given held deltas.
func (r Row) Job(id string, held map[int64]Held) (Job, error) {
	if r.Deleted {
		return Job{ID: id, Version: r.Version, EventID: r.EventID, Deleted: true, Held: held}, nil
	}
	state, err := delta.DecodeState(r.State)
	if err != nil {
		return Job{}, fmt.Errorf("job %q: stored state: %w", id, err)
	}
	return Job{ID: id, Version: r.Version, State: state, Raw: r.State, EventID: r.EventID, LastOps: r.LastOps, Held: held}, nil
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

// SnapshotSource fetches a trusted snapshot from the job's authority.
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

// Resolve runs steps, in order, for jobs, stopping for each job at the
// first step that closes its gap.
func (r *Resolver) Resolve(ctx context.Context, steps []Step, jobs []Job, now time.Time) []Resolution {
	res := make([]Resolution, len(jobs))
	work := make([]Job, len(jobs))
	copy(work, jobs)
	for i, j := range jobs {
		res[i] = Resolution{JobID: j.ID}
	}
	open := func() []int {
		var idx []int
		for i := range res {
			if !res[i].Closed {
				idx = append(idx, i)
			}
		}
		return idx
	}
	for _, step := range steps {
		idx := open()
		if len(idx) == 0 || ctx.Err() != nil {
			break
		}
		switch step {
		case StepReread:
			r.reread(ctx, idx, work, res, now)
		case StepSnapshot:
			r.snapshot(ctx, idx, work, res, now)
		}
	}
	return res
}

func (r *Resolver) reread(ctx context.Context, idx []int, work []Job, res []Resolution, now time.Time) {
	ids := make([]string, len(idx))
	for k, i := range idx {
		ids[k] = work[i].ID
		res[i].Last = StepReread
	}
	if r.Store != nil {
		rows, err := r.Store.Rows(ctx, ids)
		for _, i := range idx {
			if err != nil {
				res[i].Err = fmt.Errorf("re-read store: %w", err)
				continue
			}
			row, ok := rows[work[i].ID]
			if !ok || row.Version <= work[i].Version {
				continue
			}
			moved, derr := row.Job(work[i].ID, work[i].Held)
			if derr != nil {
				res[i].Err = fmt.Errorf("re-read store: %w", derr)
				continue
			}
			res[i].Row = &row
			work[i] = moved
			r.settle(&work[i], &res[i], nil, StepReread)
		}
	}
	if r.Log == nil {
		return
	}
	var want []string
	from := now
	for _, i := range idx {
		if res[i].Closed {
			continue
		}
		want = append(want, work[i].ID)
		for _, h := range work[i].Held {
			if h.Since.Before(from) {
				from = h.Since
			}
		}
	}
	if len(want) == 0 {
		return
	}
	found, err := r.Log.Reread(ctx, want, from.Add(-r.Window))
	byJob := map[string][]Input{}
	for _, in := range found {
		in.Source = FromReread
		byJob[in.Event.JobID] = append(byJob[in.Event.JobID], in)
	}
	for _, i := range idx {
		if res[i].Closed {
			continue
		}
		// What a cut-short re-read found still counts.
		ins := byJob[work[i].ID]
		sort.SliceStable(ins, func(a, b int) bool { return ins[a].Event.Version < ins[b].Event.Version })
		var useful []Input
		for _, in := range ins {
			if in.Event.Version > work[i].Version {
				useful = append(useful, in)
			}
		}
		if r.settle(&work[i], &res[i], useful, StepReread) {
			continue
		}
		if err != nil {
			res[i].Err = fmt.Errorf("re-read log: %w", err)
			continue
		}
		if res[i].Err == nil {
			res[i].Err = fmt.Errorf("re-read: versions %v not found in the store or the log since %s",
				work[i].Missing(5), from.Add(-r.Window).UTC().Format(time.RFC3339))
		}
	}
}

func (r *Resolver) snapshot(ctx context.Context, idx []int, work []Job, res []Resolution, now time.Time) {
	if r.Snapshots == nil {
		return
	}
	n := max(r.Concurrency, 1)
	sem := make(chan struct{}, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, i := range idx {
		res[i].Last = StepSnapshot
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ev, err := r.Snapshots.Fetch(ctx, work[i].ID)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res[i].Err = err // the source names the step
				return
			}
			// The authority answers with the job's whole state: a
			// snapshot, or a delete when the job is gone.
			if !ev.Kind.WholeState() || ev.JobID != work[i].ID {
				res[i].Err = fmt.Errorf("snapshot: the authority answered with a %s for %q", ev.Kind, ev.JobID)
				return
			}
			in := Input{Event: ev, Partition: -1, Offset: -1, Source: FromAuthority, At: now}
			if !r.settle(&work[i], &res[i], []Input{in}, StepSnapshot) {
				res[i].Err = fmt.Errorf("snapshot: the authority is at version %d; still missing %v", ev.Version, work[i].Missing(5))
			}
		})
	}
	wg.Wait()
}

// settle offers inputs to the working copy of a job and records whether
// that closed the gap.
func (r *Resolver) settle(j *Job, res *Resolution, ins []Input, step Step) bool {
	next, _ := Advance(*j, ins)
	*j = next
	res.Inputs = append(res.Inputs, ins...)
	if len(next.Held) == 0 {
		res.Closed, res.By, res.Err = true, step, nil
		return true
	}
	return false
}

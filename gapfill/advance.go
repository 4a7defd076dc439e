package gapfill

import (
	"encoding/json"
	"maps"
	"slices"
	"time"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
	"github.com/projector/projector/snapshot"
)

// Source is where an input came from; it decides what closed a gap.
type Source int

// The sources of events.
const (
	// FromLog is the partition's normal flow: a gap it closes was closed by
	// waiting.
	FromLog Source = iota
	// FromReread is the store or the log read again.
	FromReread
	// FromAuthority is a trusted snapshot.
	FromAuthority
)

func (s Source) String() string {
	switch s {
	case FromLog:
		return "wait"
	case FromReread:
		return "reread"
	case FromAuthority:
		return "snapshot"
	}
	return "unknown"
}

// Input is one event offered to a job.
type Input struct {
	Event     event.Event
	Partition int
	Offset    int64
	Source    Source
	// At is when it was read; it dates a hold.
	At time.Time
}

// Held is a delta waiting for the versions before it.
type Held struct {
	Input
	// Since is when it was first held.
	Since time.Time
}

// Job is one job's row and its held deltas. Advance never modifies a Job
// it is given; it returns a new one.
type Job struct {
	ID      string
	Version int64
	// State is the row's state decoded with json.Number; nil is {}.
	State map[string]any
	// Raw is State encoded, when known; Advance keeps it in step.
	Raw json.RawMessage
	// EventID is the event id of the event that made the row's version.
	EventID string
	// Held maps version to held delta; every key is above Version+1.
	Held map[int64]Held
}

// Missing lists the versions a held job waits for, lowest first, at most
// limit of them.
func (j *Job) Missing(limit int) []int64 {
	if len(j.Held) == 0 {
		return nil
	}
	var out []int64
	for v := j.Version + 1; len(out) < limit; v++ {
		if _, ok := j.Held[v]; ok {
			if v > j.maxHeld() {
				break
			}
			continue
		}
		if v > j.maxHeld() {
			break
		}
		out = append(out, v)
	}
	return out
}

func (j *Job) maxHeld() int64 {
	var m int64
	for v := range j.Held {
		m = max(m, v)
	}
	return m
}

// Conflict is the same version seen with different content.
type Conflict struct {
	Version          int64
	KeptEventID      string
	DroppedEventID   string
	DroppedPartition int
	DroppedOffset    int64
}

// Rejected is a delta whose ops could not be applied to the state it
// follows (an increment of a non-number): bad input, to be quarantined.
type Rejected struct {
	Input
	Err error
}

// Outcome is what one Advance did, by input and by held delta.
type Outcome struct {
	// Applied counts inputs and held deltas that changed the row.
	Applied int
	// Stale counts snapshots at or below the row's version.
	Stale int
	// Duplicates counts deltas at or below the row's version, or already held.
	Duplicates int
	Conflicts  []Conflict
	// NewlyHeld are inputs held in this Advance.
	NewlyHeld []Held
	// Released are held versions that left the held set, applied or covered
	// by a snapshot, including ones held in this same Advance.
	Released []int64
	Rejected []Rejected
	// Changed reports a new row version.
	Changed bool
	// Closed reports that the job had held deltas and now has none, and
	// ClosedBy what closed the gap.
	Closed   bool
	ClosedBy Source
	// LastOffset is the offset of the input that last changed the row, and
	// LastEventID its event id.
	LastOffset  int64
	LastEventID string
}

// Advance offers inputs, in order, to job under the version rules and
// returns the job after them. Deltas next in line apply; a delta ahead of a
// gap is held; held deltas are released as soon as they are next in line;
// a snapshot above the row replaces it and covers the held deltas at or
// below its version. It is pure.
func Advance(job Job, inputs []Input) (Job, Outcome) {
	var out Outcome
	hadHeld := len(job.Held) > 0
	job.Held = maps.Clone(job.Held)
	if job.Held == nil {
		job.Held = map[int64]Held{}
	}
	newly := map[int64]bool{}
	var closer Source

	for _, in := range inputs {
		ev := in.Event
		switch ev.Kind {
		case event.Snapshot:
			if ev.Version <= job.Version {
				if ev.Version == job.Version && !snapshot.SameState(ev.State, rawOf(&job)) {
					out.Conflicts = append(out.Conflicts, Conflict{Version: ev.Version, KeptEventID: job.EventID,
						DroppedEventID: ev.EventID, DroppedPartition: in.Partition, DroppedOffset: in.Offset})
					continue
				}
				out.Stale++
				continue
			}
			state, err := delta.DecodeState(ev.State)
			if err != nil {
				out.Rejected = append(out.Rejected, Rejected{Input: in, Err: err})
				continue
			}
			job.Version, job.State, job.Raw, job.EventID = ev.Version, state, ev.State, ev.EventID
			out.Applied++
			out.Changed = true
			out.LastOffset, out.LastEventID = in.Offset, ev.EventID
			closer = in.Source
			for v := range job.Held {
				if v <= job.Version {
					delete(job.Held, v)
					out.Released = append(out.Released, v)
				}
			}
			drain(&job, &out)
		case event.Delta:
			switch {
			case ev.Version <= job.Version:
				out.Duplicates++
			case ev.Version == job.Version+1:
				if !apply(&job, in, &out) {
					continue
				}
				closer = in.Source
				drain(&job, &out)
			default:
				if h, ok := job.Held[ev.Version]; ok {
					if sameOps(h.Event.RawOps, ev.RawOps) {
						out.Duplicates++
					} else {
						out.Conflicts = append(out.Conflicts, Conflict{Version: ev.Version, KeptEventID: h.Event.EventID,
							DroppedEventID: ev.EventID, DroppedPartition: in.Partition, DroppedOffset: in.Offset})
					}
					continue
				}
				since := in.At
				job.Held[ev.Version] = Held{Input: in, Since: since}
				newly[ev.Version] = true
			}
		}
	}

	for v := range newly {
		if h, ok := job.Held[v]; ok {
			out.NewlyHeld = append(out.NewlyHeld, h)
		}
	}
	slices.SortFunc(out.NewlyHeld, func(a, b Held) int { return int(a.Event.Version - b.Event.Version) })
	// A delta held and released within this same Advance never reaches
	// the store: drop it from Released so only stored rows are deleted.
	kept := out.Released[:0]
	for _, v := range out.Released {
		if !newly[v] {
			kept = append(kept, v)
		}
	}
	out.Released = kept
	if hadHeld && len(job.Held) == 0 {
		out.Closed, out.ClosedBy = true, closer
	}
	if out.Changed {
		rawOf(&job)
	}
	return job, out
}

// rawOf returns the job's state encoded, encoding it once if needed.
func rawOf(job *Job) json.RawMessage {
	if job.Raw == nil {
		if job.State == nil {
			job.Raw = json.RawMessage(`{}`)
		} else if raw, err := delta.EncodeState(job.State); err == nil {
			job.Raw = raw
		}
	}
	return job.Raw
}

// apply runs one next-in-line delta. A delta whose ops fail is rejected and
// the row stays where it was.
func apply(job *Job, in Input, out *Outcome) bool {
	state, err := delta.Apply(job.State, in.Event.Ops)
	if err != nil {
		out.Rejected = append(out.Rejected, Rejected{Input: in, Err: err})
		return false
	}
	job.Version, job.State, job.Raw, job.EventID = in.Event.Version, state, nil, in.Event.EventID
	out.Applied++
	out.Changed = true
	out.LastOffset, out.LastEventID = in.Offset, in.Event.EventID
	return true
}

// drain releases held deltas while the next one is in line.
func drain(job *Job, out *Outcome) {
	for {
		h, ok := job.Held[job.Version+1]
		if !ok {
			return
		}
		delete(job.Held, h.Event.Version)
		out.Released = append(out.Released, h.Event.Version)
		if !apply(job, h.Input, out) {
			// The held delta itself is bad input; the row stays and the
			// rest stay held behind the new gap.
			return
		}
	}
}

func sameOps(a, b json.RawMessage) bool { return snapshot.SameState(a, b) }

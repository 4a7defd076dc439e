package gapfill

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
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
	// LogTime is the record's broker timestamp, zero when unknown: the
	// log re-read window is measured from it.
	LogTime time.Time
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
	// State is the row's state decoded with json.Number. It may be nil
	// while Raw is set: Advance decodes Raw when a delta needs it, so a
	// row no delta touches is never decoded. Both nil is {}.
	State map[string]any
	// Raw is State encoded, when known; Advance keeps it in step. It
	// must be valid JSON (as the event decoder, delta.EncodeState and
	// PostgreSQL's jsonb make it): Advance decodes it without checking.
	Raw json.RawMessage
	// EventID is the event id of the event that made the row's version.
	EventID string
	// LastOps are the ops of the delta that made the row's version; nil
	// when a snapshot did (or it is not known). A delta at that version
	// with other ops is a conflict, not a duplicate.
	LastOps json.RawMessage
	// Deleted reports that the job was deleted at Version: it has no row
	// and no state, and its tombstone makes every event at or below
	// Version stale or a duplicate.
	Deleted bool
	// Held maps version to held delta; every key is above Version+1.
	Held map[int64]Held
}

// Missing lists the versions a held job waits for, lowest first, at most
// limit of them.
func (j *Job) Missing(limit int) []int64 {
	if len(j.Held) == 0 {
		return nil
	}
	top := j.maxHeld()
	var out []int64
	for v := j.Version + 1; v < top && len(out) < limit; v++ {
		if _, held := j.Held[v]; !held {
			out = append(out, v)
		}
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

// DeletedError refuses a delta next in line after a delete: a deleted job
// has no state for it to change.
type DeletedError struct {
	// Version is the delete's.
	Version int64
}

func (e *DeletedError) Error() string {
	return fmt.Sprintf("follows the delete at version %d: a deleted job has no state for a delta to change (a snapshot above version %d creates the job again)", e.Version, e.Version)
}

// Rejected is a delta whose ops could not be applied to the state it
// follows (an increment of a non-number), or that follows a delete: bad
// input, to be quarantined.
type Rejected struct {
	Input
	Err error
}

// Outcome is what one Advance did, by input and by held delta.
type Outcome struct {
	// Applied counts inputs and held deltas that changed the row.
	Applied int
	// Deleted counts deletes that removed the row (or marked a job never
	// seen as deleted).
	Deleted int
	// Stale counts snapshots and deletes at or below the row's version.
	Stale int
	// Duplicates counts deltas at or below the row's version, or already held.
	Duplicates int
	Conflicts  []Conflict
	// NewlyHeld are inputs held in this Advance.
	NewlyHeld []Held
	// Released are held versions that left the held set, applied or covered
	// by a snapshot, including ones held in this same Advance.
	Released []int64
	// Covered counts held deltas dropped because a snapshot or a delete
	// at or above their version replaced the whole state.
	Covered  int
	Rejected []Rejected
	// Held counts inputs held at any point of this Advance, including
	// ones released again before it returned.
	Held int
	// Changed reports a new row version (or a new deleted version).
	Changed bool
	// Closed reports that the job had held deltas, before or during this
	// Advance, and now has none; ClosedBy is what closed the gap.
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
// a snapshot or a delete above the row replaces it and covers the held
// deltas at or below its version; a delta next in line after a delete is
// rejected, since a deleted job has no state to change. A snapshot's state
// must be a JSON object, as [event.Decode] leaves it: it is taken as the
// row's encoded state and decoded only if a delta follows it. It is pure.
func Advance(job Job, inputs []Input) (Job, Outcome) {
	var out Outcome
	everHeld := len(job.Held) > 0
	// The held set is this call's own copy; none is made for a job that
	// holds nothing until a delta is held (most jobs of a batch).
	job.Held = maps.Clone(job.Held)
	var newly map[int64]bool
	// owned says job.State was made in this Advance (decoded or copied),
	// so deltas may change it in place: the caller's state is never
	// touched, and one copy serves every delta of the batch.
	owned := false
	var closer Source
	// Held deltas the row already covers (another writer, a previous owner
	// or a re-read moved it) are duplicates now: release them, and any
	// that became next in line.
	for v := range job.Held {
		if v <= job.Version {
			delete(job.Held, v)
			out.Released = append(out.Released, v)
			out.Duplicates++
			closer = FromReread
		}
	}
	if len(job.Held) > 0 && job.Held[job.Version+1].Event.Version != 0 {
		closer = FromReread
		drain(&job, &out, &owned)
	}

	for _, in := range inputs {
		ev := in.Event
		// The gap is closed by the input that empties the held set, not
		// by whatever input last moved the row.
		wasHeld := len(job.Held) > 0
		// Only the log's deliveries are counted as stale, duplicate or
		// conflicting: a re-read finds the same copies on every attempt,
		// and the partition that delivers them counts them there.
		delivered := in.Source == FromLog
		switch ev.Kind {
		case event.Snapshot:
			if ev.Version <= job.Version {
				if !delivered {
					continue
				}
				// A tombstone makes a snapshot at its own version stale:
				// the delete was applied first and wins.
				if ev.Version == job.Version && !job.Deleted && !delta.SameState(ev.State, rawOf(&job)) {
					out.Conflicts = append(out.Conflicts, Conflict{Version: ev.Version, KeptEventID: job.EventID,
						DroppedEventID: ev.EventID, DroppedPartition: in.Partition, DroppedOffset: in.Offset})
					continue
				}
				out.Stale++
				continue
			}
			// Not decoded here: a delta after it decodes it ([apply]),
			// and most snapshots meet none in their batch. The event's
			// decoder has checked it is a JSON object, as the fast path
			// of snapshots only, which never decodes it, relies on too.
			job.Version, job.State, job.Raw, job.EventID, job.LastOps, job.Deleted = ev.Version, nil, ev.State, ev.EventID, nil, false
			owned = false
			out.Applied++
			out.Changed = true
			out.LastOffset, out.LastEventID = in.Offset, ev.EventID
			cover(&job, &out)
			drain(&job, &out, &owned)
			if wasHeld && len(job.Held) == 0 {
				closer = in.Source
			}
		case event.Delete:
			if ev.Version <= job.Version {
				if !delivered {
					continue
				}
				// A delete at the version of a live row is the same
				// version with other content.
				if ev.Version == job.Version && !job.Deleted {
					out.Conflicts = append(out.Conflicts, Conflict{Version: ev.Version, KeptEventID: job.EventID,
						DroppedEventID: ev.EventID, DroppedPartition: in.Partition, DroppedOffset: in.Offset})
					continue
				}
				out.Stale++
				continue
			}
			job.Version, job.State, job.Raw, job.EventID, job.LastOps, job.Deleted = ev.Version, nil, nil, ev.EventID, nil, true
			out.Deleted++
			out.Changed = true
			out.LastOffset, out.LastEventID = in.Offset, ev.EventID
			cover(&job, &out)
			// A held delta next in line now follows the delete: drain
			// refuses it to the quarantine.
			drain(&job, &out, &owned)
			if wasHeld && len(job.Held) == 0 {
				closer = in.Source
			}
		case event.Delta:
			switch {
			case ev.Version <= job.Version:
				switch {
				case !delivered:
				case ev.Version == job.Version && job.LastOps != nil && !sameOps(job.LastOps, ev.RawOps):
					out.Conflicts = append(out.Conflicts, Conflict{Version: ev.Version, KeptEventID: job.EventID,
						DroppedEventID: ev.EventID, DroppedPartition: in.Partition, DroppedOffset: in.Offset})
				default:
					out.Duplicates++
				}
			case ev.Version == job.Version+1:
				if !apply(&job, in, &out, &owned) {
					continue
				}
				drain(&job, &out, &owned)
				if wasHeld && len(job.Held) == 0 {
					closer = in.Source
				}
			default:
				if h, ok := job.Held[ev.Version]; ok {
					switch {
					case !delivered:
					case sameOps(h.Event.RawOps, ev.RawOps):
						out.Duplicates++
					default:
						out.Conflicts = append(out.Conflicts, Conflict{Version: ev.Version, KeptEventID: h.Event.EventID,
							DroppedEventID: ev.EventID, DroppedPartition: in.Partition, DroppedOffset: in.Offset})
					}
					continue
				}
				if job.Held == nil {
					job.Held = map[int64]Held{}
				}
				if newly == nil {
					newly = map[int64]bool{}
				}
				job.Held[ev.Version] = Held{Input: in, Since: in.At}
				newly[ev.Version] = true
				everHeld = true
				out.Held++
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
	if everHeld && len(job.Held) == 0 {
		out.Closed, out.ClosedBy = true, closer
	}
	if out.Changed && !job.Deleted {
		rawOf(&job)
	}
	return job, out
}

// cover drops the held deltas at or below the row's version: a whole-state
// event replaced the state they would have changed.
func cover(job *Job, out *Outcome) {
	for v := range job.Held {
		if v <= job.Version {
			delete(job.Held, v)
			out.Released = append(out.Released, v)
			out.Covered++
		}
	}
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

// apply runs one next-in-line delta. A delta whose ops fail, or that
// follows a delete, is rejected and the row stays where it was. The state
// is changed in place once owned (see [Advance]); until then the delta
// applies to a copy, which Advance owns from then on.
func apply(job *Job, in Input, out *Outcome, owned *bool) bool {
	if job.Deleted {
		out.Rejected = append(out.Rejected, Rejected{Input: in, Err: &DeletedError{Version: job.Version}})
		return false
	}
	if job.State == nil {
		state := map[string]any{}
		if job.Raw != nil {
			decoded, err := delta.DecodeValidState(job.Raw)
			if err != nil {
				out.Rejected = append(out.Rejected, Rejected{Input: in, Err: fmt.Errorf("the state it follows: %w", err)})
				return false
			}
			state = decoded
		}
		job.State, *owned = state, true
	}
	if *owned {
		if err := delta.Patch(job.State, in.Event.Ops); err != nil {
			out.Rejected = append(out.Rejected, Rejected{Input: in, Err: err})
			return false
		}
	} else {
		state, err := delta.Apply(job.State, in.Event.Ops)
		if err != nil {
			out.Rejected = append(out.Rejected, Rejected{Input: in, Err: err})
			return false
		}
		job.State, *owned = state, true
	}
	job.Version, job.Raw, job.EventID, job.LastOps = in.Event.Version, nil, in.Event.EventID, in.Event.RawOps
	out.Applied++
	out.Changed = true
	out.LastOffset, out.LastEventID = in.Offset, in.Event.EventID
	return true
}

// drain releases held deltas while the next one is in line.
func drain(job *Job, out *Outcome, owned *bool) {
	for {
		h, ok := job.Held[job.Version+1]
		if !ok {
			return
		}
		delete(job.Held, h.Event.Version)
		out.Released = append(out.Released, h.Event.Version)
		if !apply(job, h.Input, out, owned) {
			// The held delta itself is bad input; the row stays and the
			// rest stay held behind the new gap.
			return
		}
	}
}

func sameOps(a, b json.RawMessage) bool { return delta.SameState(a, b) }

package projection

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/projector/projector/event"
	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/store"
)

// ReplayReport counts what a replay did with each quarantined record.
type ReplayReport struct {
	// Replayed counts the records replayed, each once.
	Replayed int `json:"replayed"`
	// Applied records changed their job's row; Stale and Duplicates were
	// already covered by it, Conflicts met the row at their version with
	// other content (the row wins, as for live records). All four left the
	// quarantine.
	Applied    int `json:"applied"`
	Stale      int `json:"stale"`
	Duplicates int `json:"duplicates"`
	Conflicts  int `json:"conflicts"`
	// Refused records are still refused and stay, with their reason
	// updated.
	Refused int `json:"refused"`
	// Waiting are deltas whose previous versions are not in the row yet:
	// they stay, to be replayed once those are applied.
	Waiting int `json:"waiting"`
}

// Left is how many records left the quarantine.
func (r ReplayReport) Left() int { return r.Applied + r.Stale + r.Duplicates + r.Conflicts }

// replayRetries bounds how often one record is tried again when its row
// moves under it (the live projection writing the same job).
const replayRetries = 5

// replayChunk bounds the quarantined records (values included) held in
// memory at once.
const replayChunk = 200

// Replay runs the quarantined records ids again, oldest first, through
// today's decoder and version rules and writes them with the same
// version-conditional statements as live records. It never touches a
// partition's position or epoch and never holds a delta (a held delta
// belongs to the partition's owner): a delta that is not next in line stays
// in the quarantine, its reason saying which versions it waits for. It is
// safe while the projection runs. An id no longer in the quarantine (another
// replay took it) is skipped.
func Replay(ctx context.Context, st *store.Store, ids []int64) (ReplayReport, error) {
	var rep ReplayReport
	todo := slices.Clone(ids)
	slices.Sort(todo)
	todo = slices.Compact(todo)
	// A delta may wait for one quarantined after it: go round again with
	// the waiting ones while a round applies something.
	for len(todo) > 0 {
		var waiting []int64
		applied := rep.Applied
		rep.Waiting = 0
		for chunk := range slices.Chunk(todo, replayChunk) {
			recs, err := st.QuarantineRecords(ctx, store.QuarantineFilter{IDs: chunk})
			if err != nil {
				return rep, err
			}
			slices.SortFunc(recs, func(a, b store.QuarantineRecord) int { return cmp.Compare(a.ID, b.ID) })
			for _, q := range recs {
				if err := replayOne(ctx, st, q, &rep); err != nil {
					return rep, err
				}
				if rep.Waiting > len(waiting) {
					waiting = append(waiting, q.ID)
				}
			}
		}
		if rep.Replayed == 0 {
			rep.Replayed = rep.Left() + rep.Refused + rep.Waiting
		}
		if rep.Applied == applied {
			break
		}
		todo = waiting
	}
	return rep, nil
}

func replayOne(ctx context.Context, st *store.Store, q store.QuarantineRecord, rep *ReplayReport) error {
	ev, err := event.Decode(q.Key, q.Value)
	if err != nil {
		rep.Refused++
		return st.Requarantine(ctx, q.ID, err.Error())
	}
	for try := 0; ; try++ {
		rows, err := st.LoadJobs(ctx, []string{ev.JobID})
		if err != nil {
			return err
		}
		job := storedJob(ev.JobID, rows, nil)
		next, out := gapfill.Advance(job, []gapfill.Input{{Event: ev, Partition: q.Partition, Offset: q.Offset, Source: gapfill.FromLog, At: time.Now()}})
		switch {
		case len(out.Rejected) > 0:
			r := out.Rejected[0]
			rep.Refused++
			return st.Requarantine(ctx, q.ID, fmt.Sprintf("version %d: %v", r.Event.Version, r.Err))
		case len(next.Held) > 0:
			rep.Waiting++
			return st.Requarantine(ctx, q.ID, waitingReason(ev.Version, job.Version))
		}
		var w *store.Write
		if out.Changed {
			w = &store.Write{JobID: ev.JobID, Version: next.Version, State: next.Raw, Deleted: next.Deleted,
				Expect: job.Version, ExpectDeleted: job.Deleted, ExpectEventID: job.EventID,
				Offset: q.Offset, EventID: ev.EventID, LastOps: next.LastOps}
		}
		err = st.Unquarantine(ctx, q, w)
		var stale *store.StaleError
		switch {
		case err == nil:
			switch {
			case out.Changed:
				rep.Applied++
			case len(out.Conflicts) > 0:
				rep.Conflicts++
			case out.Duplicates > 0:
				rep.Duplicates++
			default:
				rep.Stale++
			}
			return nil
		case errors.As(err, &stale) && try < replayRetries:
			continue // the row moved: read it again and decide again
		case store.IsBadData(err):
			rep.Refused++
			reason := store.Refusal(err)
			if strings.HasSuffix(q.Error, reason) {
				// The same refusal, quarantined with the version before
				// it (a held delta's): keep the row as it is.
				reason = q.Error
			}
			return st.Requarantine(ctx, q.ID, reason)
		default:
			return fmt.Errorf("projection: replay quarantined record %d: %w", q.ID, err)
		}
	}
}

func waitingReason(version, row int64) string {
	if version == row+2 {
		return fmt.Sprintf("replay: version %d waits for version %d (the row is at %d); replay it again once that is applied", version, row+1, row)
	}
	return fmt.Sprintf("replay: version %d waits for versions %d to %d (the row is at %d); replay it again once those are applied", version, row+1, version-1, row)
}

package projection

import (
	"encoding/json"
	"time"

	"github.com/projector/projector/store"
)

// DefaultExplainGaps is how many of a job's newest gap log entries an
// explanation lists unless asked for another number.
const DefaultExplainGaps = 10

// Explanation is one job as `projector explain --json` prints it and
// GET /explain/{job_id} serves it: its row, its held deltas and why, and
// its recent gaps.
type Explanation struct {
	JobID string `json:"job_id"`
	// Version is the row's version, or the delete's for a deleted job; 0
	// when there is neither.
	Version int64 `json:"version"`
	// Deleted reports a deleted job: Tombstone says when and from where.
	Deleted   bool                `json:"deleted"`
	Tombstone *store.TombstoneRow `json:"tombstone"`
	State     json.RawMessage     `json:"state"`
	Updated   *time.Time          `json:"updated"`
	Source    *ExplainSource      `json:"source"`
	Held      []ExplainHeld       `json:"held"`
	// WaitingFor are the versions the held deltas wait for.
	WaitingFor []int64             `json:"waiting_for"`
	Gaps       []store.GapLogEntry `json:"gaps"`
}

// ExplainSource is where a job's row was last written from.
type ExplainSource struct {
	Topic     string `json:"topic"`
	Partition *int   `json:"partition"`
	Offset    *int64 `json:"offset"`
	EventID   string `json:"event_id"`
}

// ExplainHeld is one held delta and the versions it waits for.
type ExplainHeld struct {
	store.HeldDelta
	WaitingFor []int64 `json:"waiting_for"`
}

// Known reports whether the store knows the job at all: a row, a
// tombstone or a held delta.
func Known(ex *store.Explanation) bool {
	return ex.Row != nil || ex.Tombstone != nil || len(ex.Held) > 0
}

// ExplanationOf is what the store knows of job ([store.Store.Explain]),
// as explain reports it.
func ExplanationOf(job string, ex *store.Explanation) *Explanation {
	rep := &Explanation{JobID: job, Held: []ExplainHeld{}, WaitingFor: ex.Waiting, Gaps: ex.Gaps}
	if rep.WaitingFor == nil {
		rep.WaitingFor = []int64{}
	}
	if rep.Gaps == nil {
		rep.Gaps = []store.GapLogEntry{}
	}
	if t := ex.Tombstone; t != nil && ex.Row == nil {
		rep.Version, rep.Deleted, rep.Tombstone = t.Version, true, t
	}
	if r := ex.Row; r != nil {
		updated := r.UpdatedAt.UTC()
		rep.Version, rep.State, rep.Updated = r.Version, json.RawMessage(r.State), &updated
		rep.Source = &ExplainSource{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, EventID: r.EventID}
	}
	for _, h := range ex.Held {
		eh := ExplainHeld{HeldDelta: h, WaitingFor: []int64{}}
		for _, v := range ex.Waiting {
			if v < h.Version {
				eh.WaitingFor = append(eh.WaitingFor, v)
			}
		}
		rep.Held = append(rep.Held, eh)
	}
	return rep
}

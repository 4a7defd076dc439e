package verify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
	"github.com/projector/projector/snapshot"
	"github.com/projector/projector/store"
)

// Kind is a kind of drift between a row and the authority.
type Kind string

// The drift kinds.
const (
	// Missing: the authority knows the job, the read model has no row.
	Missing Kind = "missing"
	// Behind: the row's version is below the authority's.
	Behind Kind = "behind"
	// Ahead: the row's version is above the authority's. Never repaired:
	// the log may simply be ahead of the authority.
	Ahead Kind = "ahead"
	// Differs: same version, other state.
	Differs Kind = "differs"
)

// Kinds lists the kinds in the order reports show them.
var Kinds = []Kind{Missing, Behind, Ahead, Differs}

// Drift is one job whose row is not what the authority says.
type Drift struct {
	JobID            string `json:"job_id"`
	Kind             Kind   `json:"kind"`
	RowVersion       int64  `json:"row_version"`
	AuthorityVersion int64  `json:"authority_version"`
	// RowDeleted: the read model holds a tombstone at RowVersion, no row.
	// AuthorityDeleted: the authority says the job was deleted at
	// AuthorityVersion.
	RowDeleted       bool `json:"row_deleted,omitempty"`
	AuthorityDeleted bool `json:"authority_deleted,omitempty"`
	// Repaired reports that --repair healed it.
	Repaired bool `json:"repaired"`
	// Note says why a drift was not repaired, when it was tried.
	Note string `json:"note,omitempty"`
}

// Failure is a job that could not be checked.
type Failure struct {
	JobID string `json:"job_id"`
	Error string `json:"error"`
}

// Report is what a verification found and did.
type Report struct {
	Checked int     `json:"checked"`
	Drifts  []Drift `json:"drifts"`
	// Counts are the drifts by kind, repaired or not.
	Counts   map[Kind]int `json:"counts"`
	Repaired int          `json:"repaired"`
	// Remaining counts the drifts still there at the end.
	Remaining int `json:"remaining"`
	// Unknown are jobs the authority does not know (404): not drift, but
	// worth a look.
	Unknown []string  `json:"unknown_to_authority"`
	Failed  []Failure `json:"failed"`
}

// Source is the authority: [snapshot.Client] is one.
type Source interface {
	Fetch(ctx context.Context, jobID string) (event.Event, error)
}

// Config says what to check and how.
type Config struct {
	Store     *store.Store
	Authority Source
	// Repair heals missing, behind and differs.
	Repair bool
	// Rate bounds requests to the authority per second.
	Rate int
	// Workers bounds requests in flight. Default 4.
	Workers int
}

// Run checks every job ids yields (in pages, until it returns none) against
// the authority, at most Rate requests a second, repairing when asked.
// It stops at the first store error or when ctx ends.
func Run(ctx context.Context, cfg Config, ids func(ctx context.Context) ([]string, error)) (*Report, error) {
	if cfg.Rate <= 0 || cfg.Rate > int(time.Second) {
		return nil, fmt.Errorf("verify: rate %d: must be from 1 to 1e9 requests per second", cfg.Rate)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	rep := &Report{Drifts: []Drift{}, Counts: map[Kind]int{}, Unknown: []string{}, Failed: []Failure{}}
	for _, k := range Kinds {
		rep.Counts[k] = 0
	}
	tick := time.NewTicker(time.Second / time.Duration(cfg.Rate))
	defer tick.Stop()
	var mu sync.Mutex
	for {
		page, err := ids(ctx)
		if err != nil {
			return rep, err
		}
		if len(page) == 0 {
			break
		}
		rows, err := cfg.Store.LoadJobs(ctx, page)
		if err != nil {
			return rep, err
		}
		work := make(chan string)
		var wg sync.WaitGroup
		var firstErr error
		for range min(cfg.Workers, len(page)) {
			wg.Go(func() {
				for id := range work {
					row, ok := rows[id]
					d, unknown, fail, err := check(ctx, cfg, id, row, ok)
					mu.Lock()
					rep.Checked++
					switch {
					case err != nil:
						if firstErr == nil {
							firstErr = err
						}
					case fail != "":
						rep.Failed = append(rep.Failed, Failure{JobID: id, Error: fail})
					case unknown:
						rep.Unknown = append(rep.Unknown, id)
					case d != nil:
						rep.Drifts = append(rep.Drifts, *d)
						rep.Counts[d.Kind]++
						if d.Repaired {
							rep.Repaired++
						} else {
							rep.Remaining++
						}
					}
					mu.Unlock()
				}
			})
		}
	feed:
		for _, id := range page {
			select {
			case <-ctx.Done():
				break feed
			case <-tick.C:
			}
			select {
			case <-ctx.Done():
				break feed
			case work <- id:
			}
		}
		close(work)
		wg.Wait()
		if firstErr != nil {
			return rep, firstErr
		}
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("verify: stopped after %d jobs: %w", rep.Checked, err)
		}
	}
	slices.SortFunc(rep.Drifts, func(a, b Drift) int { return strings.Compare(a.JobID, b.JobID) })
	slices.Sort(rep.Unknown)
	slices.SortFunc(rep.Failed, func(a, b Failure) int { return strings.Compare(a.JobID, b.JobID) })
	return rep, nil
}

// check compares one job's row with the authority and repairs it if asked.
// It returns a store error only; the authority's failures are reported.
func check(ctx context.Context, cfg Config, id string, row store.Job, hasRow bool) (d *Drift, unknown bool, fail string, err error) {
	ev, ferr := cfg.Authority.Fetch(ctx, id)
	switch {
	case errors.Is(ferr, snapshot.ErrNotFound):
		return nil, true, "", nil
	case ferr != nil:
		return nil, false, ferr.Error(), nil
	}
	d = classify(id, row, hasRow, ev)
	if d == nil || !cfg.Repair || d.Kind == Ahead {
		return d, false, "", nil
	}
	if d.Kind == Differs && (d.RowDeleted || d.AuthorityDeleted) {
		d.Note = "a delete and a state at the same version: not repaired, decide by hand"
		return d, false, "", nil
	}
	applied, before, err := cfg.Store.Heal(ctx, id, ev.Version, ev.State, ev.EventID, ev.Kind == event.Delete)
	if err != nil {
		return nil, false, "", err
	}
	if applied {
		d.Repaired = true
		return d, false, "", nil
	}
	// The row moved between the read and the write: judge it again.
	rows, err := cfg.Store.LoadJobs(ctx, []string{id})
	if err != nil {
		return nil, false, "", err
	}
	now, ok := rows[id]
	again := classify(id, now, ok, ev)
	if again == nil {
		d.Repaired = true
		d.Note = "the row caught up by itself"
		return d, false, "", nil
	}
	again.Note = fmt.Sprintf("the row moved from v%d under the repair", before)
	return again, false, "", nil
}

// classify compares what the read model holds of a job (a row, a
// tombstone, or nothing) with what the authority says (a snapshot or a
// delete). A delete the read model has no trace of is no drift: both say
// the job is not there.
func classify(id string, row store.Job, hasRow bool, auth event.Event) *Drift {
	authDeleted := auth.Kind == event.Delete
	d := &Drift{JobID: id, RowVersion: row.Version, AuthorityVersion: auth.Version,
		RowDeleted: hasRow && row.Deleted, AuthorityDeleted: authDeleted}
	switch {
	case !hasRow && authDeleted:
		return nil
	case !hasRow:
		d.Kind, d.RowVersion = Missing, 0
	case row.Version < auth.Version:
		d.Kind = Behind
	case row.Version > auth.Version:
		d.Kind = Ahead
	case row.Deleted != authDeleted:
		d.Kind = Differs
	case !authDeleted && !delta.SameState(json.RawMessage(row.State), auth.State):
		d.Kind = Differs
	default:
		return nil
	}
	return d
}

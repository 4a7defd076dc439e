package projection

import (
	"context"
	"time"

	"github.com/projector/projector/event"
	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/source"
	"github.com/projector/projector/store"
)

// storeRows lets the gap resolver read rows again.
type storeRows struct{ s *store.Store }

func (r storeRows) Rows(ctx context.Context, ids []string) (map[string]gapfill.Row, error) {
	jobs, err := r.s.LoadJobs(ctx, ids)
	if err != nil {
		return nil, err
	}
	out := make(map[string]gapfill.Row, len(jobs))
	for id, j := range jobs {
		out[id] = rowOf(j)
	}
	return out, nil
}

// rowOf is a stored row, or a deleted job's tombstone, as the gap
// resolver sees it.
func rowOf(j store.Job) gapfill.Row {
	return gapfill.Row{Version: j.Version, State: j.State, EventID: j.EventID, LastOps: j.LastOps, Deleted: j.Deleted}
}

// storedJob is job id as the store holds it, with the given held deltas:
// its row or its tombstone from rows (as [Store.LoadJobs] returns them), or
// version 0 when it has neither. Its state is not checked to be JSON
// ([gapfill.Row.TrustedJob]): it is PostgreSQL's text of a jsonb value, and
// checking every row a batch reads was about 4% of the projector's CPU
// where most deltas meet a row not cached.
func storedJob(id string, rows map[string]store.Job, held map[int64]gapfill.Held) gapfill.Job {
	j, ok := rows[id]
	if !ok {
		return gapfill.Job{ID: id, Held: held}
	}
	return rowOf(j).TrustedJob(id, held)
}

// logReader re-reads the source's log for held jobs' missing versions
// ([source.Rereader]), and decodes what it finds.
type logReader struct{ r source.Rereader }

func (l *logReader) Reread(ctx context.Context, jobs []string, from time.Time) ([]gapfill.Input, error) {
	want := make(map[string]bool, len(jobs))
	for _, j := range jobs {
		want[j] = true
	}
	recs, err := l.r.Reread(ctx, want, from)
	now := time.Now()
	var found []gapfill.Input
	for _, m := range recs {
		if ev, err := event.Decode(m.Key, m.Value); err == nil && want[ev.JobID] {
			found = append(found, gapfill.Input{Event: ev, Partition: m.Coord.Partition, Offset: m.Coord.Offset, Source: gapfill.FromReread, At: now, LogTime: m.Time})
		}
	}
	return found, err
}

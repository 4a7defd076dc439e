package projection

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	kafkasrc "github.com/projector/projector/source/kafka"

	"github.com/projector/projector/event"
	"github.com/projector/projector/gapfill"
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
// version 0 when it has neither. It is the one conversion from a stored
// row to the gap detector's job.
func storedJob(id string, rows map[string]store.Job, held map[int64]gapfill.Held) (gapfill.Job, error) {
	j, ok := rows[id]
	if !ok {
		return gapfill.Job{ID: id, Held: held}, nil
	}
	job, err := rowOf(j).Job(id, held)
	if err != nil {
		return gapfill.Job{}, fmt.Errorf("projection: %w", err)
	}
	return job, nil
}

// logReader re-reads every partition of the topic, from an offset found by
// timestamp lookup up to the end seen when it starts, for the records of
// the held jobs: a repartition or a misrouted producer may have put the
// missing versions where this partition's worker never looks. One call
// serves every job due in the same round. It is bounded in bytes and time;
// the byte budget is shared fairly between the partitions that hold records
// in the window, so one long partition cannot use it all up, and a
// partition with no record at or after the start time is not read at all.
type logReader struct{ p *Projector }

func (l *logReader) Reread(ctx context.Context, jobs []string, from time.Time) ([]gapfill.Input, error) {
	cfg := l.p.cfg
	want := make(map[string]bool, len(jobs))
	for _, j := range jobs {
		want[j] = true
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.RereadMaxTime)
	defer cancel()
	parts, err := l.partitions(ctx)
	if err != nil {
		return nil, err
	}
	// First the ranges: which partitions hold anything in the window.
	type span struct {
		partition   int
		start, last int64
	}
	var spans []span
	var errs []error
	for _, part := range parts {
		start, last, err := l.bounds(ctx, part, from)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("partition %d: %w", part, err))
		case start >= 0 && start < last:
			spans = append(spans, span{part, start, last})
		}
	}
	var found []gapfill.Input
	budget := cfg.RereadMaxBytes
	cut := false
	for i, s := range spans {
		// An even share of what is left: what a short partition leaves
		// unused goes to the ones after it.
		share := budget / int64(len(spans)-i)
		ins, used, complete, err := l.scan(ctx, s.partition, s.start, s.last, want, share)
		found = append(found, ins...)
		budget -= used
		if err != nil {
			errs = append(errs, fmt.Errorf("partition %d: %w", s.partition, err))
		}
		if !complete && err == nil {
			cut = true
		}
	}
	if cut {
		errs = append(errs, fmt.Errorf("stopped after %d bytes (reread-max-bytes)", cfg.RereadMaxBytes))
	}
	return found, errors.Join(errs...)
}

// partitions lists the topic's partitions, asking each broker in turn.
func (l *logReader) partitions(ctx context.Context) ([]int, error) {
	cfg := l.p.cfg
	var errs []error
	for _, b := range cfg.Brokers {
		parts, err := l.p.dialer.LookupPartitions(ctx, "tcp", b, cfg.Topic)
		if err == nil {
			ids := make([]int, len(parts))
			for i, p := range parts {
				ids[i] = p.ID
			}
			slices.Sort(ids)
			return ids, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", b, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("list partitions of %s: %w", cfg.Topic, errors.Join(errs...))
}

// bounds returns the first offset at or after from and the partition's end
// for the projection's reader (its last stable offset reading committed);
// start is -1 when no record is at or after from.
func (l *logReader) bounds(ctx context.Context, partition int, from time.Time) (start, last int64, err error) {
	conn, err := kafkasrc.DialLog(ctx, l.p.dialer, l.p.cfg.Brokers, l.p.cfg.Topic, partition)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	first, last, err := conn.Bounds(l.p.cfg.Kafka().ReadsCommitted())
	if err != nil {
		return 0, 0, fmt.Errorf("offsets: %w", err)
	}
	start, err = conn.OffsetAt(from)
	if err != nil {
		return 0, 0, fmt.Errorf("offset for %s: %w", from.UTC().Format(time.RFC3339), err)
	}
	// -1: nothing at or after from. Check it before clamping to the log
	// start, or a quiet partition would be read from its beginning.
	if start < 0 {
		return -1, last, nil
	}
	return max(start, first), last, nil
}

// scan reads partition from start up to last (exclusive) or until budget
// bytes were read, straight from the leader's connection in fetches of up
// to 8 MiB, as the projection reads ([logFetch]: reading committed, no
// record of an aborted transaction); complete reports that it reached
// last. Each fetch goes on from where the one before ended, past markers,
// aborted transactions and records compacted away, never from the last
// record read: a fetch among the removed records of a cleaned batch finds
// no record.
func (l *logReader) scan(ctx context.Context, partition int, start, last int64, want map[string]bool, budget int64) (out []gapfill.Input, used int64, complete bool, err error) {
	cfg := l.p.cfg
	if budget <= 0 {
		return nil, 0, false, nil
	}
	conn, err := kafkasrc.DialLog(ctx, l.p.dialer, cfg.Brokers, cfg.Topic, partition)
	if err != nil {
		return nil, 0, false, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	committed := cfg.Kafka().ReadsCommitted()
	now := time.Now()
	next := start
	for next < last && used < budget {
		lf, err := conn.Fetch(next, int(max(min(budget-used, 8<<20), 1<<20)), 500*time.Millisecond, committed)
		if err != nil {
			return out, used, false, err
		}
		var rerr error
		for used < budget {
			m, ok, err := lf.Next()
			if err != nil || !ok {
				rerr = err
				break
			}
			if m.Coord.Offset >= last {
				break
			}
			used += int64(len(m.Key) + len(m.Value))
			if len(m.Key) == 0 || want[string(m.Key)] {
				if ev, err := event.Decode(m.Key, m.Value); err == nil && want[ev.JobID] {
					out = append(out, gapfill.Input{Event: ev, Partition: partition, Offset: m.Coord.Offset, Source: gapfill.FromReread, At: now, LogTime: m.Time})
				}
			}
		}
		moved := lf.After() > next
		next = max(next, lf.After())
		if cerr := lf.Close(); rerr == nil {
			rerr = cerr
		}
		switch {
		case rerr != nil:
			return out, used, false, rerr
		case !moved && ctx.Err() != nil:
			return out, used, false, ctx.Err()
		case !moved:
			return out, used, false, fmt.Errorf("nothing read at offset %d although the log ends at %d", next, last)
		}
	}
	return out, used, next >= last, nil
}

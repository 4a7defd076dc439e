package projection

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"

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

// bounds returns the first offset at or after from and the partition's end;
// start is -1 when no record is at or after from.
func (l *logReader) bounds(ctx context.Context, partition int, from time.Time) (start, last int64, err error) {
	conn, err := dialLeader(ctx, l.p.dialer, l.p.cfg.Brokers, l.p.cfg.Topic, partition)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	first, last, err := conn.ReadOffsets()
	if err != nil {
		return 0, 0, fmt.Errorf("offsets: %w", err)
	}
	start, err = conn.ReadOffset(from)
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

// dialLeader connects to the leader of partition, looking it up through
// each broker in turn.
func dialLeader(ctx context.Context, d *kafka.Dialer, brokers []string, topic string, partition int) (*kafka.Conn, error) {
	var errs []error
	for _, b := range brokers {
		conn, err := d.DialLeader(ctx, "tcp", b, topic, partition)
		if err == nil {
			return conn, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", b, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("dial the leader of %s/%d: %w", topic, partition, errors.Join(errs...))
}

// scan reads partition from start up to last (exclusive) or until budget
// bytes were read, straight from the leader's connection in fetches of up
// to 8 MiB; complete reports that it reached last. It goes on from where
// each fetch ended, past records compacted away, never from the last
// record read: a fetch among the removed records of a cleaned batch finds
// no record.
func (l *logReader) scan(ctx context.Context, partition int, start, last int64, want map[string]bool, budget int64) (out []gapfill.Input, used int64, complete bool, err error) {
	cfg := l.p.cfg
	if budget <= 0 {
		return nil, 0, false, nil
	}
	conn, err := dialLeader(ctx, l.p.dialer, cfg.Brokers, cfg.Topic, partition)
	if err != nil {
		return nil, 0, false, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	now := time.Now()
	next := start
	for next < last && used < budget {
		if _, err := conn.Seek(next, kafka.SeekAbsolute|kafka.SeekDontCheck); err != nil {
			return out, used, false, err
		}
		batch := conn.ReadBatchWith(kafka.ReadBatchConfig{
			MinBytes: 1, MaxBytes: int(max(min(budget-used, 8<<20), 1<<20)), MaxWait: 500 * time.Millisecond,
		})
		read := 0
		for next < last && used < budget {
			m, err := batch.ReadMessage()
			if err != nil {
				break
			}
			read++
			next = m.Offset + 1
			used += int64(len(m.Key) + len(m.Value))
			if len(m.Key) == 0 || want[string(m.Key)] {
				if ev, err := event.Decode(m.Key, m.Value); err == nil && want[ev.JobID] {
					out = append(out, gapfill.Input{Event: ev, Partition: partition, Offset: m.Offset, Source: gapfill.FromReread, At: now, LogTime: m.Time})
				}
			}
		}
		cerr := batch.Close()
		// Past the records compacted away at the end of what was read: a
		// cleaned batch keeps its offset range, and a fetch among its
		// removed records is answered with that batch alone.
		moved := batch.Offset() > next && next < last && used < budget
		if moved {
			next = batch.Offset()
		}
		if read == 0 && !moved {
			if cerr == nil {
				cerr = ctx.Err()
			}
			if cerr == nil {
				cerr = fmt.Errorf("no record at offset %d although the log ends at %d", next, last)
			}
			return out, used, false, cerr
		}
	}
	return out, used, next >= last, nil
}

package projection

import (
	"context"
	"fmt"
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

// jobOf is a stored row, or a deleted job's tombstone, as the gap
// detector's job with the given held deltas.
func jobOf(id string, j store.Job, held map[int64]gapfill.Held) (gapfill.Job, error) {
	job, err := rowOf(j).Job(id, held)
	if err != nil {
		return gapfill.Job{}, fmt.Errorf("projection: %w", err)
	}
	return job, nil
}

// logReader re-reads every partition of the topic, from an offset found by
// timestamp lookup up to the end seen when it starts, for the records of
// the held jobs: a repartition or a misrouted producer may have put the
// missing versions where this partition's worker never looks. It is bounded
// in bytes and time.
type logReader struct{ p *Projector }

func (l *logReader) Reread(ctx context.Context, jobs []string, from time.Time) ([]gapfill.Input, error) {
	cfg := l.p.cfg
	want := make(map[string]bool, len(jobs))
	for _, j := range jobs {
		want[j] = true
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.RereadMaxTime)
	defer cancel()
	parts, err := l.p.dialer.LookupPartitions(ctx, "tcp", cfg.Brokers[0], cfg.Topic)
	if err != nil {
		return nil, fmt.Errorf("list partitions of %s: %w", cfg.Topic, err)
	}
	var found []gapfill.Input
	budget := cfg.RereadMaxBytes
	for _, part := range parts {
		ins, used, err := l.scan(ctx, part.ID, from, want, budget)
		if err != nil {
			return found, fmt.Errorf("partition %d: %w", part.ID, err)
		}
		found = append(found, ins...)
		if budget -= used; budget <= 0 {
			return found, fmt.Errorf("stopped after %d bytes (reread-max-bytes)", cfg.RereadMaxBytes)
		}
	}
	return found, nil
}

func (l *logReader) scan(ctx context.Context, partition int, from time.Time, want map[string]bool, budget int64) ([]gapfill.Input, int64, error) {
	cfg := l.p.cfg
	conn, err := l.p.dialer.DialLeader(ctx, "tcp", cfg.Brokers[0], cfg.Topic, partition)
	if err != nil {
		return nil, 0, err
	}
	first, last, err := conn.ReadOffsets()
	start := int64(-1)
	if err == nil {
		start, err = conn.ReadOffset(from)
	}
	conn.Close()
	if err != nil {
		return nil, 0, fmt.Errorf("offsets: %w", err)
	}
	if start < first {
		start = first
	}
	if start < 0 || start >= last {
		return nil, 0, nil
	}
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: cfg.Brokers, Topic: cfg.Topic, Partition: partition,
		MinBytes: 1, MaxBytes: 8 << 20, MaxWait: 500 * time.Millisecond, Dialer: l.p.dialer,
	})
	defer r.Close()
	if err := r.SetOffset(start); err != nil {
		return nil, 0, err
	}
	var out []gapfill.Input
	var used int64
	now := time.Now()
	for used < budget {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return out, used, err
		}
		used += int64(len(m.Key) + len(m.Value))
		if len(m.Key) == 0 || want[string(m.Key)] {
			if ev, err := event.Decode(m.Key, m.Value); err == nil && want[ev.JobID] {
				out = append(out, gapfill.Input{Event: ev, Partition: partition, Offset: m.Offset, Source: gapfill.FromReread, At: now})
			}
		}
		if m.Offset >= last-1 {
			break
		}
	}
	return out, used, nil
}

package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/projector/projector/source"
)

// Rereader re-reads every partition of the topic, from an offset found by
// timestamp lookup up to the end seen when it starts, for the records of
// the held jobs: a repartition or a misrouted producer may have put the
// missing versions where this partition's worker never looks. One call
// serves every job due in the same round. It is bounded in bytes and time;
// the byte budget is shared fairly between the partitions that hold records
// in the window, so one long partition cannot use it all up, and a
// partition with no record at or after the start time is not read at all.
type Rereader struct {
	Dialer  *kafkago.Dialer
	Brokers []string
	Topic   string
	// ReadCommitted reads as the projection does.
	ReadCommitted bool
	// MaxBytes and MaxTime bound one re-read.
	MaxBytes int64
	MaxTime  time.Duration
}

// Reread returns the records whose key is in want, or that have no key
// (the engine decodes those to find their job), from every partition.
func (l *Rereader) Reread(ctx context.Context, want map[string]bool, from time.Time) ([]source.Record, error) {
	cfg := l
	ctx, cancel := context.WithTimeout(ctx, cfg.MaxTime)
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
	var found []source.Record
	budget := cfg.MaxBytes
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
		errs = append(errs, fmt.Errorf("stopped after %d bytes (reread-max-bytes)", cfg.MaxBytes))
	}
	return found, errors.Join(errs...)
}

// partitions lists the topic's partitions, asking each broker in turn.
func (l *Rereader) partitions(ctx context.Context) ([]int, error) {
	cfg := l
	var errs []error
	for _, b := range cfg.Brokers {
		parts, err := l.Dialer.LookupPartitions(ctx, "tcp", b, cfg.Topic)
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
func (l *Rereader) bounds(ctx context.Context, partition int, from time.Time) (start, last int64, err error) {
	conn, err := DialLog(ctx, l.Dialer, l.Brokers, l.Topic, partition)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	first, last, err := conn.Bounds(l.ReadCommitted)
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
// to 8 MiB, as the projection reads ([LogFetch]: reading committed, no
// record of an aborted transaction); complete reports that it reached
// last. Each fetch goes on from where the one before ended, past markers,
// aborted transactions and records compacted away, never from the last
// record read: a fetch among the removed records of a cleaned batch finds
// no record.
func (l *Rereader) scan(ctx context.Context, partition int, start, last int64, want map[string]bool, budget int64) (out []source.Record, used int64, complete bool, err error) {
	if budget <= 0 {
		return nil, 0, false, nil
	}
	conn, err := DialLog(ctx, l.Dialer, l.Brokers, l.Topic, partition)
	if err != nil {
		return nil, 0, false, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	committed := l.ReadCommitted
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
				out = append(out, m)
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

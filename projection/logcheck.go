package projection

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/projector/projector/store"
)

// A partition's stored position is only meaningful in the log it was read
// from. A topic deleted and recreated has a new log under the same name,
// whose offsets start again at 0: a stored position past its end used to
// be waited on until the new log grew past it, and the records before it
// were never read. Each batch stores its last record's offset and a hash
// of it ([store.LogMark]); a claim, and a position found past the log's
// end while reading, compare the log with it. A log that holds another
// record at that offset, or ends before the position while the record it
// holds at the mark is not the one read (or is gone), is a new log: it is
// read from its start, which the version rules make safe (what was
// applied before comes back as duplicate or stale). A log that still holds
// the marked record and ends before the position was truncated (an
// unclean leader election): it is read on from its end.

// recordHash is what a [store.LogMark] keeps of a record: its key, value
// and timestamp, which a log never changes at an offset.
func recordHash(key, value []byte, t time.Time) int64 {
	h := fnv.New64a()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(key)))
	h.Write(n[:])
	h.Write(key)
	h.Write(value)
	binary.BigEndian.PutUint64(n[:], uint64(t.UnixMilli()))
	h.Write(n[:])
	return int64(h.Sum64())
}

// logMark is the mark of the last Kafka record of recs; nil when there is
// none (an SQS batch, or no records).
func logMark(recs []Record) *store.LogMark {
	if len(recs) == 0 || recs[len(recs)-1].Coord.MessageID != "" {
		return nil
	}
	r := recs[len(recs)-1]
	return &store.LogMark{Offset: r.Coord.Offset, Hash: recordHash(r.Key, r.Value, r.Time)}
}

// logVerdict is what [worker.compareLog] found.
type logVerdict struct {
	// newLog says the log is not the one the position was read from;
	// why says how that was told.
	newLog bool
	why    string
	// next is where reading goes on: the new log's start, or the end of
	// a truncated one; -1 to keep the position.
	next int64
}

// compareLog compares the partition's log with the stored position and
// mark.
func (w *worker) compareLog(ctx context.Context, position int64, mark *store.LogMark) (logVerdict, error) {
	keep := logVerdict{next: -1}
	if position < 0 {
		return keep, nil
	}
	first, end, err := w.lane.Bounds(ctx)
	if err != nil {
		return keep, err
	}
	marked := "not recorded"
	if mark != nil && mark.Offset >= first && mark.Offset < end {
		m, err := w.lane.RecordAt(ctx, mark.Offset)
		switch {
		case err != nil:
			return keep, err
		case m.Coord.Offset != mark.Offset:
			// Compacted away: nothing to compare.
			marked = "compacted away"
		case recordHash(m.Key, m.Value, m.Time) != mark.Hash:
			return logVerdict{newLog: true, next: first,
				why: fmt.Sprintf("the record at offset %d is not the one read there", mark.Offset)}, nil
		default:
			marked = "the same"
		}
	} else if mark != nil {
		marked = "outside the log"
	}
	if position <= end {
		return keep, nil
	}
	if marked == "the same" {
		// The log was truncated past the position: what it holds up to
		// the mark is what was read; it goes on from its end.
		return logVerdict{next: end, why: fmt.Sprintf("the log ends at %d, before the stored position %d, and still holds the record last read at %d: truncated", end, position, mark.Offset)}, nil
	}
	return logVerdict{newLog: true, next: first,
		why: fmt.Sprintf("the stored position %d is past the log's end %d (the record last read: %s)", position, end, marked)}, nil
}

// checkLog compares the log with the claim's position and mark before the
// partition is read, and moves the position as [worker.compareLog] says.
// The log that cannot be read now is checked again by the source, which
// reports a position past its end.
func (w *worker) checkLog(ctx context.Context, claim store.Claim) (store.Claim, error) {
	v, err := w.compareLog(ctx, claim.NextOffset, claim.Last)
	if err != nil {
		w.log.Warn("could not compare the partition's log with its stored position; reading on", "err", err)
		return claim, nil
	}
	if v.next < 0 {
		return claim, nil
	}
	next, err := w.moveToLog(ctx, claim.NextOffset, v)
	if err != nil {
		return claim, err
	}
	claim.NextOffset, claim.Last = next, nil
	return claim, nil
}

// newLogAt is the source's: the position is past the log's end while
// reading.
func (w *worker) newLogAt(ctx context.Context, position int64) (int64, error) {
	v, err := w.compareLog(ctx, position, w.last)
	if err != nil {
		return -1, err
	}
	if v.next < 0 {
		return position, nil
	}
	return w.moveToLog(ctx, position, v)
}

// moveToLog stores the position v says, under the partition's fence,
// and says so.
func (w *worker) moveToLog(ctx context.Context, position int64, v logVerdict) (int64, error) {
	var resets int
	err := w.retryDatabase(ctx, func() error {
		var err error
		resets, err = w.store.MoveToLog(ctx, w.topic, w.partition, w.epoch, v.next, v.newLog)
		if errors.Is(err, store.ErrFenced) {
			return backoff.Permanent(err)
		}
		return err
	})
	if err != nil {
		return -1, err
	}
	if !v.newLog {
		w.log.Error("the partition's log ends before the stored position but still holds the records read: it was truncated (an unclean leader election?); reading on from its end",
			"stored_position", position, "log_end", v.next, "why", v.why)
		w.storedAt(v.next)
		return v.next, nil
	}
	w.counters.newLogs.Add(1)
	w.log.Error("the partition's log is not the one its position was read from (was the topic deleted and recreated?): reading the new log from its start, so none of its records is skipped; what was applied before comes back as duplicate or stale. `projector reset-positions` chooses otherwise",
		"why", v.why, "stored_position", position, "new_position", v.next, "new_logs", resets)
	w.storedAt(v.next)
	w.last = nil
	return v.next, nil
}

package projection

import (
	"context"
	"time"

	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/source/sqs/sqscfg"
	"github.com/projector/projector/store"
)

// heldAdoptEvery is how often a queue worker compares the held deltas it
// knows with the queue's: other instances on the queue hold deltas too,
// and release them.
const heldAdoptEvery = 30 * time.Second

// adoptHeld brings the worker's held deltas in line with the queue's
// stored ones. It takes on those it does not hold yet, held by another
// instance (alive or gone), so their gaps run here too; two instances
// resolving one gap is safe, the conditional writes and the release by key
// decide. And it reads again the jobs of held deltas it knows that are
// stored no more: another instance released them (applied or covered),
// and this worker's view of those jobs, their rows and their gaps, is out
// of date.
func (w *worker) adoptHeld(ctx context.Context) error {
	held, err := w.store.LoadHeldIndex(ctx, w.topic, w.partition)
	if err != nil {
		return err
	}
	stored := make(map[store.HeldKey]bool, len(held))
	for _, h := range held {
		stored[store.HeldKey{JobID: h.JobID, Version: h.Version}] = true
	}
	var gone []string
	reread := map[string]bool{}
	for _, g := range w.detector.Gaps() {
		j, ok := w.cache.peek(g.JobID)
		if !ok {
			continue
		}
		for v := range j.Held {
			if !stored[store.HeldKey{JobID: g.JobID, Version: v}] {
				gone = append(gone, g.JobID)
				reread[g.JobID] = true
				break
			}
		}
	}
	var fresh []store.Held
	jobs := map[string]bool{}
	peeked := map[string]gapfill.Job{}
	for _, h := range held {
		if reread[h.JobID] {
			continue // read again whole below
		}
		j, ok := peeked[h.JobID]
		if !ok {
			j, _ = w.cache.peek(h.JobID)
			peeked[h.JobID] = j
		}
		if _, known := j.Held[h.Version]; known {
			continue
		}
		fresh = append(fresh, h)
		jobs[h.JobID] = true
	}
	if len(gone) > 0 {
		w.log.Info("held deltas this instance knew were released by another instance; reading their jobs again", "jobs", len(gone), "first", gone[0])
		if _, err := w.resync(ctx, gone); err != nil {
			return err
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	w.log.Info("adopting held deltas of the queue that other instances held", "deltas", len(fresh), "jobs", len(jobs))
	// A job cached without held deltas may be cached at an older row:
	// its row is read with the held deltas instead.
	for id := range jobs {
		w.cache.forget(id)
	}
	// fresh is ordered by job, as restoreChunk wants it.
	return w.restoreChunk(ctx, fresh)
}

// SQSStatus is an SQS-fed engine's view of its queue, in /status
// ([sqscfg.Status]).
type SQSStatus = sqscfg.Status

// sqsCoordinate is the SQS message c names, for a held or quarantine row; zero for
// a Kafka record.
func sqsCoordinate(c Coord) store.Coordinate {
	return store.Coordinate{MessageID: c.MessageID, SequenceNumber: c.Sequence}
}

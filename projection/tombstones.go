package projection

import (
	"context"
	"time"
)

// pruneBatch bounds one prune statement, so pruning never holds many rows
// or a long transaction.
const pruneBatch = 1000

// pruneInterval is how often tombstones past retention are looked for:
// often enough that a tombstone outlives its retention by little, never
// more than once a minute.
func pruneInterval(retention time.Duration) time.Duration {
	return min(max(retention/4, 10*time.Millisecond), time.Minute)
}

// pruneTombstones deletes, in small batches and until ctx ends, the
// tombstones older than the retention. Every instance prunes; they delete
// disjoint rows (each passes over the rows another has locked).
func (p *Projector) pruneTombstones(ctx context.Context) {
	retention := p.cfg.TombstoneRetention
	if p.cfg.TombstonesForever || retention <= 0 {
		return
	}
	t := time.NewTicker(pruneInterval(retention))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cutoff := time.Now().Add(-retention)
		var total int64
		for ctx.Err() == nil {
			n, err := p.cfg.Store.PruneTombstones(ctx, cutoff, pruneBatch)
			if err != nil {
				if ctx.Err() == nil {
					p.cfg.Logger.Warn("pruning tombstones failed; trying again later", "err", err)
				}
				break
			}
			total += n
			p.counters.pruned.Add(n)
			if n < pruneBatch {
				break
			}
		}
		if total > 0 {
			p.cfg.Logger.Info("tombstones pruned: events at or below those deletes' versions can create their jobs again",
				"pruned", total, "deleted_before", cutoff.UTC().Format(time.RFC3339), "retention", retention)
		}
	}
}

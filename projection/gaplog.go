package projection

import (
	"context"
	"time"
)

// gapLogPruneBatch bounds the rows one prune statement deletes.
const gapLogPruneBatch = 500

// pruneGapLog keeps the gap log within GapLogRetention and GapLogMaxRows
// until ctx ends, pruning in small batches. Every instance prunes; a row
// deleted twice is deleted once.
func (p *Projector) pruneGapLog(ctx context.Context) {
	cfg := p.cfg
	every := max(time.Second, min(time.Minute, cfg.GapLogRetention/10))
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		n, err := cfg.Store.PruneGapLog(ctx, cfg.GapLogRetention, cfg.GapLogMaxRows, gapLogPruneBatch)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			cfg.Logger.Warn("pruning the gap log failed; trying again later", "err", err)
		case n > 0:
			cfg.Logger.Debug("gap log pruned", "rows", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

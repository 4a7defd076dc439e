package jobgen

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/delta"
)

// TestFoldIsDeltaApply: the few-word state a record is made from is, at
// every version of every job, what the delta package folds from the
// versions' ops; its jsonb text hashes as StateHash does; and every mix
// and padding yields ops the delta package accepts.
func TestFoldIsDeltaApply(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]Config{
		"mixed":     {Seed: 11, Jobs: 300, EventsPerJob: 12, DeleteRate: 0.3},
		"deltas":    {Seed: 12, Jobs: 200, EventsPerJob: 12, DeltasOnly: true},
		"snapshots": {Seed: 13, Jobs: 200, EventsPerJob: 12, SnapshotsOnly: true},
		"padded":    {Seed: 14, Jobs: 100, EventsPerJob: 6, StateBytes: 700},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			g := newGen(cfg.WithDefaults())
			var j job
			folds, kinds := 0, map[int]int{}
			for i := range g.cfg.Jobs {
				g.makeJob(i, &j)
				state := map[string]any{}
				for v := 1; v <= j.last(); v++ {
					kinds[g.kind(&j, v)]++
					switch {
					case v == j.n+1:
						continue // a delete: no state
					case v == j.n+2:
						state = map[string]any{}
						s := g.stateAt(&j, v)
						raw := g.appendState(nil, &j, &s, false)
						require.Contains(t, string(raw), `"recreated":true`)
						continue
					}
					ops, err := delta.ParseOps(g.appendOps(nil, &j, v))
					require.NoError(t, err, "%s v%d", j.id, v)
					state, err = delta.Apply(state, ops)
					require.NoError(t, err, "%s v%d", j.id, v)
					want, err := delta.EncodeState(state)
					require.NoError(t, err)
					s := g.stateAt(&j, v)
					got := g.appendState(nil, &j, &s, false)
					require.True(t, delta.SameState(want, got), "%s v%d: folded %s, made %s", j.id, v, want, got)
					h, err := StateHash(got)
					require.NoError(t, err)
					h2, _ := g.stateHash(&j, &s, nil)
					require.Equal(t, h, h2, "%s v%d: the jsonb text hashes as StateHash", j.id, v)
					folds++
				}
			}
			t.Logf("%d versions folded; kinds %v", folds, kinds)
			require.Positive(t, folds)
		})
	}
}

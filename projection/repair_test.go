package projection

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A row rewritten at its own version while the engine runs (verify
// --repair of a "differs" drift) leaves the version where it was: the
// engine, which cached the old state, must not build the next delta on
// it. Its update is conditioned on the event id it computed from, misses
// the repaired row, reloads it, and applies the delta to the repair.
func TestDeltaAfterASameVersionRepairBuildsOnTheRepair(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	r.produce(rec{0, "j", snap("j", 1, `{"n":1}`)})
	run := r.start(r.config())
	r.caughtUp(20*time.Second, run)

	applied, before, err := r.store.Heal(context.Background(), "j", 1, json.RawMessage(`{"n":100}`), "authority-1", false)
	require.NoError(t, err)
	require.True(t, applied)
	require.Equal(t, int64(1), before)

	r.produce(rec{0, "j", dlt("j", 2, `[{"op":"increment","path":"/n","by":5}]`)})
	r.caughtUp(20*time.Second, run)
	row := r.rows()["j"]
	require.Equal(t, int64(2), row.Version)
	require.JSONEq(t, `{"n":105}`, string(row.State), "the delta is applied to the repaired state, not the cached one")
}

package gapfill_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/gapfill"
)

// TestRereadWindowStartsAtTheBrokerTimestamp: a delta appended an hour
// before the projector held it (a catch-up on a backlog) is looked for
// from --reread-window before its broker timestamp, not before the hold;
// a delta without a timestamp falls back to when it was held. One pass
// serves every job of the round.
func TestRereadWindowStartsAtTheBrokerTimestamp(t *testing.T) {
	old := heldJob(t, "old", 1, 3)
	h := old.Held[3]
	h.LogTime = h.Since.Add(-time.Hour)
	old.Held[3] = h
	fresh := heldJob(t, "fresh", 1, 3)

	log := &fakeLog{}
	r := &gapfill.Resolver{Log: log, Window: 10 * time.Minute}
	r.Resolve(t.Context(), []gapfill.Step{gapfill.StepReread}, []gapfill.Job{old, fresh}, rt0.Add(time.Hour))
	require.Len(t, log.calls, 1, "one pass for the whole round")
	require.ElementsMatch(t, []string{"old", "fresh"}, log.calls[0].jobs)
	require.Equal(t, h.LogTime.Add(-10*time.Minute), log.calls[0].from)

	log = &fakeLog{}
	r.Log = log
	r.Resolve(t.Context(), []gapfill.Step{gapfill.StepReread}, []gapfill.Job{fresh}, rt0.Add(time.Hour))
	require.Equal(t, fresh.Held[3].Since.Add(-10*time.Minute), log.calls[0].from)
}

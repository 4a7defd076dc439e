package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Two `run`s projecting different tables with one explicit group: the
// second is refused with exit 2, naming both projections, and the first
// goes on to project every job.
func TestRunRefusesAGroupAnotherProjectionWorks(t *testing.T) {
	t.Parallel()
	s := newStory(t, 4)
	s.jobs("task", 40, 1, 1)
	a := startBin(t, "run jobs", dbEnv(), s.runArgs("g-shared", "inst-a")...)
	s.caughtUp(joinWithin, a)

	b := startBin(t, "run jobs_b", dbEnv(), append(s.runArgs("g-shared", "inst-b"), "--table", "jobs_b")...)
	select {
	case <-b.done:
	case <-time.After(2 * joinWithin):
		t.Fatal("the second projection was not refused")
	}
	require.Equal(t, exitUsage, b.code, b.logs.String())
	msg := b.logs.String()
	require.Contains(t, msg, `consumer group "g-shared" is used by another projection`)
	require.Contains(t, msg, s.schema+".jobs)")
	require.Contains(t, msg, s.schema+".jobs_b")
	require.True(t, strings.Contains(msg, "--group"), "it says what to change")

	s.jobs("task", 40, 2, 2)
	s.caughtUp(joinWithin, a)
	a.requireAlive()
	s.requireModel()
	a.stop(stopWithin)
}

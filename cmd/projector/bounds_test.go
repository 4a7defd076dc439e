package main

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRunStatementTimeoutFlag: --statement-timeout is the bound PostgreSQL
// applies to each statement of a batch transaction. A batch whose
// statement waits past it is cancelled, the instance says which flag to
// raise, and retries; once the wait ends the batch lands.
func TestRunStatementTimeoutFlag(t *testing.T) {
	t.Parallel()
	s := newStory(t, 1)
	s.produce(rec(0, "slow", snapshotValue("slow", 1, map[string]any{"status": "queued"})))
	a := startBin(t, "run", dbEnv(), s.runArgs("g-stmt", "inst-a", "--statement-timeout", "300ms")...)
	s.waitRow(joinWithin, "slow", 1, `{"status":"queued"}`, a)

	// Hold the job's row: the next batch's write waits for it, longer
	// than the statement timeout.
	release := s.lockRow("slow")
	s.produce(rec(0, "slow", snapshotValue("slow", 2, map[string]any{"status": "running"})))
	eventually(t, joinWithin, "the batch's statement is cancelled at the statement timeout", func() (bool, string) {
		a.requireAlive()
		return a.logged("ran past the statement timeout", map[string]string{"statement_timeout": "300ms"}), "no such log line yet"
	})
	release()
	s.waitRow(joinWithin, "slow", 2, `{"status":"running"}`, a)
	a.stop(stopWithin)
	require.Zero(t, s.quarantineCount(), "a statement timeout is not the record's fault")
}

// TestRunBoundsFromVariables: the bounds are read from their PROJECTOR_
// variables too; the claim lock timeout shows in the first wait it logs
// (see TestRunFrozenOwnerIsTakenOver), the statement timeout here.
func TestRunBoundsFromVariables(t *testing.T) {
	t.Parallel()
	s := newStory(t, 1)
	s.produce(rec(0, "slow", snapshotValue("slow", 1, map[string]any{"status": "queued"})))
	a := startBin(t, "run", dbEnv("PROJECTOR_STATEMENT_TIMEOUT=250ms", "PROJECTOR_IDLE_IN_TRANSACTION_TIMEOUT=5s", "PROJECTOR_CLAIM_LOCK_TIMEOUT=1s"),
		s.runArgs("g-stmt-env", "inst-a")...)
	s.waitRow(joinWithin, "slow", 1, `{"status":"queued"}`, a)
	release := s.lockRow("slow")
	s.produce(rec(0, "slow", snapshotValue("slow", 2, map[string]any{"status": "running"})))
	eventually(t, joinWithin, "the batch's statement is cancelled at the statement timeout", func() (bool, string) {
		a.requireAlive()
		return a.logged("ran past the statement timeout", map[string]string{"statement_timeout": "250ms"}), fmt.Sprint("no such log line yet")
	})
	release()
	s.waitRow(joinWithin, "slow", 2, `{"status":"running"}`, a)
	a.stop(stopWithin)
}

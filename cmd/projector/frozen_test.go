package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// groupTiming are consumer group timings short enough for a test: a
// stopped process loses its partitions after 2s.
var groupTiming = []string{"--group-session-timeout", "2s", "--group-heartbeat-interval", "200ms",
	"--group-rebalance-timeout", "2s", "--group-join-backoff", "100ms"}

// logged reports whether p logged a JSON line with msg containing the
// text and every attribute given.
func (p *proc) logged(msg string, attrs map[string]string) bool {
	for _, line := range p.logs.lines() {
		var l map[string]any
		if json.Unmarshal([]byte(line), &l) != nil {
			continue
		}
		m, _ := l["msg"].(string)
		if !strings.Contains(m, msg) {
			continue
		}
		ok := true
		for k, v := range attrs {
			if fmt.Sprint(l[k]) != v {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// allThreadsStopped reports whether every thread of p is stopped (state T
// in /proc/<pid>/task/<tid>/stat).
func allThreadsStopped(p *proc) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", p.cmd.Process.Pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", p.cmd.Process.Pid, task.Name()))
		if err != nil {
			return false
		}
		// pid (comm) state ...: the state follows the last parenthesis.
		i := strings.LastIndexByte(string(b), ')')
		if i <= 0 || len(b) <= i+2 || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

// TestRunFrozenOwnerIsTakenOver: an instance frozen (SIGSTOP) inside an
// open batch transaction, after its fence locked the partition's row. The
// group moves the partition to another instance after the session
// timeout; its claim waits for the frozen transaction, saying so, until
// PostgreSQL ends that transaction (idle in transaction for 10s); then it
// projects the partition. The frozen instance, thawed, writes nothing:
// its batch is fenced or abandoned.
func TestRunFrozenOwnerIsTakenOver(t *testing.T) {
	t.Parallel()
	s := newStory(t, 1)
	s.produce(rec(0, "frozen", snapshotValue("frozen", 1, map[string]any{"status": "queued"})))
	a := startBin(t, "run a", dbEnv(), s.runArgs("g-frozen", "inst-a", groupTiming...)...)
	s.waitRow(joinWithin, "frozen", 1, `{"status":"queued"}`, a)

	// Hold the job's row so a's next batch stops inside its transaction,
	// after the fence, waiting for this lock.
	release := s.holdRow(a, "frozen", rec(0, "frozen", snapshotValue("frozen", 2, map[string]any{"status": "running"})))
	defer release()
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) }) // so the cleanup's kill ends it
	// The signal is sent, not yet taken: released before every thread of a
	// has stopped, a could still finish its batch (a CI run saw it commit).
	eventually(t, 10*time.Second, "every thread of a stopped", func() (bool, string) {
		return allThreadsStopped(a), "running"
	})
	release()
	frozenAt := time.Now()

	b := startBin(t, "run b", dbEnv("PROJECTOR_CLAIM_LOCK_TIMEOUT=300ms"), s.runArgs("g-frozen", "inst-b", groupTiming...)...)
	s.waitRow(40*time.Second, "frozen", 2, `{"status":"running"}`, b)
	t.Logf("b projected the partition %s after a froze", time.Since(frozenAt).Round(100*time.Millisecond))
	require.True(t, b.logged("claim waits for the previous owner's open batch transaction", map[string]string{"previous_owner": "inst-a", "waited": "300ms"}),
		"b says why its claim waited, naming the frozen owner, after one claim lock timeout (PROJECTOR_CLAIM_LOCK_TIMEOUT)\n%s", b.logs.String())
	// The wait is said once when it starts (then every 30s while it
	// lasts), not at every retry of the claim.
	require.Equal(t, 1, strings.Count(b.logs.String(), "claim waits for the previous owner's open batch transaction"), "%s", b.logs.String())
	require.True(t, b.logged("claimed after waiting for the previous owner's transaction", nil), "%s", b.logs.String())
	ctxPos, cancel := s.ctx()
	defer cancel()
	pos, err := s.st.Positions(ctxPos)
	require.NoError(t, err)
	require.Len(t, pos, 1)
	require.Equal(t, "inst-b", pos[0].Owner)
	require.Equal(t, int64(2), pos[0].NextOffset)

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	eventually(t, joinWithin, "the thawed instance drops its batch", func() (bool, string) {
		a.requireAlive()
		return a.logged("fenced", nil) || a.logged("batch abandoned", nil), "no fenced or abandoned line yet"
	})
	require.Contains(t, a.logs.String(), "idle-in-transaction timeout", "PostgreSQL ended the frozen transaction")
	s.produce(rec(0, "frozen", snapshotValue("frozen", 3, map[string]any{"status": "completed"})))
	s.waitRow(joinWithin, "frozen", 3, `{"status":"completed"}`, a, b)
	a.stop(stopWithin)
	b.stop(stopWithin)
	require.Zero(t, s.quarantineCount())
}

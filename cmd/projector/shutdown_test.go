package main

import (
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

// groupOffsets reads the offsets consumer group has committed for the
// story's topic, as kafka-consumer-groups --describe would; a partition
// without one is missing from the map.
func (s *story) groupOffsets(group string) map[int]int64 {
	s.t.Helper()
	ctx, cancel := s.ctx()
	defer cancel()
	parts := make([]int, s.partitions)
	for i := range parts {
		parts[i] = i
	}
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	cl := &kafka.Client{Addr: kafka.TCP(s.kafka.Addrs()...), Transport: tr}
	resp, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{s.topic: parts}})
	require.NoError(s.t, err)
	require.NoError(s.t, resp.Error)
	out := map[int]int64{}
	for _, p := range resp.Topics[s.topic] {
		require.NoError(s.t, p.Error)
		if p.CommittedOffset >= 0 {
			out[p.Partition] = p.CommittedOffset
		}
	}
	return out
}

// TestRunSIGTERMCommitsTheStoredPositionsToTheGroup: SIGTERM arrives
// while a batch waits inside its transaction; the batch commits within the
// shutdown grace, the process exits 0, and the consumer group's committed
// offsets are then exactly the positions stored in PostgreSQL, the last
// batch's included, so lag tools show no stale lag after a stop.
func TestRunSIGTERMCommitsTheStoredPositionsToTheGroup(t *testing.T) {
	t.Parallel()
	s := newStory(t, 2)
	s.jobs("stop", 20, 1, 3)
	a := startBin(t, "run", dbEnv(), s.runArgs("g-sigterm", "inst-a")...)
	addr := a.httpAddr(15 * time.Second)
	s.caughtUp(joinWithin, a)

	// Hold a job's row so the next batch of its partition stops inside
	// its transaction.
	release := s.holdRow(a, "stop-0", rec(0, "stop-0", snapshotValue("stop-0", 9, map[string]any{"status": "stopped"})))
	defer release()

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGTERM))
	// Let the batch go once the instance has left its generation: its
	// commit then lands in the shutdown grace, after the group's last
	// regular commit.
	eventually(t, 20*time.Second, "the instance leaves the group (/readyz not 200)", func() (bool, string) {
		code, body, err := get(addr, "/readyz")
		return err != nil || code != http.StatusOK, fmt.Sprintf("%d %s", code, body)
	})
	release()
	select {
	case <-a.done:
	case <-time.After(stopWithin):
		t.Fatalf("no exit within %s of SIGTERM\n%s", stopWithin, a.logs.String())
	}
	require.Equal(t, 0, a.code, "exit code after SIGTERM\n%s", a.logs.String())

	s.requirePositionsAtEnd()
	stored, err := s.positions()
	require.NoError(t, err)
	require.Equal(t, stored, s.groupOffsets("g-sigterm"), "the group's committed offsets are the positions stored in PostgreSQL")
	row, ok := s.rowOf("stop-0")
	require.True(t, ok)
	require.Equal(t, int64(9), row.Version, "the batch held at SIGTERM was committed in the shutdown grace")
}

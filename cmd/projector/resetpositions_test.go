package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// reset-positions moves positions as the operator chose, says what each
// move skips or reads again, and fences the instance working the
// partition, which goes on from the new position.
func TestResetPositions(t *testing.T) {
	t.Parallel()
	s := newStory(t, 2)
	s.jobs("task", 20, 1, 1) // 10 records per partition
	s.runToEnd("g-reset")

	args := []string{"reset-positions", "--brokers", s.brokers(), "--topic", s.topic, "--schema", s.schema}
	res := runBin(t, 30*time.Second, dbEnv(), append(args, "--to", "earliest", "--partitions", "1")...)
	require.Equal(t, 0, res.code, res.String())
	require.Contains(t, res.stdout, "partition 1: 10 -> 0: offsets 0 to 9 read again")
	require.NotContains(t, res.stdout, "partition 0")
	pos, err := s.positions()
	require.NoError(t, err)
	require.Equal(t, map[int]int64{0: 10, 1: 0}, pos)

	s.jobs("task", 20, 2, 2) // 10 more per partition, to skip
	res = runBin(t, 30*time.Second, dbEnv(), append(args, "--to", "latest")...)
	require.Equal(t, 0, res.code, res.String())
	require.Contains(t, res.stdout, "partition 0: 10 -> 20: offsets 10 to 19 skipped (10 records)")
	require.Contains(t, res.stdout, "partition 1: 0 -> 20: offsets 0 to 19 skipped (20 records)")
	pos, err = s.positions()
	require.NoError(t, err)
	require.Equal(t, map[int]int64{0: 20, 1: 20}, pos)

	for _, bad := range [][]string{{"--to", "middle"}, {"--to", "latest", "--partitions", "x"}, {"--to", "latest", "--partitions", "7"}} {
		res = runBin(t, 30*time.Second, dbEnv(), append(args, bad...)...)
		require.Equal(t, exitUsage, res.code, res.String())
	}
}

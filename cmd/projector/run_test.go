package main

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Joining a consumer group with the production timings (1s heartbeat, 10s
// session and 30s rebalance timeouts) takes a few seconds; the deadlines are
// generous so a loaded machine does not fail the tests.
const (
	joinWithin = 30 * time.Second
	stopWithin = 30 * time.Second
)

// TestRun runs the daemon end to end on a 3-partition topic with the seed
// story, sixty jobs of snapshots and deltas (duplicates and stale replays
// included) and bad records: the read model ends exact, the HTTP endpoints
// answer, SIGTERM exits 0 with the positions at the high watermarks.
func TestRun(t *testing.T) {
	t.Parallel()
	s := newStory(t, 3)
	s.seedStory(false)
	s.jobs("task", 60, 1, 5)
	s.deletes(3)
	s.badRecords()

	p := startBin(t, "run", dbEnv(), s.runArgs("g-run", "inst-a")...)
	addr := p.httpAddr(15 * time.Second)

	code, body, err := get(addr, "/healthz")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "/healthz: %s", body)

	eventually(t, joinWithin, "/readyz answers 200", func() (bool, string) {
		p.requireAlive()
		code, body, err := get(addr, "/readyz")
		return err == nil && code == http.StatusOK, fmt.Sprintf("%d %s %v", code, body, err)
	})

	s.caughtUp(joinWithin, p)
	s.requireModel()
	s.requirePositionsAtEnd()

	// The seed story's late v1 arrives after v2 was applied: stale.
	s.seedStory(true)
	s.caughtUp(joinWithin, p)
	s.requireModel()

	// /status reports the partitions at the end and every outcome; the
	// in-memory position is published after the batch's counters settle.
	hw := s.highWatermarks()
	var st *liveStatus
	eventually(t, 15*time.Second, "/status shows every partition at its end", func() (bool, string) {
		p.requireAlive()
		st, err = fetchStatus(addr)
		if err != nil {
			return false, err.Error()
		}
		if len(st.Partitions) != len(hw) {
			return false, fmt.Sprintf("%+v", st.Partitions)
		}
		for _, ps := range st.Partitions {
			if ps.Position != hw[ps.Partition] {
				return false, fmt.Sprintf("%+v", st.Partitions)
			}
		}
		return true, ""
	})
	require.True(t, st.Ready)
	require.Equal(t, s.topic, st.Topic)
	require.Equal(t, "g-run", st.Group)
	require.Equal(t, "inst-a", st.Owner)
	require.Equal(t, []int{0, 1, 2}, sortedInts(st.owned()))
	for _, ps := range st.Partitions {
		require.Zero(t, ps.Lag, "partition %d", ps.Partition)
		require.Positive(t, ps.Epoch, "partition %d", ps.Partition)
	}
	c := st.Counters
	require.Equal(t, s.produced, c.Consumed, "%+v", c)
	require.Equal(t, s.quarantined, c.Quarantined, "%+v", c)
	require.Equal(t, s.stale, c.Stale, "%+v", c)
	require.Equal(t, s.duplicates, c.Duplicates, "%+v", c)
	require.Equal(t, s.deleted, c.Deleted, "%+v", c)
	require.Equal(t, s.produced-s.quarantined-s.stale-s.duplicates-s.deleted, c.Applied, "%+v", c)
	require.Zero(t, c.Conflicts+c.Held+c.HeldJobs+c.Fenced, "%+v", c)
	require.Equal(t, int(s.quarantined), s.quarantineCount())

	code, body, err = get(addr, "/metrics")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	metrics := string(body)
	for _, m := range []string{
		fmt.Sprintf(`projector_records_total{outcome="applied"} %d`, c.Applied),
		fmt.Sprintf(`projector_records_total{outcome="stale"} %d`, c.Stale),
		fmt.Sprintf(`projector_records_total{outcome="quarantined"} %d`, c.Quarantined),
		"# TYPE projector_records_total counter",
		`projector_partition_lag{partition="0"} 0`,
		"# TYPE projector_batch_duration_seconds histogram",
		"projector_build_info{",
		"go_goroutines ",
		"process_resident_memory_bytes ",
	} {
		require.Contains(t, metrics, m)
	}

	p.stop(stopWithin)
	s.requirePositionsAtEnd()
	s.requireModel()
	require.Empty(t, p.out.String(), "run logs to stderr; stdout stays empty")
	require.Contains(t, p.logs.String(), `"msg":"projector stopped"`)
}

// TestRunTwoInstancesShareAndHandOver runs two instances in one group on a
// 6-partition topic: they split the partitions, and when one gets SIGTERM
// the other takes them all; the read model ends exact.
func TestRunTwoInstancesShareAndHandOver(t *testing.T) {
	t.Parallel()
	s := newStory(t, 6)
	s.jobs("task", 120, 1, 2)

	a := startBin(t, "run a", dbEnv(), s.runArgs("g-two", "inst-a")...)
	b := startBin(t, "run b", dbEnv(), s.runArgs("g-two", "inst-b")...)
	addrA, addrB := a.httpAddr(15*time.Second), b.httpAddr(15*time.Second)

	eventually(t, 2*joinWithin, "the instances split the 6 partitions", func() (bool, string) {
		a.requireAlive()
		b.requireAlive()
		sa, err := fetchStatus(addrA)
		if err != nil {
			return false, err.Error()
		}
		sb, err := fetchStatus(addrB)
		if err != nil {
			return false, err.Error()
		}
		pa, pb := sa.owned(), sb.owned()
		both := sortedInts(append(slices.Clone(pa), pb...))
		msg := fmt.Sprintf("a owns %v, b owns %v", pa, pb)
		// 0..5 with no repeats: every partition has exactly one owner.
		return len(pa) > 0 && len(pb) > 0 && slices.Equal(both, []int{0, 1, 2, 3, 4, 5}), msg
	})

	s.jobs("task", 120, 3, 4) // while both run
	s.caughtUp(joinWithin, a, b)

	a.stop(stopWithin)
	eventually(t, 2*joinWithin, "b takes all 6 partitions", func() (bool, string) {
		b.requireAlive()
		sb, err := fetchStatus(addrB)
		if err != nil {
			return false, err.Error()
		}
		return slices.Equal(sortedInts(sb.owned()), []int{0, 1, 2, 3, 4, 5}), fmt.Sprintf("b owns %v", sb.owned())
	})

	s.jobs("task", 120, 5, 5) // after the hand-over
	s.caughtUp(joinWithin, b)
	s.requireModel()

	b.stop(stopWithin)
	s.requirePositionsAtEnd()
	s.requireModel()

	// Both instances claimed partitions; the last claims are b's.
	ctx, cancel := s.ctx()
	defer cancel()
	pos, err := s.st.Positions(ctx)
	require.NoError(t, err)
	for _, ps := range pos {
		require.Equal(t, "inst-b", ps.Owner, "partition %d", ps.Partition)
	}
	require.Zero(t, s.quarantineCount())
}

func sortedInts(xs []int) []int {
	out := slices.Clone(xs)
	slices.Sort(out)
	return out
}

// runToEnd runs the daemon over the whole story until it has caught up,
// then stops it with SIGTERM.
func (s *story) runToEnd(group string) {
	s.t.Helper()
	p := startBin(s.t, "run "+group, dbEnv(), s.runArgs(group, "inst-"+group, "--http-addr", "off")...)
	s.caughtUp(joinWithin, p)
	p.stop(stopWithin)
	s.requireModel()
	s.requirePositionsAtEnd()
	require.Equal(s.t, int(s.quarantined), s.quarantineCount())
}

// lines is s split into non-empty trimmed lines.
func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// TestRunTwoInstancesOnOneHostWithDefaults: two instances started with no
// --http-addr on one host cannot both serve :8080. The second one warns and
// runs on without its HTTP server rather than exit: the projection, not the
// status page, is what it is for.
func TestRunTwoInstancesOnOneHostWithDefaults(t *testing.T) {
	t.Parallel()
	s := newStory(t, 6)
	s.jobs("task", 60, 1, 2)

	a := startBin(t, "run a", dbEnv(), s.runArgs("g-defaults", "inst-a", "--http-addr", "")...)
	b := startBin(t, "run b", dbEnv(), s.runArgs("g-defaults", "inst-b", "--http-addr", "")...)
	eventually(t, 2*joinWithin, "both instances own partitions", func() (bool, string) {
		a.requireAlive()
		b.requireAlive()
		ctx, cancel := s.ctx()
		defer cancel()
		pos, err := s.st.Positions(ctx)
		if err != nil {
			return false, err.Error()
		}
		owners := map[string]bool{}
		for _, p := range pos {
			owners[p.Owner] = true
		}
		return owners["inst-a"] && owners["inst-b"], fmt.Sprintf("owners %v", owners)
	})
	s.caughtUp(joinWithin, a, b)
	s.requireModel()
	require.True(t, strings.Contains(a.logs.String()+b.logs.String(), "not served"),
		"an instance that could not bind :8080 says so")
	a.stop(stopWithin)
	b.stop(stopWithin)
}

// TestRunKilledMidStreamLosesNothing: SIGKILL gives the daemon no chance to
// finish anything. Whatever it committed stays, whatever it did not is read
// again by the next instance, and every increment counts exactly once.
func TestRunKilledMidStreamLosesNothing(t *testing.T) {
	t.Parallel()
	s := newStory(t, 3)
	s.jobs("task", 400, 1, 4)

	a := startBin(t, "run a", dbEnv(), s.runArgs("g-kill", "inst-a", "--http-addr", "off", "--batch-size", "50")...)
	eventually(t, joinWithin, "the first instance commits some batches", func() (bool, string) {
		a.requireAlive()
		pos, err := s.positions()
		if err != nil {
			return false, err.Error()
		}
		var n int64
		for _, p := range pos {
			n += max(p, 0)
		}
		return n >= 100, fmt.Sprintf("%d records committed", n)
	})
	require.NoError(t, a.cmd.Process.Kill())
	<-a.done

	b := startBin(t, "run b", dbEnv(), s.runArgs("g-kill", "inst-b", "--http-addr", "off")...)
	s.caughtUp(2*joinWithin, b)
	s.requireModel()
	b.stop(stopWithin)
	s.requirePositionsAtEnd()
}

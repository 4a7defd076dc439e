package observe

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHeldPagesAcrossPartitions: the list is one order across
// partitions, by when each job began to wait, then partition, then job;
// pages follow each other without a gap or a repeat; and a partition that
// holds more jobs than it keeps ends the list at the youngest it keeps,
// since younger ones of its own are not known.
func TestHeldPagesAcrossPartitions(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	view := func(partition int, secs ...int) []HeldJob {
		var out []HeldJob
		for i, s := range secs {
			out = append(out, HeldJob{JobID: fmt.Sprintf("p%d-%02d%c", partition, s, 'a'+i), Since: t0.Add(time.Duration(s) * time.Second)})
		}
		return SortHeld(partition, out)
	}
	parts := func() []PartitionStatus {
		return []PartitionStatus{
			{Partition: 0, HeldJobs: 4, View: view(0, 1, 4, 4, 9), ViewOf: 4},
			{Partition: 1, HeldJobs: 3, View: view(1, 2, 4, 7), ViewOf: 3},
			{Partition: 2, HeldJobs: 0, View: nil},
		}
	}
	var order []string
	q := HeldQuery{Limit: 3}
	for page := 0; ; page++ {
		ps := parts()
		pg, err := PageHeld(ps, q)
		require.NoError(t, err)
		require.Equal(t, int64(7-pg.Listed), pg.Omitted)
		var listed []HeldJob
		for _, p := range ps {
			require.NotNil(t, p.Held, "an empty list is [], not null")
			listed = append(listed, p.Held...)
		}
		require.Len(t, listed, pg.Listed)
		sortAll(listed)
		for _, j := range listed {
			order = append(order, j.JobID)
		}
		if pg.Next == "" {
			require.Equal(t, 2, page)
			break
		}
		q.After = pg.Next
	}
	require.Equal(t, []string{"p0-01a", "p1-02a", "p0-04b", "p0-04c", "p1-04b", "p1-07c", "p0-09d"}, order)

	// Partition 0 holds 10 jobs but keeps its 4 oldest: the list stops at
	// the youngest of them (9 s), and p1-12 cannot be listed yet.
	ps := []PartitionStatus{
		{Partition: 0, HeldJobs: 10, View: view(0, 1, 3, 5, 9), ViewOf: 10},
		{Partition: 1, HeldJobs: 2, View: view(1, 2, 12), ViewOf: 2},
	}
	pg, err := PageHeld(ps, HeldQuery{Limit: 100})
	require.NoError(t, err)
	require.Equal(t, 5, pg.Listed)
	require.Equal(t, int64(6), pg.Beyond)
	require.Equal(t, int64(7), pg.Omitted)
	require.Empty(t, pg.Next)
	require.Len(t, ps[1].Held, 1)

	for _, q := range []HeldQuery{{Limit: -1}, {Limit: MaxHeldLimit + 1}, {After: "%%"}, {After: "bm90LWEta2V5"}} {
		_, err := PageHeld(parts(), q)
		require.True(t, errors.Is(err, errHeldQuery), "%+v: %v", q, err)
	}
}

// sortAll sorts jobs of several partitions by heldKey; their ids name
// their partition.
func sortAll(jobs []HeldJob) {
	partition := func(j HeldJob) int {
		var p int
		_, _ = fmt.Sscanf(j.JobID, "p%d-", &p)
		return p
	}
	for i := 1; i < len(jobs); i++ {
		for k := i; k > 0 && keyOf(partition(jobs[k]), jobs[k]).before(keyOf(partition(jobs[k-1]), jobs[k-1])); k-- {
			jobs[k], jobs[k-1] = jobs[k-1], jobs[k]
		}
	}
}

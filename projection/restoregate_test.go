package projection

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestARestoredHeldJobWaitsForItsLaneToReadToItsEnd: a job held by a
// partition's previous owner, restored by a new owner that claims the
// partition far behind its end, does not re-read the log for its missing
// version at once (its hold is long past --gap-wait): its first attempt
// waits for the lane to read as far as the log ends, and the late version,
// appended at that end, closes the gap by the wait step as the lane reads
// it; meanwhile the status shows the offset it waits for. Restored
// without that wait, the re-read finds the version first.
func TestARestoredHeldJobWaitsForItsLaneToReadToItsEnd(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	inc := `[{"op":"increment","path":"/count","by":1}]`
	r.produce(rec{0, "late", snap("late", 1, counterStateOf(1))}, rec{0, "late", dlt("late", 3, inc)})
	first := r.start(r.config(func(c *Config) { c.GapWait, c.GapWaitOff = time.Hour, false }))
	r.caughtUp(30*time.Second, first)
	r.eventually(30*time.Second, "the job held", func() (bool, string) {
		n := first.p.Status().Counters.HeldJobs
		return n == 1, fmt.Sprintf("%d held", n)
	})
	first.halt(t)

	// Far behind its end: thousands of records, then the late version.
	var filler []rec
	for i := range 20000 {
		id := fmt.Sprintf("filler-%04d", i)
		filler = append(filler, rec{0, id, snap(id, 1, counterStateOf(1))})
	}
	r.produce(filler...)
	r.produce(rec{0, "late", dlt("late", 2, inc)})

	// The lane takes a second or two to read that far, while the restored
	// hold, begun before the restart, is due at once by --gap-wait.
	second := r.start(r.config(func(c *Config) {
		c.GapWait, c.GapWaitOff = 300*time.Millisecond, false
		c.BatchSize = 100
	}))
	// While it waits, the status says how far the lane must read: the
	// log's end, learnt once the lane first read it.
	readsTo := make(chan int64, 1)
	go func() {
		var seen int64 = -1
		defer func() { readsTo <- seen }()
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
			st := second.p.Status()
			if st.Counters.HeldJobs == 0 && st.Counters.ClosedByWait+st.Counters.ClosedByReread > 0 {
				return
			}
			for _, ps := range st.Partitions {
				for _, h := range ps.Held {
					if h.JobID == "late" && h.ReadsTo != nil {
						seen = max(seen, *h.ReadsTo)
					}
				}
			}
		}
	}()
	began := time.Now()
	r.caughtUp(60*time.Second, second)
	t.Logf("the lane read to its end in %s", time.Since(began))
	r.eventually(30*time.Second, "the gap closed", func() (bool, string) {
		c := second.p.Status().Counters
		return c.HeldJobs == 0, fmt.Sprintf("%+v", c)
	})
	require.Equal(t, r.highWatermarks()[0], <-readsTo, "the held job waited for the lane to read to the log's end")
	c := second.p.Status().Counters
	require.Equal(t, int64(1), c.ClosedByWait, "the lane read the late version: %+v", c)
	require.Zero(t, c.ClosedByReread, "no re-read ran before the lane read as far as the log ended: %+v", c)
	require.Equal(t, int64(3), r.rows()["late"].Version)
	require.JSONEq(t, `{"count":3,"last":1}`, string(r.rows()["late"].State), "v1 and two increments")
}

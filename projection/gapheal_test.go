package projection

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/store"
)

// slowAuthority answers GET /jobs/{id} with a counter snapshot at the
// version it was told, after the delay it was told for that job (until
// the test ends), and records when each request arrived.
type slowAuthority struct {
	url  string
	done chan struct{}

	mu       sync.Mutex
	version  map[string]int64
	delay    map[string]time.Duration
	fail     map[string]bool
	requests map[string][]time.Time
}

func newSlowAuthority(t *testing.T) *slowAuthority {
	a := &slowAuthority{done: make(chan struct{}), version: map[string]int64{}, delay: map[string]time.Duration{},
		fail: map[string]bool{}, requests: map[string][]time.Time{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /jobs/{id}", a.serve)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		close(a.done)
		srv.Close()
	})
	a.url = srv.URL
	return a
}

func (a *slowAuthority) serve(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	a.mu.Lock()
	a.requests[id] = append(a.requests[id], time.Now())
	v, d, fail := a.version[id], a.delay[id], a.fail[id]
	a.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-a.done:
			return
		case <-r.Context().Done():
			return
		}
	}
	switch {
	case fail:
		http.Error(w, "authority overloaded (test)", http.StatusServiceUnavailable)
	case v == 0:
		http.Error(w, "unknown job", http.StatusNotFound)
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprint(w, snap(id, v, counterStateOf(v)))
	}
}

func (a *slowAuthority) set(id string, version int64, delay time.Duration, fail bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.version[id], a.delay[id], a.fail[id] = version, delay, fail
}

func (a *slowAuthority) asked(id string) []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.requests[id]...)
}

func (a *slowAuthority) total() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, r := range a.requests {
		n += len(r)
	}
	return n
}

// heldJob returns job's entry in the engine's status, if it is held.
func heldJob(run *running, job string) (HeldJob, bool) {
	for _, p := range run.p.Status().Partitions {
		for _, h := range p.Held {
			if h.JobID == job {
				return h, true
			}
		}
	}
	return HeldJob{}, false
}

// TestAPromptAnswerIsNotHeldUpBySlowOnes: twelve held jobs whose authority
// answers take 8 s and one it answers at once, all due together. The
// prompt one heals within 2 x --gap-wait + 1 s of being held: its attempt
// runs on its own and its result joins the next batch, whatever the slow
// ones are doing.
func TestAPromptAnswerIsNotHeldUpBySlowOnes(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	auth := newSlowAuthority(t)
	const gapWait = time.Second
	var recs []rec
	for i := range 12 {
		id := fmt.Sprintf("slow-%02d", i)
		auth.set(id, 2, 8*time.Second, false)
		recs = append(recs, rec{0, id, snap(id, 1, counterStateOf(1))}, rec{0, id, dlt(id, 3, `[{"op":"increment","path":"/count","by":1}]`)})
	}
	auth.set("prompt", 2, 0, false)
	recs = append(recs, rec{0, "prompt", snap("prompt", 1, counterStateOf(1))}, rec{0, "prompt", dlt("prompt", 3, `[{"op":"increment","path":"/count","by":1}]`)})
	r.produce(recs...)
	run := r.start(r.config(func(c *Config) {
		c.GapWait, c.GapWaitOff = gapWait, false
		c.NoReread = true
		c.SnapshotURL = auth.url
		c.SnapshotConcurrency = 16
		c.SnapshotTimeout = 20 * time.Second
	}))

	var since time.Time
	r.eventually(10*time.Second, "the prompt job is held", func() (bool, string) {
		h, ok := heldJob(run, "prompt")
		since = h.Since
		return ok, "not held yet"
	})
	var healed time.Time
	r.eventually(10*time.Second, "the prompt job heals", func() (bool, string) {
		rows, err := r.store.LoadJobs(context.Background(), []string{"prompt"})
		require.NoError(t, err)
		if rows["prompt"].Version == 3 {
			healed = time.Now()
			return true, ""
		}
		return false, fmt.Sprintf("at version %d", rows["prompt"].Version)
	})
	took := healed.Sub(since)
	t.Logf("held %s, healed %s later", since.Format(time.RFC3339Nano), took)
	require.Less(t, took, 2*gapWait+time.Second, "the prompt job waited behind the slow ones")
	for i := range 12 {
		_, held := heldJob(run, fmt.Sprintf("slow-%02d", i))
		require.True(t, held, "slow-%02d healed although its answer is still on its way", i)
	}
}

// TestProgressWaitsTheFullGapWaitAgain: an attempt that moves a held job
// forward without closing its gap leaves it waiting the full --gap-wait
// again, attempts at 0: the authority is asked once, not again at once.
func TestProgressWaitsTheFullGapWaitAgain(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	auth := newSlowAuthority(t)
	const gapWait = 2 * time.Second
	// The row is at 1; 3 and 5 are held. The authority is at 3: it closes
	// 2..3, and 5 still waits for 4.
	auth.set("job", 3, 0, false)
	inc := `[{"op":"increment","path":"/count","by":1}]`
	r.produce(rec{0, "job", snap("job", 1, counterStateOf(1))}, rec{0, "job", dlt("job", 3, inc)}, rec{0, "job", dlt("job", 5, inc)})
	run := r.start(r.config(func(c *Config) {
		c.GapWait, c.GapWaitOff = gapWait, false
		c.NoReread = true
		c.SnapshotURL = auth.url
		c.GapRetryMin = 50 * time.Millisecond
	}))
	var h HeldJob
	r.eventually(15*time.Second, "the authority's answer lands", func() (bool, string) {
		rows, err := r.store.LoadJobs(context.Background(), []string{"job"})
		require.NoError(t, err)
		var ok bool
		h, ok = heldJob(run, "job")
		return rows["job"].Version == 3 && ok && h.Version == 3, fmt.Sprintf("row at %d, status %+v", rows["job"].Version, h)
	})
	require.Len(t, auth.asked("job"), 1)
	require.Zero(t, h.Attempts, "progress counted as a failed attempt: %+v", h)
	require.Equal(t, "wait", h.LastStep)
	require.Equal(t, gapWait, h.NextAttempt.Sub(h.Since), "progress did not restart the full wait: %+v", h)
	require.Equal(t, []int64{4}, h.Missing)

	r.eventually(15*time.Second, "the authority is asked again", func() (bool, string) {
		return len(auth.asked("job")) >= 2, "asked once"
	})
	second := auth.asked("job")[1]
	require.False(t, second.Before(h.Since.Add(gapWait)), "asked again %s after the progress, before the wait of %s ended",
		second.Sub(h.Since), gapWait)
}

// TestRereadFindsTheMissingVersionPastALongOldPartition: partition 0 holds
// only records older than the re-read window, more bytes of them than the
// whole budget; the missing version is in partition 2. The re-read skips
// partition 0 (no record at or after the start time) and finds it.
func TestRereadFindsTheMissingVersionPastALongOldPartition(t *testing.T) {
	t.Parallel()
	r := newRig(t, 3)
	old := time.Now().Add(-time.Hour)
	filler := strings.Repeat("x", 1000)
	var msgs []kafka.Message
	bal := &kafka.Murmur2Balancer{}
	for i := 0; len(msgs) < 200; i++ {
		key := fmt.Sprintf("old-%d", i)
		m := kafka.Message{Key: []byte(key), Value: []byte(snap(key, 1, fmt.Sprintf(`{"pad":%q}`, filler))), Time: old}
		if bal.Balance(m, 0, 1, 2) == 0 {
			msgs = append(msgs, m)
		}
	}
	require.NoError(t, r.kafka.ProduceKeyed(t.Context(), r.topic, msgs...))
	offs := r.produce(rec{1, "other", snap("other", 1, `{}`)}, rec{2, "job", dlt("job", 2, `[{"op":"set","path":"/a","value":1}]`)})

	cfg := r.config(func(c *Config) { c.RereadMaxBytes = 50_000 }).WithDefaults()
	p, err := New(cfg)
	require.NoError(t, err)
	found, err := (&logReader{r: p.src.Rereader()}).Reread(t.Context(), []string{"job"}, time.Now().Add(-time.Minute))
	require.NoError(t, err)
	require.Len(t, found, 1)
	require.Equal(t, "job", found[0].Event.JobID)
	require.Equal(t, int64(2), found[0].Event.Version)
	require.Equal(t, 2, found[0].Partition)
	require.Equal(t, offs[1], found[0].Offset)
	require.False(t, found[0].LogTime.IsZero(), "the broker timestamp is kept")
}

// TestRereadBudgetIsSharedBetweenPartitions: partition 0 holds recent
// records, none of them relevant, more bytes than the whole budget. The
// budget is shared, so partition 2 is still read and its record found.
func TestRereadBudgetIsSharedBetweenPartitions(t *testing.T) {
	t.Parallel()
	r := newRig(t, 3)
	filler := strings.Repeat("x", 1000)
	var recs []rec
	for i := range 200 {
		key := fmt.Sprintf("noise-%d", i)
		recs = append(recs, rec{0, key, snap(key, 1, fmt.Sprintf(`{"pad":%q}`, filler))})
	}
	recs = append(recs, rec{2, "job", dlt("job", 2, `[{"op":"set","path":"/a","value":1}]`)})
	r.produce(recs...)
	cfg := r.config(func(c *Config) { c.RereadMaxBytes = 60_000 }).WithDefaults()
	p, err := New(cfg)
	require.NoError(t, err)
	found, err := (&logReader{r: p.src.Rereader()}).Reread(t.Context(), []string{"job"}, time.Now().Add(-time.Minute))
	require.ErrorContains(t, err, "reread-max-bytes", "partition 0 was cut short, and says so")
	require.Len(t, found, 1)
	require.Equal(t, 2, found[0].Partition)
}

// TestARejectedHeldDeltaFromAnotherPartitionIsQuarantinedUnderItsOwnCoordinates:
// partition 0's owner holds a delta a re-read found at offset 0 of
// partition 2. Partition 0's own offset 0 is an unrelated bad record. When
// the held delta is released and its ops fail, it is quarantined as
// partition 2 offset 0: both records are in the quarantine, neither
// replaced the other.
func TestARejectedHeldDeltaFromAnotherPartitionIsQuarantinedUnderItsOwnCoordinates(t *testing.T) {
	t.Parallel()
	r := newRig(t, 3)
	ctx := context.Background()
	require.NoError(t, r.store.Migrate(ctx))
	// What an earlier owner of partition 0 left: the row at 1 and the held
	// delta 3, read from partition 2, whose ops cannot apply.
	c, err := r.store.Claim(ctx, r.topic, 0, "earlier")
	require.NoError(t, err)
	bad := json.RawMessage(`[{"op":"increment","path":"/name","by":1}]`)
	_, err = r.store.Apply(ctx, &store.Batch{Topic: r.topic, Partition: 0, Epoch: c.Epoch, NextOffset: 0,
		Snapshots: []store.Write{{JobID: "job", Version: 1, State: json.RawMessage(`{"name":"x"}`)}},
		Hold: []store.Held{{JobID: "job", Version: 3, Partition: 0, SourcePartition: 2, Offset: 0, Ops: bad,
			EventID: "evt-job-3", Since: time.Now()}}})
	require.NoError(t, err)

	// Partition 2 itself is left empty, so only the held copy can put a
	// record at 2@0 in the quarantine.
	r.produce(rec{0, "junk", "not json"}, rec{0, "job", dlt("job", 2, `[{"op":"set","path":"/a","value":1}]`)})
	run := r.start(r.config())
	r.caughtUp(30*time.Second, run)
	r.eventually(10*time.Second, "both records quarantined", func() (bool, string) {
		q, _, err := r.store.Quarantine(ctx, 10)
		require.NoError(t, err)
		var got []string
		for _, x := range q {
			got = append(got, fmt.Sprintf("%d@%d", x.Partition, x.Offset))
		}
		return len(q) == 2, fmt.Sprintf("quarantined %v", got)
	})
	q, _, err := r.store.Quarantine(ctx, 10)
	require.NoError(t, err)
	at := map[string]store.Quarantined{}
	for _, x := range q {
		at[fmt.Sprintf("%d@%d", x.Partition, x.Offset)] = x
	}
	require.Contains(t, at, "0@0")
	require.Contains(t, at, "2@0")
	require.Contains(t, at["2@0"].Error, "version 3")
	require.Equal(t, "job", string(at["2@0"].Key))
	rows, err := r.store.LoadJobs(ctx, []string{"job"})
	require.NoError(t, err)
	require.Equal(t, int64(2), rows["job"].Version)
}

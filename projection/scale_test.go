package projection

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// runsScale reports whether -run names the scale tests explicitly: they
// take minutes and are not part of the default suite.
func runsScale() bool {
	f := flag.Lookup("test.run")
	return f != nil && strings.Contains(f.Value.String(), "Scale")
}

// scaleAuthority answers GET /jobs/{id} for the scale run: most jobs after
// a short fixed time, the "slow" ones after 10 s, the "failing" ones with
// 503, until healed() makes every answer prompt. It records how long each
// request held its connection.
type scaleAuthority struct {
	prompt  time.Duration
	healthy atomic.Bool
	done    chan struct{}

	mu        sync.Mutex
	firstAsk  map[string]time.Time
	spans     []span // when each request was in flight
	promptDur []time.Duration
	requests  int
}

func (a *scaleAuthority) kind(i int) string {
	switch i % 20 {
	case 0, 1:
		return "slow" // 10%
	case 2:
		return "failing" // 5%
	}
	return "prompt"
}

func (a *scaleAuthority) serve(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id := r.PathValue("id")
	i, _ := strconv.Atoi(strings.TrimPrefix(id, "scale-"))
	kind := a.kind(i)
	if a.healthy.Load() {
		kind = "prompt"
	}
	a.mu.Lock()
	a.requests++
	if _, ok := a.firstAsk[id]; !ok {
		a.firstAsk[id] = start
	}
	a.mu.Unlock()
	wait := a.prompt
	if kind == "slow" {
		wait = 10 * time.Second
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
	case <-a.done:
	}
	switch {
	case r.Context().Err() != nil:
	case kind == "failing":
		http.Error(w, "overloaded (scale test)", http.StatusServiceUnavailable)
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprint(w, snap(id, 2, counterStateOf(2)))
	}
	d := time.Since(start)
	a.mu.Lock()
	a.spans = append(a.spans, span{start, d})
	if kind == "prompt" {
		a.promptDur = append(a.promptDur, d)
	}
	a.mu.Unlock()
}

type span struct {
	start time.Time
	d     time.Duration
}

// resources samples the process's resident memory and goroutines.
// Goroutines of the in-process broker and of the test's authority server
// are counted apart: a deployed projector has neither.
type resources struct {
	maxRSS, maxGoroutines, maxOwn atomic.Int64
	buf                           []byte
}

func (r *resources) sample() {
	if n := int64(runtime.NumGoroutine()); n > r.maxGoroutines.Load() {
		r.maxGoroutines.Store(n)
	}
	if r.buf == nil {
		r.buf = make([]byte, 8<<20)
	}
	dump := string(r.buf[:runtime.Stack(r.buf, true)])
	var own int64
	for _, g := range strings.Split(dump, "\n\n") {
		if !strings.Contains(g, "kfake") && !strings.Contains(g, "net/http.(*conn).serve") && !strings.Contains(g, "scaleAuthority") &&
			!strings.Contains(g, "testing.") {
			own++
		}
	}
	if own > r.maxOwn.Load() {
		r.maxOwn.Store(own)
	}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if kb*1024 > r.maxRSS.Load() {
				r.maxRSS.Store(kb * 1024)
			}
		}
	}
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// TestScaleTenThousandHeldJobs is the scale run of gap healing, run only
// when asked for by name:
//
//	go test -count=1 -run Scale -v -timeout 20m ./projection/
//
// 10,000 jobs are held on 4 partitions (each at version 1 with version 3
// held, version 2 never produced). The authority answers 85% of them
// after 20 ms, 10% after 10 s (past --snapshot-timeout, so those time
// out), and 5% with 503. Every promptly answered job heals while the
// others keep failing; once the authority answers all of them, every job
// heals. It reports heal times, heal throughput, the process's peak RSS
// and goroutines.
func TestScaleTenThousandHeldJobs(t *testing.T) {
	if !runsScale() {
		t.Skip("scale run: go test -count=1 -run Scale -v -timeout 20m ./projection/")
	}
	const (
		jobs        = 10_000
		partitions  = 4
		concurrency = 32
		gapWait     = time.Second
	)
	auth := &scaleAuthority{prompt: 20 * time.Millisecond, done: make(chan struct{}), firstAsk: map[string]time.Time{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /jobs/{id}", auth.serve)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		close(auth.done)
		srv.Close()
	})

	r := newRig(t, partitions)
	var recs []rec
	kinds := map[string]string{}
	for i := range jobs {
		id := fmt.Sprintf("scale-%05d", i)
		kinds[id] = auth.kind(i)
		p := partitionOf(id, partitions)
		recs = append(recs, rec{p, id, snap(id, 1, counterStateOf(1))},
			rec{p, id, dlt(id, 3, `[{"op":"increment","path":"/count","by":3},{"op":"set","path":"/last","value":3}]`)})
	}
	r.produce(recs...)

	var res resources
	sctx, stopSampling := context.WithCancel(context.Background())
	var sampling sync.WaitGroup
	sampling.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			res.sample()
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	defer func() { stopSampling(); sampling.Wait() }()

	started := time.Now()
	run := r.start(r.config(func(c *Config) {
		c.GapWait = gapWait
		c.SnapshotURL = srv.URL
		c.SnapshotConcurrency = concurrency
		c.SnapshotTimeout = time.Second
		c.SnapshotMaxElapsed = 300 * time.Millisecond
		c.GapRetryMin = 500 * time.Millisecond
		c.GapRetryMax = 2 * time.Second
		c.BatchSize = 5000
		c.Logger = quietLogger(t)
	}))

	healed := func() map[string]time.Time {
		rows, err := r.store.Pool().Query(context.Background(),
			`SELECT job_id, updated_at FROM `+r.store.JobsTable()+` WHERE version = 3`)
		require.NoError(t, err)
		defer rows.Close()
		out := map[string]time.Time{}
		for rows.Next() {
			var id string
			var at time.Time
			require.NoError(t, rows.Scan(&id, &at))
			out[id] = at
		}
		require.NoError(t, rows.Err())
		return out
	}
	countKind := func(h map[string]time.Time, kind string) int {
		n := 0
		for id := range h {
			if kinds[id] == kind {
				n++
			}
		}
		return n
	}
	prompt := 0
	for _, k := range kinds {
		if k == "prompt" {
			prompt++
		}
	}

	// Phase 1: the authority is slow or failing for 15% of the jobs.
	var phase1 map[string]time.Time
	r.eventually(10*time.Minute, "every promptly answered job heals", func() (bool, string) {
		phase1 = healed()
		n := countKind(phase1, "prompt")
		return n == prompt, fmt.Sprintf("%d of %d promptly answered jobs healed", n, prompt)
	})
	phase1End := time.Now()
	require.Zero(t, countKind(phase1, "slow")+countKind(phase1, "failing"), "a job healed although the authority never answered it")

	// Phase 2: the authority answers every job.
	auth.healthy.Store(true)
	phase2Start := time.Now()
	var all map[string]time.Time
	r.eventually(10*time.Minute, "every job heals once the authority answers", func() (bool, string) {
		all = healed()
		return len(all) == jobs, fmt.Sprintf("%d of %d healed", len(all), jobs)
	})
	phase2End := time.Now()
	stopSampling()
	sampling.Wait()
	res.sample()

	// Heal times: from the job's first request to the authority to its
	// row at version 3 (the hold itself began --gap-wait earlier).
	auth.mu.Lock()
	var promptHeal []time.Duration
	var firstAsk, lastPromptHeal time.Time
	for id, at := range phase1 {
		ask := auth.firstAsk[id]
		if firstAsk.IsZero() || ask.Before(firstAsk) {
			firstAsk = ask
		}
		if kinds[id] == "prompt" {
			promptHeal = append(promptHeal, at.Sub(ask))
			if at.After(lastPromptHeal) {
				lastPromptHeal = at
			}
		}
	}
	median := percentile(auth.promptDur, 0.5)
	// The time requests were in flight during phase 1, against what the
	// concurrency limit allows: how busy the scheduler kept the slots.
	var busy time.Duration
	var inPhase1 int
	for _, s := range auth.spans {
		end := s.start.Add(s.d)
		if end.After(lastPromptHeal) {
			end = lastPromptHeal
		}
		if end.After(s.start) {
			busy += end.Sub(s.start)
			inPhase1++
		}
	}
	requests := auth.requests
	auth.mu.Unlock()

	window := lastPromptHeal.Sub(firstAsk).Seconds()
	throughput := float64(prompt) / window
	ideal := float64(concurrency) / median.Seconds()
	utilisation := busy.Seconds() / (float64(concurrency) * window)
	meanSlot := busy / time.Duration(max(inPhase1, 1))
	achievable := float64(concurrency) / meanSlot.Seconds()
	healedLate := jobs - len(phase1)
	phase2Rate := float64(healedLate) / phase2End.Sub(phase2Start).Seconds()
	// One re-reader per partition and kafka-go's reader goroutines; the
	// instance has 2 x --snapshot-concurrency fetchers.
	perPartition := int64(8)
	bound := 200 + 2*concurrency + perPartition*partitions
	t.Logf("scale run: %d held jobs on %d partitions, --snapshot-concurrency %d, --gap-wait %s, started %s", jobs, partitions, concurrency, gapWait, started.Format(time.RFC3339))
	t.Logf("phase 1 (10%% slow, 5%% 503): %d promptly answered jobs healed in %.1fs; heal time from first request p50 %s p95 %s p99 %s max %s",
		prompt, phase1End.Sub(started).Seconds(), percentile(promptHeal, 0.5), percentile(promptHeal, 0.95), percentile(promptHeal, 0.99), percentile(promptHeal, 1))
	t.Logf("phase 1 throughput: %.0f heals/s of promptly answered jobs, %.0f requests/s; --snapshot-concurrency / median answer (%s) = %.0f/s (heals %.0f%%); --snapshot-concurrency / mean time a request was in flight (%s) = %.0f/s (requests %.0f%%); slots busy %.0f%% of the time",
		throughput, float64(inPhase1)/window, median, ideal, 100*throughput/ideal, meanSlot, achievable, 100*float64(inPhase1)/window/achievable, 100*utilisation)
	t.Logf("phase 2 (authority answers all): the other %d jobs healed in %.1fs (%.0f/s); %d requests in all",
		healedLate, phase2End.Sub(phase2Start).Seconds(), phase2Rate, requests)
	t.Logf("peak RSS %.1f MiB (the whole test process, broker included); peak goroutines %d in all, %d without the in-process broker, the test's authority server and the test framework (bound 200 + 2 x %d fetchers + %d per partition = %d)",
		float64(res.maxRSS.Load())/(1<<20), res.maxGoroutines.Load(), res.maxOwn.Load(), concurrency, perPartition, bound)
	c := run.p.Status().Counters
	t.Logf("counters: %+v", c)

	require.Less(t, res.maxRSS.Load(), int64(256<<20), "peak RSS")
	require.Less(t, res.maxOwn.Load(), bound, "peak goroutines")
	require.GreaterOrEqual(t, utilisation, 0.8,
		"the authority's --snapshot-concurrency slots were idle more than 20%% of phase 1 while jobs waited")
	rows := r.rows()
	for id, k := range kinds {
		require.Equal(t, int64(3), rows[id].Version, "%s (%s)", id, k)
	}
}

// quietLogger logs errors only: the scale run's thousands of "gap still
// held" warnings are expected.
func quietLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelError}))
}

package projection

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/snapshot"
)

// TestASlowAuthorityGetsMoreTimeUntilItAnswers is issue 21's twelve jobs
// whose authority answers take 8 s under the default --snapshot-timeout of
// 5 s, scaled down: 700 ms answers under a 500 ms timeout. Each job's first
// request runs in the main lane and is cut at 500 ms; its next runs in the
// slow lane with twice the time, and gets the answer: every job heals after
// exactly those two requests. Without the growth every request is cut at
// 500 ms and none heals. A prompt job held once all twelve were cut heals
// before any of them: their longer requests hold no main slot. The
// authority's slowness is logged once per job, with how long the request
// ran and how long the next one gets.
func TestASlowAuthorityGetsMoreTimeUntilItAnswers(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	auth := newSlowAuthority(t)
	const (
		timeout    = 500 * time.Millisecond
		timeoutMax = 12 * time.Second
		answer     = 700 * time.Millisecond
	)
	inc := `[{"op":"increment","path":"/count","by":1}]`
	hold := func(ids ...string) {
		var recs []rec
		for _, id := range ids {
			recs = append(recs, rec{0, id, snap(id, 1, counterStateOf(1))}, rec{0, id, dlt(id, 3, inc)})
		}
		r.produce(recs...)
	}
	var slow []string
	for i := range 12 {
		slow = append(slow, fmt.Sprintf("slow-%02d", i))
		auth.set(slow[i], 2, answer, false)
	}
	auth.set("prompt", 2, 0, false)

	var mu sync.Mutex
	asked := map[string][]authorityRequest{}
	requestsOf := func(id string) []authorityRequest {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(asked[id])
	}
	logs := &logLines{t: t}
	run := r.start(r.config(func(c *Config) {
		c.Logger = logs.logger()
		c.NoReread = true
		c.SnapshotURL = auth.url
		c.SnapshotTimeout = timeout
		c.SnapshotTimeoutMax = timeoutMax
		// Every job's first request has a main slot at once.
		c.SnapshotConcurrency = 16
		c.testAuthorityRequest = func(q authorityRequest) {
			mu.Lock()
			defer mu.Unlock()
			asked[q.job] = append(asked[q.job], q)
		}
	}))

	hold(slow...)
	r.eventually(15*time.Second, "every slow job's first request ends", func() (bool, string) {
		for _, id := range slow {
			if len(requestsOf(id)) == 0 {
				return false, id + " not asked yet"
			}
		}
		return true, ""
	})
	hold("prompt")

	all := append([]string{"prompt"}, slow...)
	r.eventually(30*time.Second, "every job heals", func() (bool, string) {
		rows, err := r.store.LoadJobs(context.Background(), all)
		require.NoError(t, err)
		for _, id := range all {
			if rows[id].Version != 3 {
				q := requestsOf(id)
				return false, fmt.Sprintf("%s at version %d after %d requests", id, rows[id].Version, len(q))
			}
		}
		// The worker settles a batch after its commit.
		closed := logs.matching(`msg="gap closed"`)
		return len(closed) == len(all), fmt.Sprintf("%d gaps closed", len(closed))
	})

	// What each request ran with.
	for _, id := range slow {
		q := requestsOf(id)
		require.Len(t, q, 2, "%s: requests %+v", id, q)
		require.Len(t, auth.asked(id), 2, "%s: requests the authority saw", id)

		require.Equal(t, timeout, q[0].timeout, "%s: first request", id)
		require.False(t, q[0].slow, "%s: the first request starts in the main lane", id)
		var cut *snapshot.TimeoutError
		require.True(t, errors.As(q[0].err, &cut), "%s: the first request was not cut by its timeout: %v", id, q[0].err)
		require.Equal(t, timeout, cut.Timeout)

		require.Equal(t, 2*timeout, q[1].timeout, "%s: the request after the cut gets twice the time", id)
		require.True(t, q[1].slow, "%s: the request after the cut starts in the slow lane", id)
		require.NoError(t, q[1].err, "%s: second request", id)
	}
	q := requestsOf("prompt")
	require.Len(t, q, 1, "prompt: requests %+v", q)
	require.Equal(t, timeout, q[0].timeout)
	require.False(t, q[0].slow)
	require.NoError(t, q[0].err)

	// The prompt job healed first.
	closed := logs.matching(`msg="gap closed"`)
	require.Contains(t, closed[0], "job_id=prompt ", "the prompt job did not heal first: %q", closed)

	// Once per job: slower than --snapshot-timeout, by at least what the
	// cut request ran with; and, when it heals, within what time.
	for _, id := range slow {
		warned := logs.matching("slower than --snapshot-timeout", "job_id="+id+" ")
		require.Len(t, warned, 1, "%s: %q", id, warned)
		require.Contains(t, warned[0], "level=WARN")
		require.Contains(t, warned[0], "took_at_least=500ms snapshot_timeout=500ms next_timeout=1s snapshot_timeout_max=12s")
		healed := logs.matching(`msg="gap closed"`, "job_id="+id+" ")
		require.Len(t, healed, 1)
		require.Contains(t, healed[0], "by=snapshot timed_out=1 answered_within=1s")
	}
	require.Empty(t, logs.matching("slower than --snapshot-timeout", "job_id=prompt "))

	requireMetrics(t, scrape(t, run.p), map[string]float64{
		"projector_authority_timeouts_total":                  12,
		`projector_authority_requests_total{result="ok"}`:     13,
		`projector_authority_requests_total{result="error"}`:  12,
		`projector_authority_requests_in_flight{lane="main"}`: 0,
		`projector_authority_requests_in_flight{lane="slow"}`: 0,
	})
}

// TestSnapshotTimeoutMaxCapsTheGrowth: SnapshotTimeoutMax defaults to two
// minutes, or to SnapshotTimeout when that is longer, and reaches the
// detector's policy with SnapshotTimeout; set below SnapshotTimeout or
// negative it is refused, and equal to it is allowed (requests never
// grow).
func TestSnapshotTimeoutMaxCapsTheGrowth(t *testing.T) {
	t.Parallel()
	d := Config{}.WithDefaults()
	require.Equal(t, 2*time.Minute, d.SnapshotTimeoutMax)
	pol := d.gapPolicy()
	require.Equal(t, 5*time.Second, pol.SnapshotTimeout)
	require.Equal(t, 2*time.Minute, pol.SnapshotTimeoutMax)

	// Unset, the cap is never below the first timeout.
	require.Equal(t, 3*time.Minute, Config{SnapshotTimeout: 3 * time.Minute}.WithDefaults().SnapshotTimeoutMax)
	err := Config{SnapshotTimeout: 3 * time.Minute, SnapshotTimeoutMax: 2 * time.Minute}.WithDefaults().Validate()
	require.ErrorContains(t, err, "snapshot-timeout-max 2m0s is below snapshot-timeout 3m0s")
	err = Config{SnapshotTimeoutMax: -time.Second}.WithDefaults().Validate()
	require.ErrorContains(t, err, "snapshot-timeout-max, snapshot-concurrency, gap-retry-min and gap-retry-max must not be negative")
	// Other settings are missing; none of the errors is about these.
	err = Config{SnapshotTimeout: time.Second, SnapshotTimeoutMax: time.Second}.WithDefaults().Validate()
	require.Error(t, err)
	require.NotContains(t, err.Error(), "snapshot-timeout")
}

// TestSnapshotRedirectsDefaultToSameOrigin: the authority's redirects are
// followed within its origin unless the config says none; any other rule
// is refused.
func TestSnapshotRedirectsDefaultToSameOrigin(t *testing.T) {
	t.Parallel()
	require.Equal(t, snapshot.SameOrigin, Config{}.WithDefaults().SnapshotRedirects)
	err := Config{SnapshotRedirects: "anywhere"}.WithDefaults().Validate()
	require.ErrorContains(t, err, `snapshot-redirects: "anywhere" is not same-origin or none`)
	err = Config{SnapshotRedirects: snapshot.NoRedirects}.WithDefaults().Validate()
	require.Error(t, err) // other settings are missing
	require.NotContains(t, err.Error(), "snapshot-redirects")
}

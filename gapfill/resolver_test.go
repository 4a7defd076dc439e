package gapfill_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
	"github.com/projector/projector/gapfill"
)

// Fakes of the resolver's own small interfaces: they stand for the store,
// the log and the authority, and record how they were called.

type fakeStore struct {
	mu    sync.Mutex
	rows  map[string]gapfill.Row
	err   error
	calls [][]string
	trace *[]string
}

func (f *fakeStore) Rows(_ context.Context, ids []string) (map[string]gapfill.Row, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, slices.Clone(ids))
	if f.trace != nil {
		*f.trace = append(*f.trace, fmt.Sprintf("store %v", ids))
	}
	if f.err != nil {
		return nil, f.err
	}
	out := map[string]gapfill.Row{}
	for _, id := range ids {
		if r, ok := f.rows[id]; ok {
			out[id] = r
		}
	}
	return out, nil
}

type logCall struct {
	jobs []string
	from time.Time
}

type fakeLog struct {
	mu     sync.Mutex
	inputs []gapfill.Input
	err    error
	calls  []logCall
	trace  *[]string
}

func (f *fakeLog) Reread(_ context.Context, jobs []string, from time.Time) ([]gapfill.Input, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, logCall{jobs: slices.Clone(jobs), from: from})
	if f.trace != nil {
		*f.trace = append(*f.trace, fmt.Sprintf("log %v", jobs))
	}
	if f.err != nil {
		return nil, f.err
	}
	var out []gapfill.Input
	for _, in := range f.inputs {
		if slices.Contains(jobs, in.Event.JobID) {
			out = append(out, in)
		}
	}
	return out, nil
}

type fakeAuthority struct {
	mu     sync.Mutex
	events map[string]event.Event
	errs   map[string]error
	calls  []string
	trace  *[]string
	// gate, when set, holds every Fetch until a value arrives on it.
	gate                  chan struct{}
	inflight, maxInflight int
}

func (f *fakeAuthority) Fetch(ctx context.Context, id string) (event.Event, error) {
	f.mu.Lock()
	f.calls = append(f.calls, id)
	if f.trace != nil {
		*f.trace = append(*f.trace, "snapshot "+id)
	}
	f.inflight++
	f.maxInflight = max(f.maxInflight, f.inflight)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inflight--
		f.mu.Unlock()
	}()
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return event.Event{}, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errs[id]; err != nil {
		return event.Event{}, err
	}
	ev, ok := f.events[id]
	if !ok {
		return event.Event{}, fmt.Errorf("GET /jobs/%s: 404: %w", id, errNoAuthority)
	}
	return ev, nil
}

func (f *fakeAuthority) fetched() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(slices.Values(f.calls))
}

var rt0 = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

func incDelta(t *testing.T, job string, v int64) event.Event {
	t.Helper()
	return decodeEvent(t, map[string]any{
		"job_id": job, "version": v, "kind": "delta", "event_id": fmt.Sprintf("%s-e%d", job, v),
		"ops": []map[string]any{{"op": "increment", "path": "/n", "by": 1}},
	})
}

func snapshotEvent(t *testing.T, job string, v int64) event.Event {
	t.Helper()
	return decodeEvent(t, map[string]any{
		"job_id": job, "version": v, "kind": "snapshot", "event_id": fmt.Sprintf("%s-auth%d", job, v),
		"state": json.RawMessage(fmt.Sprintf(`{"n":%d}`, v)),
	})
}

// heldJob is a job whose row is at version v with state {"n":v}, holding
// increments of /n at the given versions, each held since its version's
// seconds after rt0.
func heldJob(t *testing.T, id string, v int64, held ...int64) gapfill.Job {
	t.Helper()
	raw := json.RawMessage(fmt.Sprintf(`{"n":%d}`, v))
	state, err := delta.DecodeState(raw)
	require.NoError(t, err)
	j := gapfill.Job{ID: id, Version: v, State: state, Raw: raw, Held: map[int64]gapfill.Held{}}
	for _, h := range held {
		at := rt0.Add(time.Duration(h) * time.Second)
		j.Held[h] = gapfill.Held{Input: gapfill.Input{Event: incDelta(t, id, h), Offset: 100 + h, At: at}, Since: at}
	}
	return j
}

func row(v int64) gapfill.Row {
	return gapfill.Row{Version: v, State: json.RawMessage(fmt.Sprintf(`{"n":%d}`, v)), EventID: fmt.Sprintf("other-writer-%d", v)}
}

func byID(res []gapfill.Resolution) map[string]gapfill.Resolution {
	out := map[string]gapfill.Resolution{}
	for _, r := range res {
		out[r.JobID] = r
	}
	return out
}

// offer does what the caller does with a resolution: the row it found,
// if any, with the job's held deltas, then its inputs, through Advance.
func offer(t *testing.T, j gapfill.Job, r gapfill.Resolution) (gapfill.Job, gapfill.Outcome) {
	t.Helper()
	if r.Row != nil {
		state, err := delta.DecodeState(r.Row.State)
		require.NoError(t, err)
		j = gapfill.Job{ID: j.ID, Version: r.Row.Version, State: state, Raw: r.Row.State, EventID: r.Row.EventID, Held: j.Held}
	}
	return gapfill.Advance(j, r.Inputs)
}

var bothSteps = []gapfill.Step{gapfill.StepReread, gapfill.StepSnapshot}

func TestResolverStoreRowClosesGap(t *testing.T) {
	t.Parallel()
	jobs := []gapfill.Job{
		heldJob(t, "a", 1, 3),    // the row moved to 2: 3 is next in line
		heldJob(t, "b", 1, 3, 4), // the row moved past every held delta
		heldJob(t, "c", 1, 4),    // the row moved to 2: 3 is still missing
		heldJob(t, "d", 1, 3),    // the row did not move
	}
	store := &fakeStore{rows: map[string]gapfill.Row{"a": row(2), "b": row(6), "c": row(2), "d": row(1)}}
	auth := &fakeAuthority{}
	r := &gapfill.Resolver{Store: store, Snapshots: auth}

	res := byID(r.Resolve(t.Context(), bothSteps, jobs, rt0.Add(time.Minute)))

	for _, id := range []string{"a", "b"} {
		got := res[id]
		require.True(t, got.Closed, "%s: %v", id, got.Err)
		require.Equal(t, gapfill.StepReread, got.By, id)
		require.Equal(t, gapfill.StepReread, got.Last, id)
		require.NoError(t, got.Err, id)
		require.NotNil(t, got.Row, id)
		require.Equal(t, store.rows[id], *got.Row, id)
		require.Empty(t, got.Inputs, id)
	}
	// c: the row moved but not far enough; the authority does not know it.
	require.False(t, res["c"].Closed)
	require.Equal(t, row(2), *res["c"].Row)
	require.ErrorIs(t, res["c"].Err, errNoAuthority)
	// d: nothing moved; no Row to offer.
	require.False(t, res["d"].Closed)
	require.Nil(t, res["d"].Row)
	require.Equal(t, gapfill.StepSnapshot, res["d"].Last)

	// The snapshot step ran only for the jobs the re-read left held.
	require.Equal(t, []string{"c", "d"}, auth.fetched())
	require.Equal(t, [][]string{{"a", "b", "c", "d"}}, store.calls)

	// The caller, offering the row with the job's held deltas, closes a
	// and b the same way, and credits the re-read.
	next, out := offer(t, jobs[0], res["a"])
	require.Equal(t, int64(3), next.Version)
	require.JSONEq(t, `{"n":3}`, string(next.Raw))
	require.True(t, out.Closed)
	require.Equal(t, gapfill.FromReread, out.ClosedBy)
	require.Equal(t, []int64{3}, out.Released)

	next, out = offer(t, jobs[1], res["b"])
	require.Equal(t, int64(6), next.Version)
	require.Empty(t, next.Held)
	require.True(t, out.Closed)
	require.Equal(t, gapfill.FromReread, out.ClosedBy)
	require.ElementsMatch(t, []int64{3, 4}, out.Released)
}

func TestResolverLogFindsMissingDelta(t *testing.T) {
	t.Parallel()
	a := heldJob(t, "a", 1, 4, 3) // held since +4s and +3s
	b := heldJob(t, "b", 1, 4)
	log := &fakeLog{inputs: []gapfill.Input{
		{Event: incDelta(t, "a", 1), Partition: 2, Offset: 7},  // already applied
		{Event: incDelta(t, "a", 2), Partition: 2, Offset: 8},  // the missing one
		{Event: incDelta(t, "b", 2), Partition: 5, Offset: 9},  // one of two missing
		{Event: incDelta(t, "z", 2), Partition: 5, Offset: 10}, // not asked for
	}}
	r := &gapfill.Resolver{Log: log, Window: time.Minute}
	now := rt0.Add(time.Hour)

	res := byID(r.Resolve(t.Context(), []gapfill.Step{gapfill.StepReread}, []gapfill.Job{a, b}, now))

	got := res["a"]
	require.True(t, got.Closed, "%v", got.Err)
	require.Equal(t, gapfill.StepReread, got.By)
	require.NoError(t, got.Err)
	require.Nil(t, got.Row)
	require.Len(t, got.Inputs, 1, "only what is above the row")
	require.Equal(t, int64(2), got.Inputs[0].Event.Version)
	require.Equal(t, gapfill.FromReread, got.Inputs[0].Source)
	require.Equal(t, int64(8), got.Inputs[0].Offset)

	next, out := offer(t, a, got)
	require.Equal(t, int64(4), next.Version)
	require.JSONEq(t, `{"n":4}`, string(next.Raw))
	require.True(t, out.Closed)
	require.Equal(t, gapfill.FromReread, out.ClosedBy)

	require.False(t, res["b"].Closed)
	require.Equal(t, gapfill.StepReread, res["b"].Last)
	require.ErrorContains(t, res["b"].Err, "versions [3] not found in the store or the log")
	require.Len(t, res["b"].Inputs, 1, "what the log found is still worth offering")

	// One read of the log for both jobs, from the oldest hold less the
	// window.
	require.Len(t, log.calls, 1)
	require.ElementsMatch(t, []string{"a", "b"}, log.calls[0].jobs)
	require.Equal(t, rt0.Add(3*time.Second-time.Minute), log.calls[0].from)
}

func TestResolverSnapshotClosesGap(t *testing.T) {
	t.Parallel()
	j := heldJob(t, "a", 1, 3, 4)
	store := &fakeStore{rows: map[string]gapfill.Row{"a": row(1)}}
	log := &fakeLog{}
	auth := &fakeAuthority{events: map[string]event.Event{"a": snapshotEvent(t, "a", 4)}}
	r := &gapfill.Resolver{Store: store, Log: log, Snapshots: auth}
	now := rt0.Add(time.Hour)

	got := r.Resolve(t.Context(), bothSteps, []gapfill.Job{j}, now)[0]

	require.True(t, got.Closed, "%v", got.Err)
	require.Equal(t, gapfill.StepSnapshot, got.By)
	require.Equal(t, gapfill.StepSnapshot, got.Last)
	require.NoError(t, got.Err, "a closed gap carries no error from the steps before")
	require.Len(t, got.Inputs, 1)
	in := got.Inputs[0]
	require.Equal(t, gapfill.FromAuthority, in.Source)
	require.Equal(t, event.Snapshot, in.Event.Kind)
	require.Equal(t, int64(4), in.Event.Version)
	require.Equal(t, -1, in.Partition)
	require.Equal(t, now, in.At)

	next, out := offer(t, j, got)
	require.Equal(t, int64(4), next.Version)
	require.True(t, out.Closed)
	require.Equal(t, gapfill.FromAuthority, out.ClosedBy)
	require.ElementsMatch(t, []int64{3, 4}, out.Released)
}

func TestResolverSnapshotBelowGap(t *testing.T) {
	t.Parallel()
	auth := &fakeAuthority{events: map[string]event.Event{
		"between": snapshotEvent(t, "between", 3), // above the row, below the held 5
		"stale":   snapshotEvent(t, "stale", 1),   // at the row
		"older":   snapshotEvent(t, "older", 2),   // below the row
	}}
	r := &gapfill.Resolver{Snapshots: auth}
	jobs := []gapfill.Job{heldJob(t, "between", 1, 5), heldJob(t, "stale", 1, 5), heldJob(t, "older", 3, 5)}

	res := byID(r.Resolve(t.Context(), []gapfill.Step{gapfill.StepSnapshot}, jobs, rt0))

	got := res["between"]
	require.False(t, got.Closed)
	require.Equal(t, gapfill.StepSnapshot, got.Last)
	require.ErrorContains(t, got.Err, "at version 3")
	require.ErrorContains(t, got.Err, "still missing [4]")
	require.Len(t, got.Inputs, 1, "the snapshot still moves the row")
	next, out := offer(t, jobs[0], got)
	require.Equal(t, int64(3), next.Version)
	require.False(t, out.Closed)
	require.Equal(t, []int64{4}, next.Missing(10))

	require.False(t, res["stale"].Closed)
	require.ErrorContains(t, res["stale"].Err, "still missing [2 3 4]")
	require.False(t, res["older"].Closed)
	require.ErrorContains(t, res["older"].Err, "at version 2; still missing [4]")
}

func TestResolverAuthorityErrors(t *testing.T) {
	t.Parallel()
	unavailable := errors.New("GET /jobs/busy: 503 Service Unavailable")
	auth := &fakeAuthority{
		errs: map[string]error{"busy": unavailable},
		events: map[string]event.Event{
			"wrong-job":  snapshotEvent(t, "someone-else", 9),
			"wrong-kind": incDelta(t, "wrong-kind", 9),
			"not-object": {JobID: "not-object", Version: 9, Kind: event.Snapshot, State: []byte(`[1]`)},
		},
	}
	r := &gapfill.Resolver{Snapshots: auth}
	jobs := []gapfill.Job{
		heldJob(t, "unknown", 1, 3), heldJob(t, "busy", 1, 3),
		heldJob(t, "wrong-job", 1, 3), heldJob(t, "wrong-kind", 1, 3), heldJob(t, "not-object", 1, 3),
	}

	res := byID(r.Resolve(t.Context(), []gapfill.Step{gapfill.StepSnapshot}, jobs, rt0))

	for id, got := range res {
		require.False(t, got.Closed, id)
		require.Equal(t, gapfill.StepSnapshot, got.Last, id)
		require.Empty(t, got.Inputs, id)
		require.Error(t, got.Err, id)
	}
	require.ErrorIs(t, res["unknown"].Err, errNoAuthority)
	require.ErrorContains(t, res["unknown"].Err, "404")
	require.ErrorIs(t, res["busy"].Err, unavailable)
	require.ErrorContains(t, res["wrong-job"].Err, `"someone-else"`)
	require.ErrorContains(t, res["wrong-kind"].Err, "delta")
	require.ErrorContains(t, res["not-object"].Err, "must be a JSON object")
}

func TestResolverStepsOrder(t *testing.T) {
	t.Parallel()
	newRig := func() (*gapfill.Resolver, *[]string, *fakeAuthority) {
		var trace []string
		store := &fakeStore{rows: map[string]gapfill.Row{"a": row(5)}, trace: &trace}
		log := &fakeLog{trace: &trace}
		auth := &fakeAuthority{events: map[string]event.Event{"a": snapshotEvent(t, "a", 9), "b": snapshotEvent(t, "b", 9)}, trace: &trace}
		return &gapfill.Resolver{Store: store, Log: log, Snapshots: auth}, &trace, auth
	}
	jobs := []gapfill.Job{heldJob(t, "a", 1, 3), heldJob(t, "b", 1, 3)}

	t.Run("reread then snapshot", func(t *testing.T) {
		t.Parallel()
		r, trace, _ := newRig()
		res := byID(r.Resolve(t.Context(), bothSteps, jobs, rt0))
		// a closes by the store re-read, so neither the log nor the
		// authority is asked about it.
		require.Equal(t, []string{"store [a b]", "log [b]", "snapshot b"}, *trace)
		require.Equal(t, gapfill.StepReread, res["a"].By)
		require.Equal(t, gapfill.StepSnapshot, res["b"].By)
	})
	t.Run("snapshot then reread", func(t *testing.T) {
		t.Parallel()
		r, trace, _ := newRig()
		res := byID(r.Resolve(t.Context(), []gapfill.Step{gapfill.StepSnapshot, gapfill.StepReread}, jobs, rt0))
		require.ElementsMatch(t, []string{"snapshot a", "snapshot b"}, *trace, "the re-read never runs once all are closed")
		require.Equal(t, gapfill.StepSnapshot, res["a"].By)
		require.Equal(t, gapfill.StepSnapshot, res["b"].By)
	})
	t.Run("reread only", func(t *testing.T) {
		t.Parallel()
		r, trace, auth := newRig()
		res := byID(r.Resolve(t.Context(), []gapfill.Step{gapfill.StepReread}, jobs, rt0))
		require.Equal(t, []string{"store [a b]", "log [b]"}, *trace)
		require.Empty(t, auth.fetched())
		require.False(t, res["b"].Closed)
		require.Equal(t, gapfill.StepReread, res["b"].Last)
	})
	t.Run("no steps", func(t *testing.T) {
		t.Parallel()
		r, trace, _ := newRig()
		res := r.Resolve(t.Context(), nil, jobs, rt0)
		require.Empty(t, *trace)
		require.Len(t, res, 2)
		for _, got := range res {
			require.False(t, got.Closed)
			require.NoError(t, got.Err)
		}
	})
	t.Run("canceled", func(t *testing.T) {
		t.Parallel()
		r, trace, _ := newRig()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		res := r.Resolve(ctx, bothSteps, jobs, rt0)
		require.Empty(t, *trace)
		require.Equal(t, []string{"a", "b"}, []string{res[0].JobID, res[1].JobID})
	})
}

func TestResolverStoreErrors(t *testing.T) {
	t.Parallel()
	boom := errors.New("connection refused")
	store := &fakeStore{err: boom}
	log := &fakeLog{inputs: []gapfill.Input{{Event: incDelta(t, "a", 2)}}}
	r := &gapfill.Resolver{Store: store, Log: log}

	res := byID(r.Resolve(t.Context(), []gapfill.Step{gapfill.StepReread}, []gapfill.Job{heldJob(t, "a", 1, 3), heldJob(t, "b", 1, 3)}, rt0))

	// The log half still runs: it closes a, and b keeps the store's error.
	require.True(t, res["a"].Closed)
	require.NoError(t, res["a"].Err)
	require.False(t, res["b"].Closed)
	require.ErrorIs(t, res["b"].Err, boom)
	require.ErrorContains(t, res["b"].Err, "re-read store")

	log.err = errors.New("broker down")
	store.err = nil
	res = byID(r.Resolve(t.Context(), []gapfill.Step{gapfill.StepReread}, []gapfill.Job{heldJob(t, "b", 1, 3)}, rt0))
	require.ErrorContains(t, res["b"].Err, "re-read log: broker down")
}

func TestResolverLeavesJobsAlone(t *testing.T) {
	t.Parallel()
	j := heldJob(t, "a", 1, 3, 5)
	before := fingerprint(j)
	heldBefore := maps.Clone(j.Held)
	store := &fakeStore{rows: map[string]gapfill.Row{"a": row(3)}}
	log := &fakeLog{inputs: []gapfill.Input{{Event: incDelta(t, "a", 4)}}}
	r := &gapfill.Resolver{Store: store, Log: log}

	got := r.Resolve(t.Context(), []gapfill.Step{gapfill.StepReread}, []gapfill.Job{j}, rt0)[0]

	require.True(t, got.Closed, "%v", got.Err)
	require.Equal(t, before, fingerprint(j))
	require.Equal(t, heldBefore, j.Held)
	// Offered as the caller does, the row and the log's find close it.
	next, out := offer(t, j, got)
	require.Equal(t, int64(5), next.Version)
	require.True(t, out.Closed)
}

// TestResolverConcurrency checks that no more than Concurrency snapshot
// fetches are in flight, and that every job is fetched. synctest's Wait
// returns once every goroutine is blocked, so the count is exact.
func TestResolverConcurrency(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ jobs, concurrency, bound int }{
		{7, 3, 3},
		{4, 0, 1}, // zero means one
		{2, 8, 2},
	} {
		t.Run(fmt.Sprintf("%d jobs concurrency %d", tc.jobs, tc.concurrency), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				auth := &fakeAuthority{events: map[string]event.Event{}, gate: make(chan struct{})}
				var jobs []gapfill.Job
				for i := range tc.jobs {
					id := fmt.Sprintf("job-%d", i)
					jobs = append(jobs, heldJob(t, id, 1, 3))
					auth.events[id] = snapshotEvent(t, id, 3)
				}
				r := &gapfill.Resolver{Snapshots: auth, Concurrency: tc.concurrency}
				done := make(chan []gapfill.Resolution)
				go func() { done <- r.Resolve(context.Background(), []gapfill.Step{gapfill.StepSnapshot}, jobs, rt0) }()

				for left := tc.jobs; left > 0; left-- {
					synctest.Wait()
					auth.mu.Lock()
					inflight := auth.inflight
					auth.mu.Unlock()
					require.Equal(t, min(tc.bound, left), inflight, "fetches in flight with %d left", left)
					auth.gate <- struct{}{}
				}
				res := <-done
				require.Equal(t, tc.bound, auth.maxInflight)
				require.Len(t, auth.fetched(), tc.jobs)
				for _, got := range res {
					require.True(t, got.Closed, "%s: %v", got.JobID, got.Err)
				}
			})
		})
	}
}

// errNoAuthority is what the fake authority answers for a job it does not
// know, as the real client's 404 does.
var errNoAuthority = errors.New("the authority does not know this job")

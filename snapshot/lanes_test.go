package snapshot_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/snapshot"
)

// laneAuthority answers "prompt-*" jobs at once and each "slow-*" job
// only when its channel is closed (or the test ends). It counts the
// requests it holds.
type laneAuthority struct {
	slow                  map[string]chan struct{}
	stop                  chan struct{}
	inFlight, maxInFlight atomic.Int32

	mu   sync.Mutex
	asks map[string][]time.Time
}

// asked returns when the authority was asked for id.
func (a *laneAuthority) asked(id string) []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.asks[id]...)
}

func (a *laneAuthority) serve(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, "/jobs/")
	a.mu.Lock()
	a.asks[id] = append(a.asks[id], time.Now())
	a.mu.Unlock()
	n := a.inFlight.Add(1)
	for m := a.maxInFlight.Load(); n > m && !a.maxInFlight.CompareAndSwap(m, n); m = a.maxInFlight.Load() {
	}
	if ch, ok := a.slow[id]; ok {
		select {
		case <-ch:
		case <-a.stop:
		case <-r.Context().Done():
		}
	}
	// Leave before answering: the client frees its slot only after the
	// answer, so this count never runs ahead of the client's.
	a.inFlight.Add(-1)
	_, _ = w.Write(snapshotValue(id, 1))
}

// laneClient is a client of a new laneAuthority with the given slow jobs,
// warmed up with enough prompt answers for a median.
func laneClient(t *testing.T, mainSlots, slowSlots int, slow ...string) (*snapshot.Client, *laneAuthority) {
	t.Helper()
	a := &laneAuthority{slow: map[string]chan struct{}{}, stop: make(chan struct{}), asks: map[string][]time.Time{}}
	for _, id := range slow {
		a.slow[id] = make(chan struct{})
	}
	srv, _ := serve(t, a.serve)
	// Registered after serve, so it runs before srv.Close waits on handlers.
	t.Cleanup(func() { close(a.stop) })
	c := client(t, srv)
	c.MaxConcurrent = mainSlots
	c.SlowConcurrent = slowSlots
	c.Timeout = 10 * time.Second
	require.Zero(t, c.Lanes().SlowAfter, "with no answers seen, no request can be told slow")
	for i := range 8 {
		_, err := c.Fetch(context.Background(), fmt.Sprintf("prompt-warm-%d", i))
		require.NoError(t, err)
	}
	if slowSlots > 0 {
		require.GreaterOrEqual(t, c.Lanes().SlowAfter, snapshot.SlowFloor)
	}
	return c, a
}

// A slow request leaves the main lane at the threshold: it moves to the
// slow lane and frees its main slot for prompt requests; still running at
// MovedThresholds times the threshold, it is cut with ErrSlow.
func TestFetchSlowLaneMovesThenCuts(t *testing.T) {
	t.Parallel()

	c, a := laneClient(t, 1, 2, "slow-1")
	c.MaxElapsedTime = time.Millisecond // one attempt
	ctx := context.Background()

	slow := fetchAsync(ctx, c, "slow-1")
	require.Eventually(t, func() bool { s := c.Lanes(); return s.Slow == 1 && s.Main == 0 }, wait, time.Millisecond)
	// The only main slot serves prompt requests while the slow one runs.
	for i := range 3 {
		require.NoError(t, receive(t, fetchAsync(ctx, c, fmt.Sprintf("prompt-%d", i)), "prompt answer beside a slow one"))
	}
	err := receive(t, slow, "the moved request's end")
	require.ErrorIs(t, err, snapshot.ErrSlow)
	require.ErrorContains(t, err, "moved to the slow lane")
	s := c.Lanes()
	require.Zero(t, s.Main)
	require.Zero(t, s.Slow)
	require.GreaterOrEqual(t, s.Moved, int64(1))
	require.GreaterOrEqual(t, s.Cut, int64(1))
	require.Len(t, a.asked("slow-1"), 1, "a cut request is not asked again by Fetch: it would start in the main lane")
	require.LessOrEqual(t, a.maxInFlight.Load(), int32(1+2))
}

// A job known to be slow starts in the slow lane: it takes no main slot,
// waits for a slow one, and only half the slow lane takes such requests,
// the rest staying free for requests that move over. A request past the
// threshold while the slow lane is full is cut at once with
// ErrSlowLaneFull.
func TestFetchSlowLaneStarts(t *testing.T) {
	t.Parallel()

	const mainSlots, slowSlots = 1, 2
	c, a := laneClient(t, mainSlots, slowSlots, "slow-1", "slow-2", "slow-3", "slow-4")
	ctx := context.Background()
	slowCtx := snapshot.InSlowLane(ctx)

	// Started in the slow lane: no main slot taken.
	slow1 := fetchAsync(slowCtx, c, "slow-1")
	require.Eventually(t, func() bool { s := c.Lanes(); return s.Slow == 1 && s.Started == 1 }, wait, time.Millisecond)
	require.Zero(t, c.Lanes().Main)
	require.NoError(t, receive(t, fetchAsync(ctx, c, "prompt-0"), "a prompt answer beside a started slow request"))

	// Half the slow lane (one slot) takes started requests: the next
	// waits, though a slow slot is free.
	slow2 := fetchAsync(slowCtx, c, "slow-2")
	require.Never(t, func() bool { return c.Lanes().Started > 1 || len(a.asked("slow-2")) > 0 }, 200*time.Millisecond, 5*time.Millisecond)

	// A main request past the threshold moves into the free slot; with
	// the slow lane then full, the next one past the threshold is cut at
	// once, long before its answer or the Timeout.
	slow3 := fetchAsync(ctx, c, "slow-3")
	require.Eventually(t, func() bool { s := c.Lanes(); return s.Slow == 2 && s.Moved == 1 }, wait, time.Millisecond)
	slow4 := fetchAsync(ctx, c, "slow-4")
	err := receive(t, slow4, "the cut request's end")
	require.ErrorIs(t, err, snapshot.ErrSlowLaneFull)
	require.NotErrorIs(t, err, snapshot.ErrSlow, "a cut with the slow lane full says nothing certain about the job")
	require.ErrorContains(t, err, "while the slow lane was full")
	require.GreaterOrEqual(t, c.Lanes().Full, int64(1))
	require.Len(t, a.asked("slow-4"), 1, "a cut request is not asked again by Fetch")

	// The started request's answer frees its slots: the waiting one starts.
	close(a.slow["slow-1"])
	require.NoError(t, receive(t, slow1, "slow-1's answer"))
	require.Eventually(t, func() bool { return c.Lanes().Started == 2 }, wait, time.Millisecond)
	close(a.slow["slow-2"])
	require.NoError(t, receive(t, slow2, "slow-2's answer"))
	close(a.slow["slow-3"])
	_ = receive(t, slow3, "slow-3's end") // answered, or cut if it ran long
	require.LessOrEqual(t, a.maxInFlight.Load(), int32(mainSlots+slowSlots))
}

// A request started in the slow lane runs to Timeout: it is not cut.
func TestFetchSlowLaneKeepsTimeout(t *testing.T) {
	t.Parallel()

	c, _ := laneClient(t, 1, 1, "slow")
	c.Timeout = 300 * time.Millisecond
	c.MaxElapsedTime = time.Millisecond // one attempt
	require.Less(t, snapshot.MovedThresholds*c.Lanes().SlowAfter, c.Timeout, "the test needs a cut to come before the timeout")
	start := time.Now()
	done := fetchAsync(snapshot.InSlowLane(context.Background()), c, "slow")
	require.Eventually(t, func() bool { return c.Lanes().Slow == 1 }, wait, time.Millisecond)
	err := receive(t, done, "the slow request's end")
	took := time.Since(start)
	require.ErrorContains(t, err, "no answer within 300ms")
	require.ErrorIs(t, err, snapshot.ErrSlow, "a timeout is a slow outcome too")
	require.GreaterOrEqual(t, took, 300*time.Millisecond)
	require.Zero(t, c.Lanes().Slow)
	require.Zero(t, c.Lanes().Cut)

	// Its slot is free again.
	_, err = c.Fetch(context.Background(), "prompt-after")
	require.NoError(t, err)
}

// Without a slow lane a slow request holds its slot to the end.
func TestFetchNoSlowLane(t *testing.T) {
	t.Parallel()

	c, a := laneClient(t, 1, 0, "slow")
	require.Zero(t, c.Lanes().SlowAfter)
	done := fetchAsync(context.Background(), c, "slow")
	require.Eventually(t, func() bool { return a.inFlight.Load() == 1 }, wait, time.Millisecond)
	blocked := fetchAsync(context.Background(), c, "prompt")
	select {
	case err := <-blocked:
		t.Fatalf("a second request ran beside the only slot's slow one (err %v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	require.Zero(t, c.Lanes().Moved)
	close(a.slow["slow"])
	require.NoError(t, receive(t, done, "the slow answer"))
	require.NoError(t, receive(t, blocked, "the prompt answer"))
}

// Requests cut with the slow lane full count towards the median at the
// threshold they ran: when the authority slows down as a whole and fills
// the slow lane, the threshold rises with it, rather than every request
// being cut at a median no answer comes in under any more.
func TestFetchSlowLaneCutsRaiseTheThreshold(t *testing.T) {
	t.Parallel()

	var slow []string
	for i := range 12 {
		slow = append(slow, fmt.Sprintf("slow-%d", i))
	}
	c, a := laneClient(t, 1, 1, append(slow, "holds-the-slow-lane")...)
	c.MaxElapsedTime = time.Millisecond // one attempt
	ctx := context.Background()
	held := fetchAsync(snapshot.InSlowLane(ctx), c, "holds-the-slow-lane")
	require.Eventually(t, func() bool { return c.Lanes().Slow == 1 }, wait, time.Millisecond)
	before := c.Lanes().SlowAfter

	for _, id := range slow {
		_, err := c.Fetch(ctx, id)
		require.ErrorIs(t, err, snapshot.ErrSlowLaneFull)
	}
	// 8 prompt answers and 12 cuts: the median is a cut's threshold.
	require.Greater(t, c.Lanes().SlowAfter, before)
	require.GreaterOrEqual(t, c.Lanes().SlowAfter, snapshot.SlowMedians*snapshot.SlowFloor)
	close(a.slow["holds-the-slow-lane"])
	require.NoError(t, receive(t, held, "the started request's answer"))
}

// A request cut with the slow lane full counts towards the median once, at
// the threshold it ran, even when the authority had sent its status line
// and the cut came while the body was on its way: a cut is no answer, and
// counted twice, cuts would raise the threshold with half as many of them.
func TestFetchSlowLaneCutAfterHeadersCountsOnce(t *testing.T) {
	t.Parallel()

	a := &laneAuthority{slow: map[string]chan struct{}{"holds-the-slow-lane": make(chan struct{})}, stop: make(chan struct{}), asks: map[string][]time.Time{}}
	srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/jobs/headers-") {
			// The status line now, the body never.
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			select {
			case <-a.stop:
			case <-r.Context().Done():
			}
			return
		}
		a.serve(w, r)
	})
	t.Cleanup(func() { close(a.stop) })
	c := client(t, srv)
	c.MaxConcurrent, c.SlowConcurrent = 1, 1
	c.Timeout = 10 * time.Second
	c.MaxElapsedTime = time.Millisecond // one attempt
	ctx := context.Background()
	for i := range 8 {
		_, err := c.Fetch(ctx, fmt.Sprintf("prompt-warm-%d", i))
		require.NoError(t, err)
	}
	// The floor, or three times the answers' median on a machine too
	// loaded to answer within a third of it.
	before := c.Lanes().SlowAfter
	held := fetchAsync(snapshot.InSlowLane(ctx), c, "holds-the-slow-lane")
	require.Eventually(t, func() bool { return c.Lanes().Slow == 1 }, wait, time.Millisecond)

	// 8 answers and 5 cuts: the median is an answer's, the threshold
	// stays where the answers put it. Each cut counted twice would make it a cut's.
	for i := range 5 {
		_, err := c.Fetch(ctx, fmt.Sprintf("headers-%d", i))
		require.ErrorIs(t, err, snapshot.ErrSlowLaneFull)
	}
	require.EqualValues(t, 5, c.Lanes().Full)
	// Counted once, the median is the 7th of 13: an answer's, and the
	// threshold stays below three times the one the cuts ran at. Counted
	// twice, it is a cut's (the threshold it ran at), and the threshold
	// becomes three times that.
	require.Less(t, c.Lanes().SlowAfter, snapshot.SlowMedians*before, "a cut counted towards the median more than once")
	close(a.slow["holds-the-slow-lane"])
	require.NoError(t, receive(t, held, "the started request's answer"))
}

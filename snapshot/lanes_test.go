package snapshot_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
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
}

func (a *laneAuthority) serve(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, "/jobs/")
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
	a := &laneAuthority{slow: map[string]chan struct{}{}, stop: make(chan struct{})}
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

func TestFetchSlowLane(t *testing.T) {
	t.Parallel()

	const mainSlots, slowSlots = 2, 2
	c, a := laneClient(t, mainSlots, slowSlots, "slow-1", "slow-2", "slow-3", "slow-4")
	ctx := context.Background()

	// Two slow requests take both main slots, then move to the slow lane.
	slows := []<-chan error{fetchAsync(ctx, c, "slow-1")}
	require.Eventually(t, func() bool { return c.Lanes().Slow == 1 }, wait, time.Millisecond)
	slows = append(slows, fetchAsync(ctx, c, "slow-2"))
	require.Eventually(t, func() bool { s := c.Lanes(); return s.Slow == 2 && s.Main == 0 }, wait, time.Millisecond)

	// Prompt requests go through while both are still in flight.
	for i := range 5 {
		require.NoError(t, receive(t, fetchAsync(ctx, c, fmt.Sprintf("prompt-%d", i)), "prompt answer beside slow ones"))
	}

	// With the slow lane full, two more slow requests keep their main
	// slots: in flight stays bounded, and a prompt request waits.
	slows = append(slows, fetchAsync(ctx, c, "slow-3"), fetchAsync(ctx, c, "slow-4"))
	require.Eventually(t, func() bool {
		s := c.Lanes()
		// A prompt request delayed past the threshold on a busy machine
		// counts in Kept too.
		return s.Main == mainSlots && s.Slow == slowSlots && s.Kept >= 2
	}, wait, time.Millisecond)
	blocked := fetchAsync(ctx, c, "prompt-waits")
	select {
	case err := <-blocked:
		t.Fatalf("a request ran while every slot of both lanes was held (err %v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	require.EqualValues(t, mainSlots+slowSlots, a.inFlight.Load())

	// A slow answer frees a slow slot: the longest overdue request moves
	// to it, and its main slot goes to the waiting prompt request.
	close(a.slow["slow-1"])
	require.NoError(t, receive(t, slows[0], "slow-1's answer"))
	require.NoError(t, receive(t, blocked, "the waiting prompt request's answer"))
	require.Eventually(t, func() bool { s := c.Lanes(); return s.Slow == slowSlots && s.Main == 1 }, wait, time.Millisecond)

	// The next slow answer moves the other overdue request.
	close(a.slow["slow-2"])
	require.NoError(t, receive(t, slows[1], "slow-2's answer"))
	require.Eventually(t, func() bool { s := c.Lanes(); return s.Slow == slowSlots && s.Main == 0 }, wait, time.Millisecond)
	require.GreaterOrEqual(t, c.Lanes().Moved, int64(4))

	// Every slow request is still answered: a move changes which limit a
	// request counts against, nothing else.
	close(a.slow["slow-3"])
	close(a.slow["slow-4"])
	require.NoError(t, receive(t, slows[2], "slow-3's answer"))
	require.NoError(t, receive(t, slows[3], "slow-4's answer"))
	s := c.Lanes()
	require.Zero(t, s.Main)
	require.Zero(t, s.Slow)
	require.GreaterOrEqual(t, s.Moved, int64(4))
	require.GreaterOrEqual(t, s.Kept, int64(2))
	require.LessOrEqual(t, a.maxInFlight.Load(), int32(mainSlots+slowSlots))
}

// A request in the slow lane still ends at Timeout.
func TestFetchSlowLaneKeepsTimeout(t *testing.T) {
	t.Parallel()

	c, _ := laneClient(t, 1, 1, "slow")
	c.Timeout = 300 * time.Millisecond
	c.MaxElapsedTime = time.Millisecond // one attempt
	start := time.Now()
	done := fetchAsync(context.Background(), c, "slow")
	require.Eventually(t, func() bool { return c.Lanes().Slow == 1 }, wait, time.Millisecond)
	err := receive(t, done, "the slow request's end")
	took := time.Since(start)
	require.ErrorContains(t, err, "no answer within 300ms")
	require.GreaterOrEqual(t, took, 300*time.Millisecond)
	require.Less(t, took, 3*time.Second)
	require.Zero(t, c.Lanes().Slow)

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

package projection

import (
	"bytes"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestALiveHeapNearTheMemoryLimitIsLogged: with the live heap past 80% of
// the soft limit the watch warns, says both sizes and what to change, and
// says it again only after nearLimitEvery; far from the limit, or with
// none, it says nothing.
func TestALiveHeapNearTheMemoryLimitIsLogged(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	var out bytes.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	keep := make([]byte, 64<<20) // a live heap of at least 64 MiB
	runtime.GC()
	w := newMemoryWatch()
	now := time.Now()

	w.check(log, now)
	require.Empty(t, out.String(), "no limit: nothing to say")

	debug.SetMemoryLimit(1 << 40)
	runtime.GC()
	w.check(log, now)
	require.Empty(t, out.String(), "a live heap far below the limit: nothing to say")

	debug.SetMemoryLimit(70 << 20) // 64 MiB of 70: past 80%
	runtime.GC()
	w.check(log, now)
	require.Contains(t, out.String(), "live heap near the soft memory limit")
	require.Contains(t, out.String(), "raise --memory-limit")
	require.Contains(t, out.String(), "memory_limit_bytes=73400320")
	require.Contains(t, out.String(), "level=WARN")

	out.Reset()
	w.check(log, now.Add(nearLimitEvery/2))
	require.Empty(t, out.String(), "said again only after a while")
	w.check(log, now.Add(nearLimitEvery))
	require.Contains(t, out.String(), "live heap near the soft memory limit")
	runtime.KeepAlive(keep)
}

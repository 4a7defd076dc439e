package projection

import (
	"log/slog"
	"math"
	"runtime/metrics"
	"time"
)

// nearLimitShare is the share of the soft memory limit a live heap may
// reach before it is reported: past it the collector has little room to
// work in and runs nearly without pause, and the rate falls.
const nearLimitShare = 0.8

// nearLimitEvery is how often a live heap that stays near the limit is
// reported again.
const nearLimitEvery = 5 * time.Minute

// memoryWatch reports, at most every nearLimitEvery, a live heap near the
// process's soft memory limit (--memory-limit, GOMEMLIMIT): the limit is
// soft, so such a heap is not refused, only collected over and over, and
// without a word the instance would just run slower.
type memoryWatch struct {
	samples []metrics.Sample
	warned  time.Time
}

func newMemoryWatch() *memoryWatch {
	return &memoryWatch{samples: []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/gomemlimit:bytes"}}}
}

// check reads the live heap the last collection marked and the limit, and
// logs a warning when the one is near the other.
func (m *memoryWatch) check(log *slog.Logger, now time.Time) {
	metrics.Read(m.samples)
	if m.samples[0].Value.Kind() != metrics.KindUint64 || m.samples[1].Value.Kind() != metrics.KindUint64 {
		return
	}
	live, limit := m.samples[0].Value.Uint64(), m.samples[1].Value.Uint64()
	if limit == 0 || limit >= math.MaxInt64 || float64(live) < nearLimitShare*float64(limit) {
		return
	}
	if !m.warned.IsZero() && now.Sub(m.warned) < nearLimitEvery {
		return
	}
	m.warned = now
	log.Warn("live heap near the soft memory limit: the garbage collector runs nearly all the time and the rate falls; raise --memory-limit (or lower --cache-bytes, --batches-in-flight or --batch-size)",
		"live_heap_bytes", live, "memory_limit_bytes", limit)
}

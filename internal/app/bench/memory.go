package bench

import (
	"bufio"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"time"
)

// memSampler records this process's peak heap, peak live heap and resident
// set while the projector runs. Heap is sampled (runtime/metrics, every 10
// ms): the heap's objects, swept or not, and the live heap the last
// collection marked (what the configuration bounds; the heap reaches about
// twice it at GOGC 100); the RSS
// peak is the kernel's high-water mark, reset at the start when the kernel
// allows it, and the sampled maximum otherwise.
type memSampler struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	heap     int64
	live     int64
	rss      int64
	baseHeap int64
	hwmReset bool
}

const (
	heapMetric = "/memory/classes/heap/objects:bytes"
	liveMetric = "/gc/heap/live:bytes"
)

func startMemSampler() *memSampler {
	// What came before (the generated stream, the baselines) is garbage by
	// now: collect it and give it back so it does not count.
	runtime.GC()
	debug.FreeOSMemory()
	m := &memSampler{stop: make(chan struct{})}
	m.baseHeap = heapBytes()
	// Writing 5 to clear_refs resets the VmHWM peak (Linux 4.0+).
	m.hwmReset = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
	m.sample()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-t.C:
				m.sample()
			}
		}
	}()
	return m
}

func heapBytes() int64 {
	s := []metrics.Sample{{Name: heapMetric}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

func (m *memSampler) sample() {
	s := []metrics.Sample{{Name: heapMetric}, {Name: liveMetric}}
	metrics.Read(s)
	h, l := int64(s[0].Value.Uint64()), int64(s[1].Value.Uint64())
	r := procStatusBytes("/proc/self/status", "VmRSS:")
	m.mu.Lock()
	m.heap, m.live, m.rss = max(m.heap, h), max(m.live, l), max(m.rss, r)
	m.mu.Unlock()
}

// finish stops sampling and returns the peaks.
func (m *memSampler) finish() (heap, live, rss, baseHeap int64) {
	close(m.stop)
	m.wg.Wait()
	m.sample()
	rss = m.rss
	if m.hwmReset {
		rss = max(rss, procStatusBytes("/proc/self/status", "VmHWM:"))
	}
	return m.heap, m.live, rss, m.baseHeap
}

// procStatusBytes reads a "Name:   N kB" line of a /proc status file.
func procStatusBytes(path, field string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/projector/projector/store"
	"github.com/projector/projector/wait"
)

// holdWaiters starts a Waiter on st's projection, on a pool of its own as
// `projector run --api-addr` has, and holds n waits on jobs the stream
// never writes: every batch the engine commits is announced and wakes the
// waiter loop, which reads the waits the batch may concern, and all of
// them every second. It records in the report the goroutines and heap
// they took. The runs beside them start once every wait is held and was
// read once. release ends the waits and stops the Waiter.
func (r *run) holdWaiters(ctx context.Context, st *store.Store, n int) (release func(), err error) {
	pool, err := store.OpenPoolOf(ctx, r.cfg.DatabaseURL, 2)
	if err != nil {
		return nil, fmt.Errorf("bench: the waiters' pool: %w", err)
	}
	ws, err := store.New(pool, store.Config{Schema: st.Schema(), Table: st.Projection()})
	if err != nil {
		pool.Close()
		return nil, err
	}
	w, err := wait.New(wait.Config{Store: ws, MaxWaiters: n, Logger: r.cfg.Logger})
	if err != nil {
		pool.Close()
		return nil, err
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	// The waits' goroutines (the callers', the Waiter's and those they
	// start) carry a label, so what they take is counted apart from the
	// rest of the process, whose goroutines come and go meanwhile.
	labels := pprof.Labels(waitsLabel, waitsLabel)
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	ran := make(chan struct{})
	go pprof.Do(runCtx, labels, func(runCtx context.Context) {
		defer close(ran)
		_ = w.Run(runCtx)
	})
	waitCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, n)
	for i := range n {
		go pprof.Do(waitCtx, labels, func(waitCtx context.Context) {
			_, err := w.WaitJob(waitCtx, fmt.Sprintf("never-written-%d", i), 1)
			done <- err
		})
	}
	release = func() {
		cancel()
		for range n {
			<-done
		}
		stop()
		<-ran
		pool.Close()
	}
	// Held, and each read once: a run beside them measures waits held,
	// not waits arriving (whose first read is one query for all of them).
	// What they take is counted as soon as all are held.
	counted := false
	count := func() {
		counted = true
		r.rep.WaitersGoroutines = labeledGoroutines(waitsLabel, waitsLabel)
		runtime.GC()
		runtime.ReadMemStats(&after)
		r.rep.WaitersHeapBytes = int64(after.HeapAlloc) - int64(before.HeapAlloc)
	}
	deadline := time.Now().Add(time.Minute)
	for w.Waiting() < n || w.Unread() > 0 {
		if !counted && w.Waiting() >= n {
			count()
		}
		if time.Now().After(deadline) {
			release()
			return nil, errors.New("bench: the waits were not all held and read once within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !counted {
		count()
	}
	return release, nil
}

// waitsLabel labels the goroutines of the waits a run holds.
const waitsLabel = "bench-waits"

// labeledGoroutines counts this process's goroutines labelled key=value
// (runtime/pprof), from the goroutine profile's text form: each stack's
// count, then its labels on the line after.
func labeledGoroutines(key, value string) int {
	var b bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
		return 0
	}
	want := strconv.Quote(key) + ":" + strconv.Quote(value)
	total, count := 0, 0
	for _, line := range strings.Split(b.String(), "\n") {
		if n, _, ok := strings.Cut(line, " @ "); ok {
			count, _ = strconv.Atoi(n)
			continue
		}
		if strings.HasPrefix(line, "# labels: ") && strings.Contains(line, want) {
			total += count
			count = 0
		}
	}
	return total
}

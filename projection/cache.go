package projection

import (
	"bytes"
	"container/list"
	"sync"
	"sync/atomic"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/gapfill"
)

// DefaultCacheBytes is the default of [Config.CacheBytes].
const DefaultCacheBytes = 64 << 20

// cacheBudget is the one memory budget, in bytes, that every partition's
// job cache of an instance shares. Jobs that hold nothing are kept in
// least-recently-used order and the oldest are evicted, one at a time, as
// soon as the total passes the limit, whichever partition they belong to.
// Held jobs are pinned: they are the gap detector's memory, so they are
// never evicted, but their bytes count, and once pinned bytes pass half
// the limit their held deltas' ops are left in PostgreSQL (see
// [jobCache.put]).
type cacheBudget struct {
	limit int64

	mu     sync.Mutex
	used   int64
	pinned int64
	lru    list.List // of *cacheEntry, most recently used first
	// spilled counts cached held jobs whose held deltas' ops were left in
	// PostgreSQL.
	spilled int

	evictions atomic.Int64
}

func newCacheBudget(limit int64) *cacheBudget {
	return &cacheBudget{limit: limit}
}

// cacheEntry is one cached job; elem is nil while the job is pinned.
type cacheEntry struct {
	owner *jobCache
	job   gapfill.Job
	size  int64
	elem  *list.Element
	// spilled is set when some of its held deltas' ops are in PostgreSQL
	// only.
	spilled bool
}

// jobCache is a partition worker's view of its jobs' rows, drawn from the
// instance's budget. Jobs with held deltas are always in it; the rest is
// an optimisation only, because every write still carries its version
// condition. It keeps states as raw JSON: [gapfill.Advance] decodes one
// when a delta needs it.
type jobCache struct {
	b    *cacheBudget
	jobs map[string]*cacheEntry // guarded by b.mu
}

func newJobCache(b *cacheBudget) *jobCache {
	return &jobCache{b: b, jobs: make(map[string]*cacheEntry)}
}

// get returns a job and marks it used.
func (c *jobCache) get(id string) (gapfill.Job, bool) {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	e, ok := c.jobs[id]
	if !ok {
		return gapfill.Job{}, false
	}
	if e.elem != nil {
		c.b.lru.MoveToFront(e.elem)
	}
	return e.job, true
}

// peek is get without marking the job used.
func (c *jobCache) peek(id string) (gapfill.Job, bool) {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	e, ok := c.jobs[id]
	if !ok {
		return gapfill.Job{}, false
	}
	return e.job, true
}

// put stores j as the job's row and held set, then evicts the least
// recently used jobs that hold nothing while the budget is exceeded.
func (c *jobCache) put(j gapfill.Job) {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	old, had := c.jobs[j.ID]
	if had {
		c.remove(old)
	}
	// A deleted job is remembered by its tombstone, which the pruner may
	// remove at any time: unless the detector needs it for held deltas,
	// the store is asked again, so a pruned tombstone is seen at once.
	if j.Deleted && len(j.Held) == 0 {
		return
	}
	j = compact(j, old, had)
	if len(j.Held) > 0 && b.pinned > b.limit/2 {
		j.Held = spill(j.Held)
	}
	e := &cacheEntry{owner: c, job: j, size: jobBytes(j), spilled: spilled(j)}
	c.jobs[j.ID] = e
	if e.spilled {
		b.spilled++
	}
	b.used += e.size
	if len(j.Held) > 0 {
		b.pinned += e.size
	} else {
		e.elem = b.lru.PushFront(e)
	}
	for b.used > b.limit {
		last := b.lru.Back()
		if last == nil {
			break
		}
		victim := last.Value.(*cacheEntry)
		victim.owner.remove(victim)
		b.evictions.Add(1)
	}
}

// remove drops e from its cache and the budget; b.mu is held.
func (c *jobCache) remove(e *cacheEntry) {
	b := c.b
	delete(c.jobs, e.job.ID)
	b.used -= e.size
	if e.spilled {
		b.spilled--
	}
	if e.elem != nil {
		b.lru.Remove(e.elem)
		e.elem = nil
	} else {
		b.pinned -= e.size
	}
}

// keepsOps reports whether a held job put now keeps its held deltas' ops
// in memory: pinned bytes are within half the budget.
func (c *jobCache) keepsOps() bool {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	return c.b.pinned <= c.b.limit/2
}

// forget drops a job that holds nothing.
func (c *jobCache) forget(id string) {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	if e, ok := c.jobs[id]; ok && len(e.job.Held) == 0 {
		c.remove(e)
	}
}

// reset drops every job of this partition.
func (c *jobCache) reset() {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	for _, e := range c.jobs {
		c.remove(e)
	}
}

// len is the number of jobs cached for this partition.
func (c *jobCache) len() int {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	return len(c.jobs)
}

// compact drops the decoded state (the raw bytes are what is kept and
// counted) and gives the raw bytes their own allocation, so a cached job
// never keeps a whole record or response alive. Bytes already cached for
// the same row are shared, not copied again.
func compact(j gapfill.Job, old *cacheEntry, had bool) gapfill.Job {
	if j.Raw == nil && j.State != nil {
		// Only a decoded state is known: keep it as the row's encoding.
		if raw, err := delta.EncodeState(j.State); err == nil {
			j.Raw = raw
		}
	}
	j.State = nil
	switch {
	case had && sameBytes(old.job.Raw, j.Raw):
		j.Raw = old.job.Raw
	case j.Raw != nil:
		j.Raw = bytes.Clone(j.Raw)
	}
	switch {
	case had && sameBytes(old.job.LastOps, j.LastOps):
		j.LastOps = old.job.LastOps
	case j.LastOps != nil:
		j.LastOps = bytes.Clone(j.LastOps)
	}
	return j
}

func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// spill returns held with the ops of every delta left out: they stay in
// PostgreSQL, and [worker.plan] loads them again before a batch offers
// anything to the job. What is kept is the index of what is held: version,
// coordinates, event id and times.
func spill(held map[int64]gapfill.Held) map[int64]gapfill.Held {
	out := make(map[int64]gapfill.Held, len(held))
	for v, h := range held {
		h.Event.Ops, h.Event.RawOps = nil, nil
		out[v] = h
	}
	return out
}

// spilled reports whether any of j's held deltas has its ops in
// PostgreSQL only.
func spilled(j gapfill.Job) bool {
	for _, h := range j.Held {
		if h.Event.RawOps == nil {
			return true
		}
	}
	return false
}

// Estimated bytes of the Go structures around a cached job and a held
// delta, beyond their variable-length fields: map slots, the entry, the
// list element, the Job and Held structs and their strings' headers.
const (
	jobOverhead  = 320
	heldOverhead = 400
	// opsFactor is how many bytes decoded ops take per byte of their JSON.
	opsFactor = 4
)

// jobBytes estimates the memory j takes in the cache.
func jobBytes(j gapfill.Job) int64 {
	n := jobOverhead + 2*alloc(len(j.ID)) + alloc(len(j.Raw)) + alloc(len(j.EventID)) + alloc(len(j.LastOps))
	for _, h := range j.Held {
		n += heldOverhead + alloc(len(h.Event.JobID)) + alloc(len(h.Event.EventID)) + (1+opsFactor)*alloc(len(h.Event.RawOps))
	}
	return int64(n)
}

// alloc is n rounded up as the allocator's size classes may (they waste
// at most an eighth).
func alloc(n int) int {
	if n == 0 {
		return 0
	}
	return n + n/8 + 8
}

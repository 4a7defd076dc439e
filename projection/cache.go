package projection

import (
	"sync"
	"sync/atomic"
	"unsafe"

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
	// head and tail are the ends of the least-recently-used list of the
	// jobs that hold nothing, most recently used at head. The list runs
	// through the entries themselves, so it costs the collector no object
	// of its own per job.
	head, tail *cacheEntry
	lruLen     int
	// spilled counts cached held jobs whose held deltas' ops were left in
	// PostgreSQL.
	spilled int

	evictions atomic.Int64
}

func newCacheBudget(limit int64) *cacheBudget {
	return &cacheBudget{limit: limit}
}

// cacheEntry is one cached job. Its strings and bytes (the id, the row's
// state, the event id, the last ops and the event ids of spilled held
// deltas) share one allocation, and spilled held deltas are a slice rather
// than a map: at a million jobs the garbage collector's marking is most of
// the projector's CPU, and its cost follows the objects and pointers it
// meets, so a cached row is two objects (the entry and its bytes, beside
// its share of the map's groups) where it was six, and a job whose held
// deltas are spilled three (and the slice) where it was seven or more.
type cacheEntry struct {
	owner *jobCache
	// job is the row; its Held is nil when the held deltas are in
	// spilledHeld.
	job gapfill.Job
	// spilledHeld are the held deltas, in no order, when every one of them
	// has its ops in PostgreSQL only; their job and event ids point into
	// the entry's bytes.
	spilledHeld []gapfill.Held
	size        int64
	// prev and next link the entry into the budget's list while linked
	// (the job holds nothing); a pinned entry is not linked.
	prev, next *cacheEntry
	linked     bool
	// spilled is set when some of its held deltas' ops are in PostgreSQL
	// only.
	spilled bool
}

// cachedJob is what a get or a peek copies out of an entry under the
// budget's lock; the held map of spilled deltas is built from it after
// the lock is released (the slice is never written once built).
type cachedJob struct {
	job         gapfill.Job
	spilledHeld []gapfill.Held
}

// view is the cached job as callers see it.
func (c cachedJob) view() gapfill.Job {
	j := c.job
	if c.spilledHeld != nil {
		j.Held = make(map[int64]gapfill.Held, len(c.spilledHeld))
		for _, h := range c.spilledHeld {
			j.Held[h.Event.Version] = h
		}
	}
	return j
}

// jobCache is a partition worker's view of its jobs' rows, drawn from the
// instance's budget. Jobs with held deltas are always in it; the rest is
// an optimisation only, because every write still carries its version
// condition. It keeps states as raw JSON: [gapfill.Advance] decodes one
// when a delta needs it. The jobs it returns share its bytes: callers
// must not write to them (nothing does: every change makes new ones), and
// a string kept from one (an id) keeps the whole allocation, row and all,
// alive: copy it before keeping it for long.
type jobCache struct {
	b    *cacheBudget
	jobs map[string]*cacheEntry // guarded by b.mu; keys point into the entries' bytes
}

func newJobCache(b *cacheBudget) *jobCache {
	return &jobCache{b: b, jobs: make(map[string]*cacheEntry)}
}

// get returns a job and marks it used.
func (c *jobCache) get(id string) (gapfill.Job, bool) {
	cj, ok := c.lookup(id, true)
	if !ok {
		return gapfill.Job{}, false
	}
	return cj.view(), true
}

// peek is get without marking the job used.
func (c *jobCache) peek(id string) (gapfill.Job, bool) {
	cj, ok := c.lookup(id, false)
	if !ok {
		return gapfill.Job{}, false
	}
	return cj.view(), true
}

func (c *jobCache) lookup(id string, use bool) (cachedJob, bool) {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	e, ok := c.jobs[id]
	if !ok {
		return cachedJob{}, false
	}
	if use && e.linked {
		c.b.unlink(e)
		c.b.pushFront(e)
	}
	return cachedJob{job: e.job, spilledHeld: e.spilledHeld}, true
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
	if len(j.Held) > 0 && b.pinned > b.limit/2 {
		j.Held = spill(j.Held)
	}
	j = encoded(j)
	e := &cacheEntry{owner: c, size: jobBytes(j), spilled: spilled(j)}
	compact(e, j, old)
	c.jobs[e.job.ID] = e
	if e.spilled {
		b.spilled++
	}
	b.used += e.size
	if len(j.Held) > 0 {
		b.pinned += e.size
	} else {
		b.pushFront(e)
	}
	for b.used > b.limit && b.tail != nil {
		victim := b.tail
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
	if e.linked {
		b.unlink(e)
	} else {
		b.pinned -= e.size
	}
}

// pushFront links e as the most recently used; b.mu is held.
func (b *cacheBudget) pushFront(e *cacheEntry) {
	e.prev, e.next, e.linked = nil, b.head, true
	if b.head != nil {
		b.head.prev = e
	} else {
		b.tail = e
	}
	b.head = e
	b.lruLen++
}

// unlink takes e out of the list; b.mu is held.
func (b *cacheBudget) unlink(e *cacheEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		b.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		b.tail = e.prev
	}
	e.prev, e.next, e.linked = nil, nil, false
	b.lruLen--
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
	if e, ok := c.jobs[id]; ok && len(e.job.Held) == 0 && e.spilledHeld == nil {
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

// encoded returns j with its decoded state dropped: the raw bytes are what
// is kept and counted. Where only a decoded state is known, its encoding
// becomes the row's bytes.
func encoded(j gapfill.Job) gapfill.Job {
	if j.Raw == nil && j.State != nil {
		if raw, err := delta.EncodeState(j.State); err == nil {
			j.Raw = raw
		}
	}
	j.State = nil
	return j
}

// compact fills e from j (see [encoded]): the id, the raw bytes, the event id and
// the last ops are copied into one allocation of the entry's own, so a
// cached job never keeps a whole record or response alive. A job put back
// as it was read (the same id, row bytes, event id and ops as old's)
// shares old's bytes instead. Held deltas whose ops are all in PostgreSQL
// become a slice whose ids point into those bytes.
func compact(e *cacheEntry, j gapfill.Job, old *cacheEntry) {
	held := j.Held
	j.Held = nil
	var hs []gapfill.Held
	if len(held) > 0 && allSpilled(held) {
		hs = make([]gapfill.Held, 0, len(held))
		for _, h := range held {
			hs = append(hs, h)
		}
	} else {
		j.Held = held
	}
	switch {
	case old != nil && hs == nil && sameJobBytes(old.job, j):
		// The strings are equal by value: take old's, which are in its
		// bytes, rather than the caller's (a batch's, or a response's).
		j.ID, j.EventID = old.job.ID, old.job.EventID
	default:
		n := len(j.ID) + len(j.Raw) + len(j.EventID) + len(j.LastOps)
		for _, h := range hs {
			n += len(h.Event.EventID)
		}
		a := arena{buf: make([]byte, 0, max(n, 1))}
		j.ID = a.str(j.ID)
		j.Raw = a.bytes(j.Raw)
		j.EventID = a.str(j.EventID)
		j.LastOps = a.bytes(j.LastOps)
		for i := range hs {
			hs[i].Event.JobID = j.ID
			hs[i].Event.EventID = a.str(hs[i].Event.EventID)
		}
	}
	e.job, e.spilledHeld = j, hs
}

// sameJobBytes reports whether j's row bytes and last ops are those of the
// cached job c (the same memory) and its id and event id equal c's, as
// when a job read from the cache is put back.
func sameJobBytes(c, j gapfill.Job) bool {
	return c.ID == j.ID && sameBytes(c.Raw, j.Raw) && c.EventID == j.EventID && sameBytes(c.LastOps, j.LastOps) &&
		(c.Raw == nil) == (j.Raw == nil) && (c.LastOps == nil) == (j.LastOps == nil)
}

func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// arena copies strings and bytes into one buffer, allocated once with
// their total length. Each slice it returns is capped at its end, so an
// append to one never writes over the next.
type arena struct {
	buf []byte
}

func (a *arena) str(s string) string {
	if s == "" {
		return ""
	}
	off := len(a.buf)
	a.buf = append(a.buf, s...)
	return unsafe.String(&a.buf[off], len(s))
}

// bytes keeps nil as nil and empty as empty.
func (a *arena) bytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	off := len(a.buf)
	a.buf = append(a.buf, b...)
	return a.buf[off:len(a.buf):len(a.buf)]
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

// allSpilled reports whether every held delta has its ops in PostgreSQL
// only, each under its own version (as the slice form keys them again).
func allSpilled(held map[int64]gapfill.Held) bool {
	for v, h := range held {
		if h.Event.RawOps != nil || h.Event.Ops != nil || h.Event.Version != v {
			return false
		}
	}
	return true
}

// Estimated bytes of the Go structures around a cached job and a held
// delta, beyond their variable-length fields: map slots, the entry, the
// Job and Held structs and their strings' headers (with room to spare
// since the entry took the list's links and one allocation its bytes).
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

package projection

import "github.com/projector/projector/gapfill"

// jobCache is a partition worker's view of its jobs' rows. Jobs with held
// deltas are always in it (they are the gap detector's memory); the rest
// is an optimisation only, because every write still carries its version
// condition, and is dropped wholesale when it grows past its bound.
type jobCache struct {
	max  int
	jobs map[string]gapfill.Job
}

func newJobCache(max int) *jobCache {
	return &jobCache{max: max, jobs: make(map[string]gapfill.Job)}
}

func (c *jobCache) get(id string) (gapfill.Job, bool) {
	j, ok := c.jobs[id]
	return j, ok
}

func (c *jobCache) put(j gapfill.Job) {
	// A deleted job is remembered by its tombstone, which the pruner may
	// remove at any time: unless the detector needs it for held deltas,
	// the store is asked again, so a pruned tombstone is seen at once.
	if j.Deleted && len(j.Held) == 0 {
		delete(c.jobs, j.ID)
		return
	}
	if len(c.jobs) >= c.max && len(j.Held) == 0 {
		c.evict()
	}
	c.jobs[j.ID] = j
}

func (c *jobCache) forget(id string) {
	if j, ok := c.jobs[id]; ok && len(j.Held) == 0 {
		delete(c.jobs, id)
	}
}

// evict drops every job that holds nothing.
func (c *jobCache) evict() {
	for id, j := range c.jobs {
		if len(j.Held) == 0 {
			delete(c.jobs, id)
		}
	}
}

func (c *jobCache) reset() { clear(c.jobs) }

// peek is get without marking the job used.
func (c *jobCache) peek(id string) (gapfill.Job, bool) { return c.get(id) }

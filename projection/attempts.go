package projection

import (
	"context"
	"sync"
	"time"

	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/internal/failpoint"
)

// attemptPoll is how often a worker with attempts in flight looks for
// their results when no record arrives.
const attemptPoll = 25 * time.Millisecond

// rereadRound bounds the held jobs one re-read round takes: one pass over
// the log serves them all, and what they leave open waits for the
// authority in a queue no longer than this plus the fetchers.
const rereadRound = 1000

// attempts runs a partition's gap attempts in the background, each job on
// its own: the jobs due in a round are re-read together (the store once,
// the log in one pass), then each one left open goes to the instance's
// fixed pool of fetchers that ask the authority, oldest due first. Every
// result is handed back to the worker as soon as it is ready, to join its
// next batch, so a slow or failing answer for one job holds up no other
// beyond the concurrency limit. The goroutines are fixed (one re-reader
// per partition, 3 x --snapshot-concurrency fetchers per instance) and the
// work queued or in flight is bounded, however many jobs are held.
//
// Only the worker's goroutine calls its methods; the goroutines it starts
// talk to it through channels.
type attempts struct {
	resolver *gapfill.Resolver
	steps    []gapfill.Step
	reread   bool
	snapshot bool
	fetchers int

	rereadIn  chan []gapfill.Attempt
	rereading bool
	pool      *fetchPool
	ctx       context.Context
	fetching  int
	// pending are re-read attempts waiting for a free fetcher, oldest due
	// first.
	pending []gapfill.Attempt
	// out carries finished work back: re-read rounds and single answers.
	out chan finished
}

// finished is a re-read round or one fetcher's answer.
type finished struct {
	fetched bool
	atts    []gapfill.Attempt
}

// startAttempts starts the partition's attempt goroutines; they stop when
// ctx ends, and wg waits for them.
func (w *worker) startAttempts(ctx context.Context, wg *sync.WaitGroup) *attempts {
	a := &attempts{resolver: w.resolver, steps: w.detector.Steps(), pool: w.fetchers, ctx: ctx}
	if a.resolver == nil {
		return a
	}
	for _, s := range a.steps {
		a.reread = a.reread || s == gapfill.StepReread
		a.snapshot = a.snapshot || s == gapfill.StepSnapshot
	}
	a.fetchers = max(a.pool.size(), 1)
	// At most one re-read round and a.fetchers answers are outstanding,
	// so out never blocks the goroutines that send on it.
	a.out = make(chan finished, a.fetchers+1)
	if a.reread {
		a.rereadIn = make(chan []gapfill.Attempt, 1) // one round at a time: never blocks
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case round := <-a.rereadIn:
					failpoint.Hit(failpoint.GapAttempt)
					start := time.Now()
					a.resolver.Reread(ctx, round, start)
					w.log.Debug("re-read round", "jobs", len(round), "took", time.Since(start))
					select {
					case a.out <- finished{atts: round}:
					case <-ctx.Done():
						return
					}
				}
			}
		})
	}
	return a
}

// busy reports whether any attempt is queued or in flight.
func (a *attempts) busy() bool {
	return a.rereading || a.fetching > 0 || len(a.pending) > 0
}

// collect returns the attempts that ended since the last call; re-read
// attempts left open wait for the authority.
func (a *attempts) collect(w *worker) []gapfill.Resolution {
	var res []gapfill.Resolution
	for {
		select {
		case done := <-a.out:
			if done.fetched {
				a.fetching--
				res = append(res, done.atts[0].Res)
				continue
			}
			a.rereading = false
			for _, att := range done.atts {
				if att.Res.Closed || !a.snapshot {
					res = append(res, att.Res)
					continue
				}
				// The re-read did not close it: what it found still
				// counts, and the authority is asked next.
				a.pending = append(a.pending, att)
			}
		default:
			return res
		}
	}
}

// schedule starts what capacity allows: the next re-read round when none
// runs and the authority's queue runs short, and as many queued attempts
// as there are idle fetchers.
func (a *attempts) schedule(w *worker) {
	if a.resolver == nil {
		return
	}
	now := time.Now()
	// The next round is re-read while the fetchers still have work, so
	// they do not wait for it.
	if !a.rereading && len(a.pending) < max(a.fetchers, rereadRound/4) {
		if ids := w.detector.Take(now, rereadRound); len(ids) > 0 {
			round := make([]gapfill.Attempt, 0, len(ids))
			for _, id := range ids {
				j, ok := w.cache.get(id)
				if !ok {
					// A held job is always cached; if not, the next
					// attempt finds it.
					w.detector.Failed(id, now, gapfill.StepWait, "held job not in the cache")
					continue
				}
				round = append(round, gapfill.Attempt{Job: j, Res: gapfill.Resolution{JobID: id}})
			}
			switch {
			case len(round) == 0:
			case a.reread:
				a.rereading = true
				a.rereadIn <- round
			default:
				a.pending = append(a.pending, round...)
			}
		}
	}
	for len(a.pending) > 0 && a.fetching < a.fetchers {
		att := a.pending[0]
		if _, held := w.detector.Gap(att.Job.ID); held {
			if !a.pool.offer(fetchJob{ctx: a.ctx, att: att, out: a.out}) {
				break // every fetcher is busy: the rest wait, in order
			}
			a.fetching++
		}
		// else: it closed while it waited.
		a.pending[0] = gapfill.Attempt{}
		a.pending = a.pending[1:]
	}
	if len(a.pending) == 0 {
		a.pending = nil
	}
}

// reset forgets queued attempts: the detector they were taken from was
// reset. Attempts in flight still report, harmlessly.
func (a *attempts) reset() {
	a.pending = nil
}

// fetchPool is the instance's fetchers (see [fetchPoolSize]). Workers offer
// attempts without blocking; each answer goes back to the worker that
// offered it, unless that worker has stopped.
type fetchPool struct {
	resolver *gapfill.Resolver
	in       chan fetchJob
	n        int
}

// fetchPoolSize is the size of the instance's fetch pool for a given
// --snapshot-concurrency c: c for the requests in the main lane, c more
// for those moved to the slow lane (the snapshot client's lanes keep the
// requests in flight to these two limits), and c again so that fetches
// waiting out a retry backoff, which hold no request slot, do not leave
// the authority's slots idle.
func fetchPoolSize(c int) int { return 3 * c }

// size is the number of fetchers; 0 for no pool.
func (p *fetchPool) size() int {
	if p == nil {
		return 0
	}
	return p.n
}

type fetchJob struct {
	ctx context.Context
	att gapfill.Attempt
	out chan<- finished
}

// startFetchPool starts n fetchers that run until ctx ends; wg waits for
// them.
func startFetchPool(ctx context.Context, wg *sync.WaitGroup, r *gapfill.Resolver, n int) *fetchPool {
	p := &fetchPool{resolver: r, in: make(chan fetchJob), n: n}
	for range n {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case job := <-p.in:
					failpoint.Hit(failpoint.GapAttempt)
					p.resolver.Authority(job.ctx, &job.att, time.Now())
					select {
					case job.out <- finished{fetched: true, atts: []gapfill.Attempt{job.att}}:
					case <-job.ctx.Done():
					}
				}
			}
		})
	}
	return p
}

// offer hands job to an idle fetcher, or reports that none is idle.
func (p *fetchPool) offer(job fetchJob) bool {
	if p == nil {
		return false
	}
	select {
	case p.in <- job:
		return true
	default:
		return false
	}
}

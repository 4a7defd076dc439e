package projection

import (
	"context"
	"sync"
	"time"

	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/internal/buildhook/failpoint"
	"github.com/projector/projector/snapshot"
)

// attemptPoll is how often a worker with attempts in flight looks for
// their results when no record arrives.
const attemptPoll = 25 * time.Millisecond

// rereadRound bounds the held jobs one re-read round takes: one pass over
// the log serves them all, and what they leave open waits for the
// authority in a queue no longer than this plus the fetchers.
const rereadRound = 1000

// A job whose request ends for slowness (snapshot.ErrSlow: no answer in 3
// slow thresholds, or by its timeout) is found slow. Found slow
// once, its next request goes to whichever frees first of a slow fetcher
// (its request starts in the slow lane) and a main fetcher no partition
// has other work for: a prompt answer delayed past 3 thresholds by a
// busy moment is then asked again soon, without waiting behind every slow
// job for the slow lane, and without taking the main lane from jobs never
// asked. Found slow twice in a row, its requests start in the slow lane
// only. A request cut only because the slow lane was full
// (snapshot.ErrSlowLaneFull) says nothing of the job: its count stays, and
// a job never found slow is asked in the main lane again; but
// gapfill.LaneFullCuts such cuts in a row count as found slow once, so an
// answer that always comes a little after the threshold, while other slow
// jobs keep a narrow slow lane full, still gets a request that runs to the
// timeout.
//
// A request cut by its timeout (snapshot.TimeoutError) shows more: the
// authority takes longer than that to answer the job. The
// detector doubles the time of the job's next request, up to
// --snapshot-timeout-max, and from then until its gap closes the job's
// requests go to the slow fetchers only, even found slow once, and start
// in the slow lane, where a long one holds up no prompt answer.

// attempts runs a partition's gap attempts in the background, each job on
// its own: the jobs due in a round are re-read together (the store once,
// the log in one pass), then each one left open goes to the instance's
// fixed pool of fetchers that ask the authority, oldest due first (the
// pool takes a job never asked ahead of a retry); a job the authority was
// too slow to answer goes to the pool's slow fetchers instead, whose
// requests start in the slow lane. Every result is
// handed back to the worker as soon as it is ready, to join its next
// batch, so a slow or failing answer for one job holds up no other beyond
// the concurrency limit. The goroutines are fixed (one re-reader per
// partition, the fetchers per instance, see [fetchPoolSizes]) and the work
// queued or in flight is bounded, however many jobs are held.
//
// Only the worker's goroutine calls its methods; the goroutines it starts
// talk to it through channels.
type attempts struct {
	resolver *gapfill.Resolver
	steps    []gapfill.Step
	reread   bool
	snapshot bool
	fetchers int

	rereadIn  chan rereadRoundOf
	rereading bool
	pool      *fetchPool
	ctx       context.Context
	fetching  int
	// pending are re-read attempts waiting for a free fetcher, oldest due
	// first; pendingLow those of jobs found slow once, pendingSlow those
	// of jobs found slow again (see queue).
	pending, pendingLow, pendingSlow []gapfill.Attempt
	// lowTurn alternates the slow fetchers between pendingLow and
	// pendingSlow, so neither waits for ever behind the other.
	lowTurn bool
	// out carries finished work back: re-read rounds and single answers.
	out chan finished
	// gen counts resets: work started before the last one reports under
	// an older gen and is dropped.
	gen int
}

// rereadRoundOf is a round of attempts to re-read, started under gen.
type rereadRoundOf struct {
	atts []gapfill.Attempt
	gen  int
}

// finished is a re-read round or one fetcher's answer.
type finished struct {
	fetched bool
	atts    []gapfill.Attempt
	gen     int
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
	// At most one re-read round and a.fetchers answers (the pool's
	// fetchers and queues) are outstanding, so out never blocks the
	// goroutines that send on it.
	a.out = make(chan finished, a.fetchers+1)
	if a.reread {
		a.rereadIn = make(chan rereadRoundOf, 1) // one round at a time: never blocks
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case round := <-a.rereadIn:
					failpoint.Hit(failpoint.GapAttempt)
					start := time.Now()
					a.resolver.Reread(ctx, round.atts, start)
					w.log.Debug("re-read round", "jobs", len(round.atts), "took", time.Since(start))
					select {
					case a.out <- finished{atts: round.atts, gen: round.gen}:
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
	return a.rereading || a.fetching > 0 || len(a.pending) > 0 || len(a.pendingLow) > 0 || len(a.pendingSlow) > 0
}

// canTake reports whether the next [attempts.schedule] would take due
// jobs: no re-read round runs and the queues have room. While it cannot,
// a due job is no reason to wake early.
func (a *attempts) canTake() bool {
	return a.resolver != nil && !a.rereading &&
		len(a.pending) < max(a.fetchers, rereadRound/4) && len(a.pendingLow)+len(a.pendingSlow) < rereadRound
}

// collect returns the attempts that ended since the last call; re-read
// attempts left open wait for the authority. Work started before the last
// reset is dropped: the detector it was taken from is gone, and the jobs
// it was for are due afresh.
func (a *attempts) collect(w *worker) []gapfill.Resolution {
	var res []gapfill.Resolution
	for {
		select {
		case done := <-a.out:
			if done.fetched {
				a.fetching--
			} else {
				a.rereading = false
			}
			if done.gen != a.gen {
				continue
			}
			if done.fetched {
				res = append(res, done.atts[0].Res)
				continue
			}
			for _, att := range done.atts {
				if att.Res.Closed || !a.snapshot {
					res = append(res, att.Res)
					continue
				}
				// The re-read did not close it: what it found still
				// counts, and the authority is asked next.
				a.queue(w, att)
			}
		default:
			return res
		}
	}
}

// queue puts an attempt in line for a fetcher, by how many times in a row
// the job was found slow.
func (a *attempts) queue(w *worker, att gapfill.Attempt) {
	g, _ := w.detector.Gap(att.Job.ID)
	switch {
	case g.Slow == 0 && g.TimedOut == 0 || a.pool.slowSize() == 0:
		a.pending = append(a.pending, att)
	case g.Slow == 1 && g.TimedOut == 0:
		a.pendingLow = append(a.pendingLow, att)
	default:
		a.pendingSlow = append(a.pendingSlow, att)
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
	if a.canTake() {
		if ids := w.detector.Take(now, rereadRound, w.readPosition()); len(ids) > 0 {
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
				a.rereadIn <- rereadRoundOf{atts: round, gen: a.gen}
			default:
				for _, att := range round {
					a.queue(w, att)
				}
			}
		}
	}
	a.pending = a.offer(w, a.pending, false)
	if len(a.pending) == 0 && a.pool.mainIdle() {
		// Main fetchers no partition has offered other work to.
		a.pendingLow = a.offer(w, a.pendingLow, false)
	}
	// Slow fetchers: each queue goes first every other turn.
	if a.lowTurn {
		a.pendingLow = a.offer(w, a.pendingLow, true)
	}
	a.pendingSlow = a.offer(w, a.pendingSlow, true)
	a.pendingLow = a.offer(w, a.pendingLow, true)
	a.lowTurn = !a.lowTurn
}

// offer hands queued attempts to idle fetchers, in order, and returns
// those left waiting. A full queue in front of the fetchers stops only the
// attempts bound for it: a first attempt behind retries still takes a free
// place among the first attempts (the pool takes those first), and each
// kind keeps its order.
func (a *attempts) offer(w *worker, queue []gapfill.Attempt, slow bool) []gapfill.Attempt {
	var full [2]bool // by retry: that queue of the pool had no room
	kept, i := 0, 0
	for ; i < len(queue) && a.fetching < a.fetchers && !(full[0] && full[1]); i++ {
		att := queue[i]
		g, held := w.detector.Gap(att.Job.ID)
		if !held {
			continue // it closed while it waited
		}
		retry := g.Attempts > 0 || g.Slow > 0
		kind := 0
		if retry && !slow {
			kind = 1
		}
		job := fetchJob{ctx: a.ctx, att: att, out: a.out, slow: slow, retry: retry, timeout: g.Timeout, gen: a.gen}
		if !full[kind] && a.pool.offer(job) {
			a.fetching++
			continue
		}
		// Its queue is full: it and the rest of its kind wait, in order.
		full[kind] = true
		if slow {
			full[1] = true // the slow fetchers have one queue
		}
		queue[kept] = att
		kept++
	}
	kept += copy(queue[kept:], queue[i:])
	clear(queue[kept:])
	if kept == 0 {
		return nil
	}
	return queue[:kept]
}

// reset forgets queued attempts: the detector they were taken from was
// reset. Attempts in flight run on (the goroutines cannot be called back)
// but their results are dropped when they report: their jobs are due
// afresh in the new detector, and a stale result would end an attempt
// that is not theirs. Until they report they count against the limits.
func (a *attempts) reset() {
	a.pending, a.pendingLow, a.pendingSlow = nil, nil, nil
	a.gen++
}

// fetchPool is the instance's fetchers (see [fetchPoolSizes]). Workers
// offer attempts without blocking; each answer goes back to the worker
// that offered it, unless that worker has stopped.
type fetchPool struct {
	resolver *gapfill.Resolver
	// in, retryIn and slowIn queue attempts for the fetchers: first
	// attempts and retries for the main fetchers, which take a first
	// attempt whenever one waits; the rest for the slow fetchers.
	in, retryIn, slowIn chan fetchJob
	main, slowed        int
	// asked, when set (by tests), is told of every request made.
	asked func(authorityRequest)
}

// authorityRequest is one request a fetcher made to the authority.
type authorityRequest struct {
	job     string
	timeout time.Duration
	// slow: it started in the slow lane.
	slow bool
	err  error
}

// fetchPoolSizes are the sizes of the instance's fetch pool for a given
// --snapshot-concurrency c. Main fetchers: c for the requests in the main
// lane, c for those that moved on to the slow lane (a request keeps its
// fetcher when it moves), and c so that fetches waiting out a retry
// backoff, which hold no request slot, do not leave the main lane idle.
// Slow fetchers: one for each slot of the slow lane (as wide as the main
// one) that takes requests started there, half of it.
func fetchPoolSizes(c int) (main, slow int) { return 3 * c, snapshot.SlowStarts(c) }

// size is how many attempts the pool takes at once: its fetchers and the
// queues in front of them; 0 for no pool.
func (p *fetchPool) size() int {
	if p == nil {
		return 0
	}
	return p.main + p.slowed + cap(p.in) + cap(p.retryIn) + cap(p.slowIn)
}

// mainIdle reports whether no attempt waits for a main fetcher.
func (p *fetchPool) mainIdle() bool {
	return p != nil && len(p.in) == 0
}

// slowSize is the number of slow fetchers; 0 for no pool.
func (p *fetchPool) slowSize() int {
	if p == nil {
		return 0
	}
	return p.slowed
}

type fetchJob struct {
	ctx context.Context
	att gapfill.Attempt
	out chan<- finished
	// slow sends the request to the slow lane; retry marks a job asked
	// before; timeout is how long the request may run (the job's, from
	// the detector); gen is the offering worker's attempts generation.
	slow, retry bool
	timeout     time.Duration
	gen         int
}

// startFetchPool starts main + slow fetchers that run until ctx ends; wg
// waits for them. asked, if not nil, is told of every request.
func startFetchPool(ctx context.Context, wg *sync.WaitGroup, r *gapfill.Resolver, main, slow int, asked func(authorityRequest)) *fetchPool {
	// A short queue in front of each kind of fetcher: a fetcher that
	// finishes takes the next attempt at once, rather than waiting for a
	// worker's next turn to offer one.
	p := &fetchPool{resolver: r, in: make(chan fetchJob, main), retryIn: make(chan fetchJob, main),
		slowIn: make(chan fetchJob, slow), main: main, slowed: slow, asked: asked}
	// A main fetcher takes a first attempt whenever one waits, so jobs
	// never asked are not held up by retries of jobs that failed.
	nextMain := func() (fetchJob, bool) {
		select {
		case job := <-p.in:
			return job, true
		default:
		}
		select {
		case <-ctx.Done():
			return fetchJob{}, false
		case job := <-p.in:
			return job, true
		case job := <-p.retryIn:
			return job, true
		}
	}
	nextSlow := func() (fetchJob, bool) {
		select {
		case <-ctx.Done():
			return fetchJob{}, false
		case job := <-p.slowIn:
			return job, true
		}
	}
	fetcher := func(next func() (fetchJob, bool)) {
		for {
			job, ok := next()
			if !ok {
				return
			}
			failpoint.Hit(failpoint.GapAttempt)
			fctx := snapshot.WithRequestTimeout(job.ctx, job.timeout)
			if job.slow {
				fctx = snapshot.InSlowLane(fctx)
			}
			p.resolver.Authority(fctx, &job.att, time.Now())
			if p.asked != nil {
				p.asked(authorityRequest{job: job.att.Job.ID, timeout: job.timeout, slow: job.slow, err: job.att.Res.Err})
			}
			select {
			case job.out <- finished{fetched: true, atts: []gapfill.Attempt{job.att}, gen: job.gen}:
			case <-job.ctx.Done():
			}
		}
	}
	for range main {
		wg.Go(func() { fetcher(nextMain) })
	}
	for range slow {
		wg.Go(func() { fetcher(nextSlow) })
	}
	return p
}

// offer hands job to an idle fetcher of its kind, or queues it for the
// next free one, or reports that the queue is full.
func (p *fetchPool) offer(job fetchJob) bool {
	if p == nil {
		return false
	}
	in := p.in
	switch {
	case job.slow:
		in = p.slowIn
	case job.retry:
		in = p.retryIn
	}
	select {
	case in <- job:
		return true
	default:
		return false
	}
}

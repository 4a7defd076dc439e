package gapfill

import (
	"container/heap"
	"sort"
	"time"

	"github.com/projector/projector/snapshot"
)

// Step is one step of the policy chain.
type Step string

// The policy chain, in order.
const (
	StepWait     Step = "wait"
	StepReread   Step = "reread"
	StepSnapshot Step = "snapshot"
)

// Policy configures the chain. A zero Wait skips waiting; a step turned off
// is skipped; with both Reread and Snapshot off a gap waits for the log
// alone, held and reported, for ever.
type Policy struct {
	// Wait is how long a gap may be closed by the log alone before the
	// other steps run.
	Wait     time.Duration
	Reread   bool
	Snapshot bool
	// RetryMin and RetryMax bound the backoff between failed attempts.
	RetryMin time.Duration
	RetryMax time.Duration
	// SnapshotTimeout is how long a held job's first request to the
	// authority may run. Each of its requests cut by that time doubles
	// the time of its next, up to SnapshotTimeoutMax ([Detector.TimedOut]):
	// an authority slower than SnapshotTimeout but within
	// SnapshotTimeoutMax still heals the job. A SnapshotTimeoutMax at or
	// below SnapshotTimeout keeps every request at SnapshotTimeout.
	SnapshotTimeout    time.Duration
	SnapshotTimeoutMax time.Duration
}

// WithDefaults fills the retry bounds and the snapshot timeout
// ([snapshot.DefaultTimeout]), and raises SnapshotTimeoutMax to
// SnapshotTimeout when it is below.
func (p Policy) WithDefaults() Policy {
	if p.RetryMin <= 0 {
		p.RetryMin = time.Second
	}
	if p.RetryMax <= 0 {
		p.RetryMax = 5 * time.Minute
	}
	if p.SnapshotTimeout <= 0 {
		p.SnapshotTimeout = snapshot.DefaultTimeout
	}
	p.SnapshotTimeoutMax = max(p.SnapshotTimeoutMax, p.SnapshotTimeout)
	return p
}

// Gap is the detector's record of one held job.
type Gap struct {
	JobID string
	// Since is when the job began to wait.
	Since time.Time
	// Attempts counts finished re-read/snapshot attempts that left it held.
	Attempts int
	// NextAttempt is when the next attempt is due.
	NextAttempt time.Time
	LastStep    Step
	LastErr     string
	// InFlight is set while an attempt taken with [Detector.Take] runs.
	InFlight bool
	// ReadsTo, while the job's first attempt waits for its lane to read
	// as far as its log ended when it began to wait, is that offset;
	// -1 otherwise ([Detector.HoldUntil]). Set in the copies the
	// detector returns.
	ReadsTo int64
	// Slow counts the attempts in a row whose request to the authority
	// ended for want of a timely answer (see [Detector.Slow]); callers
	// send a slow job's next request where it holds up no prompt one.
	Slow int
	// Timeout is how long the job's next request to the authority may
	// run: Policy.SnapshotTimeout, doubled by each request cut by it.
	// TimedOut counts those cuts since the job was held; a job with any
	// is known to be slower than Policy.SnapshotTimeout, and callers keep
	// its requests where they hold up no prompt one. Both last until the
	// gap closes: moving forward does not make the authority quicker.
	Timeout  time.Duration
	TimedOut int
}

type entry struct {
	Gap
	// until is where the job's log ended when it began to wait (-1: not
	// a log; endToLearn: the lane's end is not known yet): its first
	// attempt waits, beyond Wait, until the lane has read that far, since
	// the missing version may simply not be read yet
	// ([Detector.HoldUntil], [Detector.HoldRestored]).
	until int64
	// from starts the clock of that wait's bound: when the job began to
	// wait, or when it was restored.
	from time.Time
	// While it does, the entry is also in the detector's gate, ordered
	// by until (gi its place there, -1 when not), and its due time is put
	// off to the end of that wait; due is the time it had.
	gi  int
	due time.Time
	// index is the entry's place in the due queue; -1 while in flight.
	index int
	// progressed is set when the job moved forward since it was taken:
	// the attempt's end then leaves the fresh wait alone.
	progressed bool
	// laneFull counts the attempts in a row cut only because the slow lane
	// was full (see [Detector.SlowLaneFull]).
	laneFull int
}

// Detector is the clock of the policy chain for one partition's held jobs.
// It is pure: every method takes the time it should use. Held jobs not in
// flight wait in a queue ordered by when their next attempt is due, so
// finding what is due costs no walk over every held job.
type Detector struct {
	policy Policy
	gaps   map[string]*entry
	queue  dueQueue
	// gate holds the jobs whose first attempt waits for the lane to read
	// on, ordered by how far ([Detector.HoldUntil]).
	gate gateQueue
	// read is the furthest position the lane was seen at ([Detector.Lane],
	// [Detector.Take]), and moved when it last grew: a lane that keeps
	// reading keeps its gated jobs waiting.
	read  int64
	moved time.Time
	// toLearn counts the jobs whose log end is not known yet
	// ([Detector.HoldRestored]).
	toLearn int
	// version counts changes, for callers that cache a view of the gaps.
	version uint64
}

// NewDetector returns a detector with no held jobs.
func NewDetector(p Policy) *Detector {
	return &Detector{policy: p.WithDefaults(), gaps: map[string]*entry{}, read: -1}
}

// Policy is the policy in force.
func (d *Detector) Policy() Policy { return d.policy }

// Version changes whenever a gap is added, moved or removed.
func (d *Detector) Version() uint64 { return d.version }

func (d *Detector) schedule(e *entry, at time.Time) {
	e.NextAttempt = at
	if e.index >= 0 {
		heap.Fix(&d.queue, e.index)
	}
}

// Hold records that job is held since since; an older record is kept.
func (d *Detector) Hold(job string, since time.Time) { d.HoldUntil(job, since, -1) }

// HoldUntil is [Detector.Hold] for a job of a log that ended at end when
// it began to wait: its first attempt is not taken ([Detector.Take])
// before the lane's position reaches end, while the lane keeps reading
// and within the bounds of [Detector.gateBound]. On a log read behind its
// end, a version that is missing is most likely among the records not
// read yet (a late delivery further on), which reading finds at no cost;
// a re-read or a request to the authority would not. A zero Wait
// (waiting off) takes it as Hold does.
func (d *Detector) HoldUntil(job string, since time.Time, end int64) {
	d.version++
	if e, ok := d.gaps[job]; ok {
		if since.Before(e.Since) {
			d.ungate(e)
			e.Since = since
			d.schedule(e, since.Add(d.policy.Wait))
		}
		return
	}
	d.add(job, since, end, since)
}

// add holds a job not held yet.
func (d *Detector) add(job string, since time.Time, end int64, from time.Time) {
	e := &entry{Gap: Gap{JobID: job, Since: since, NextAttempt: since.Add(d.policy.Wait), LastStep: StepWait,
		Timeout: d.policy.SnapshotTimeout}, until: end, from: from, gi: -1}
	d.gaps[job] = e
	heap.Push(&d.queue, e)
	if end == endToLearn {
		d.toLearn++
	}
}

// endToLearn marks a job whose lane's end is not known yet.
const endToLearn = -2

// HoldRestored is [Detector.HoldUntil] for a job held since since that a
// new owner of its lane restores at now, before the lane's end is known
// ([Detector.Lane] gives it): its first attempt waits for the lane to
// read as far as its log ends, with the bounds counted from now (and from
// since: see [Detector.gateBound]). A job held already keeps its own wait.
func (d *Detector) HoldRestored(job string, since, now time.Time) {
	if _, ok := d.gaps[job]; ok {
		d.Hold(job, since)
		return
	}
	d.version++
	d.add(job, since, endToLearn, now)
}

// Lane records where the lane reads next (position) and where its log
// ends (end) at now, on every turn of the lane's loop, whether or not an
// attempt is taken: a move of position restarts the bound of the gated
// jobs' wait, and end, once known (above zero: a lane with a restored
// held delta has records), is what the jobs restored before it was known
// ([Detector.HoldRestored]) wait for. -1 for either: not a log.
func (d *Detector) Lane(position, end int64, now time.Time) {
	d.reading(position, now)
	if d.toLearn == 0 || end <= 0 {
		return
	}
	for _, e := range d.gaps {
		if e.until != endToLearn {
			continue
		}
		e.until = end
		if e.gi >= 0 {
			heap.Fix(&d.gate, e.gi)
		}
	}
	d.toLearn = 0
	d.version++
}

// logWaitFactor bounds how long a first attempt waits for the lane to
// read as far as its log ended when the gap opened, in Waits counted from
// when the lane last moved (or the wait began, if later): a lane that
// keeps reading gets there, however far it is, and finds what is late on
// its way at no cost; one that stopped moving (an outage, a transaction
// held open) does not keep its held jobs from the other steps for longer.
const logWaitFactor = 10

// readsFurther reports whether e's first attempt still waits for the lane
// to read as far as its log ended when e began to wait.
func (d *Detector) readsFurther(e *entry, now time.Time, position int64) bool {
	if e.Attempts > 0 || position < 0 || d.policy.Wait <= 0 {
		return false
	}
	switch {
	case e.until == endToLearn:
	case e.until < 0 || position >= e.until:
		return false
	}
	return now.Before(d.gateBound(e))
}

// logWaitMax bounds the whole wait of a first attempt for its lane, in
// Waits from when the job was held, however steadily the lane reads: a
// version that is lost, not late, is then sought by the other steps at
// last.
const logWaitMax = 60

// gateBound is when e's first attempt stops waiting for the lane:
// logWaitFactor Waits after the lane last moved, or after e began to
// wait if that was later; and logWaitMax Waits after the job was held
// (Since) at most, or logWaitFactor Waits after it began to wait if that
// is later (a job restored late in its hold still waits a little, and
// restores do not keep a job from its attempts for ever). A job whose
// lane's end is not known yet has no target the lane's moves bring
// nearer: logWaitFactor Waits after it began.
func (d *Detector) gateBound(e *entry) time.Time {
	from := e.from
	if d.moved.After(from) && e.until != endToLearn {
		from = d.moved
	}
	bound := from.Add(logWaitFactor * d.policy.Wait)
	most := e.Since.Add(logWaitMax * d.policy.Wait)
	if least := e.from.Add(logWaitFactor * d.policy.Wait); most.Before(least) {
		most = least
	}
	if bound.After(most) {
		bound = most
	}
	return bound
}

// reading records the lane's position at now. A position that goes back
// (a new log, or one truncated) is a move too, from which reading is
// measured afresh.
func (d *Detector) reading(position int64, now time.Time) {
	if position >= 0 && position < d.read {
		d.read, d.moved = position, now
		return
	}
	if position > d.read {
		// The first position seen is no move: the lane's reading is
		// measured from there.
		if d.read >= 0 {
			d.moved = now
		}
		d.read = position
	}
}

// Progress records that a held job moved forward but is still held: it
// waits afresh for the next missing version, attempts and backoff reset.
// An attempt in flight for it ends without a penalty.
func (d *Detector) Progress(job string, now time.Time) { d.ProgressUntil(job, now, -1) }

// ProgressUntil is [Detector.Progress] on a log that ends at end now (see
// [Detector.HoldUntil]).
func (d *Detector) ProgressUntil(job string, now time.Time, end int64) {
	e, ok := d.gaps[job]
	if !ok {
		return
	}
	d.version++
	d.ungate(e)
	if e.until == endToLearn {
		d.toLearn--
	}
	e.Since, e.Attempts, e.LastStep, e.LastErr, e.until, e.from = now, 0, StepWait, "", end, now
	e.progressed = true
	d.schedule(e, now.Add(d.policy.Wait))
}

// Close forgets a job whose gap closed.
func (d *Detector) Close(job string) {
	e, ok := d.gaps[job]
	if !ok {
		return
	}
	d.version++
	d.ungate(e)
	if e.index >= 0 {
		heap.Remove(&d.queue, e.index)
	}
	if e.until == endToLearn {
		d.toLearn--
	}
	delete(d.gaps, job)
}

// Reset forgets every gap.
func (d *Detector) Reset() {
	d.version++
	clear(d.gaps)
	d.queue = d.queue[:0]
	d.gate = d.gate[:0]
	d.toLearn = 0
	d.read, d.moved = -1, time.Time{}
}

// Steps lists the steps an attempt runs, in order.
func (d *Detector) Steps() []Step {
	var s []Step
	if d.policy.Reread {
		s = append(s, StepReread)
	}
	if d.policy.Snapshot {
		s = append(s, StepSnapshot)
	}
	return s
}

// Due lists, sorted, the held jobs not in flight whose next attempt is
// due at now.
func (d *Detector) Due(now time.Time) []string {
	if len(d.Steps()) == 0 {
		return nil
	}
	var due []string
	for id, e := range d.gaps {
		if !e.InFlight && !now.Before(e.NextAttempt) {
			due = append(due, id)
		}
	}
	sort.Strings(due)
	return due
}

// Take returns up to limit held jobs whose next attempt is due at now,
// the longest due first, and marks them in flight: they are not due again
// until [Detector.Failed], [Detector.Progress] or [Detector.Close] ends
// their attempt. position is where the lane reads next (-1: not a log): a
// first attempt due before the lane has read as far as its log ended when
// the job began to wait is put off, uncounted, until the lane has (a later
// Take with that position) or the wait's bound has passed
// ([Detector.HoldUntil]). A job is let go once, and put off once per
// bound while its lane keeps reading: the cost does not grow with how
// many wait.
func (d *Detector) Take(now time.Time, limit int, position int64) []string {
	if len(d.Steps()) == 0 {
		return nil
	}
	changed := false
	d.reading(position, now)
	// The lane has read far enough for these: due again at the time they
	// had.
	for len(d.gate) > 0 && position >= 0 && d.gate[0].until >= 0 && d.gate[0].until <= position {
		e := heap.Pop(&d.gate).(*entry)
		e.gi = -1
		d.schedule(e, e.due)
		changed = true
	}
	var out []string
	for len(out) < limit && len(d.queue) > 0 && !now.Before(d.queue[0].NextAttempt) {
		e := d.queue[0]
		if d.readsFurther(e, now, position) {
			// Put off to the bound; one put off already, whose bound
			// came while its lane kept reading, to the later bound.
			if e.gi < 0 {
				e.due = e.NextAttempt
				heap.Push(&d.gate, e)
			}
			d.schedule(e, d.gateBound(e))
			changed = true
			continue
		}
		heap.Pop(&d.queue)
		d.ungate(e)
		e.InFlight, e.progressed = true, false
		out = append(out, e.JobID)
	}
	if len(out) > 0 || changed {
		d.version++
	}
	return out
}

// ungate takes e out of the gate, if it is there.
func (d *Detector) ungate(e *entry) {
	if e.gi >= 0 {
		heap.Remove(&d.gate, e.gi)
		e.gi = -1
	}
}

// NextDue is the earliest time an attempt falls due among the jobs not in
// flight, if any.
func (d *Detector) NextDue() (time.Time, bool) {
	if len(d.Steps()) == 0 || len(d.queue) == 0 {
		return time.Time{}, false
	}
	return d.queue[0].NextAttempt, true
}

// Failed records an attempt that left job held, and schedules the next
// with capped exponential backoff. If the job moved forward while the
// attempt ran, its fresh wait stands and nothing is counted.
func (d *Detector) Failed(job string, now time.Time, last Step, err string) {
	e, ok := d.gaps[job]
	if !ok {
		return
	}
	d.version++
	d.ungate(e)
	wasInFlight := e.InFlight
	e.InFlight = false
	if wasInFlight {
		heap.Push(&d.queue, e)
	}
	if e.progressed {
		e.progressed = false
		return
	}
	e.Attempts++
	e.LastStep, e.LastErr = last, err
	wait := d.policy.RetryMin
	for i := 1; i < e.Attempts && wait < d.policy.RetryMax; i++ {
		wait *= 2
	}
	d.schedule(e, now.Add(min(wait, d.policy.RetryMax)))
}

// Slow records whether the attempt that just ended for job found the
// authority too slow to answer it: a slow one adds to the job's count, any
// other answer resets it.
func (d *Detector) Slow(job string, slow bool) {
	e, ok := d.gaps[job]
	if !ok {
		return
	}
	e.laneFull = 0
	if slow {
		e.Slow++
	} else {
		e.Slow = 0
	}
}

// TimedOut records that the request of the attempt that just ended for job
// was cut by its timeout, Gap.Timeout: the authority takes longer than
// that to answer the job, so its next request may run twice as long, up
// to Policy.SnapshotTimeoutMax. A request cut at the cap leaves it there.
func (d *Detector) TimedOut(job string) {
	e, ok := d.gaps[job]
	if !ok {
		return
	}
	d.version++
	e.TimedOut++
	// Halved rather than doubled, the comparison cannot overflow.
	if e.Timeout <= d.policy.SnapshotTimeoutMax/2 {
		e.Timeout *= 2
	} else {
		e.Timeout = d.policy.SnapshotTimeoutMax
	}
}

// LaneFullCuts is how many attempts in a row cut with the slow lane full
// make a job count as found slow.
const LaneFullCuts = 3

// SlowLaneFull records that the attempt that just ended for job was cut at
// the slow threshold only because the slow lane was full. One such cut says
// nothing of the job, but a job cut so LaneFullCuts times in a row counts
// as found slow once, so that its next request starts in the slow lane and
// runs to the timeout: with a narrow slow lane kept busy by other slow
// jobs, an answer that always comes a little after the threshold would
// otherwise be cut on every attempt, and its job never heal.
func (d *Detector) SlowLaneFull(job string) {
	e, ok := d.gaps[job]
	if !ok {
		return
	}
	e.laneFull++
	if e.laneFull >= LaneFullCuts {
		e.laneFull = 0
		e.Slow++
	}
}

// Gaps returns a copy of every held job's record, sorted by job.
func (d *Detector) Gaps() []Gap {
	out := make([]Gap, 0, len(d.gaps))
	for _, e := range d.gaps {
		out = append(out, d.view(e))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].JobID < out[j].JobID })
	return out
}

// Oldest returns a copy of the records of the n jobs held longest, by
// Since and then by job, oldest first: what a view of a few of many held
// jobs shows, at a cost of n records rather than one for every held job.
func (d *Detector) Oldest(n int) []Gap {
	if n <= 0 {
		return nil
	}
	// The n oldest seen so far, in a max-heap whose root is the youngest
	// of them: a job younger than the root is not among the n.
	h := make(youngestFirst, 0, min(n, len(d.gaps)))
	for _, e := range d.gaps {
		switch {
		case len(h) < n:
			heap.Push(&h, e)
		case olderGap(e.Gap, h[0].Gap):
			h[0] = e
			heap.Fix(&h, 0)
		}
	}
	out := make([]Gap, len(h))
	for i := len(h) - 1; i >= 0; i-- {
		out[i] = d.view(heap.Pop(&h).(*entry))
	}
	return out
}

// olderGap orders gaps by how long their jobs have been held, oldest
// first, and then by job: the order of [Detector.Oldest].
func olderGap(a, b Gap) bool {
	if !a.Since.Equal(b.Since) {
		return a.Since.Before(b.Since)
	}
	return a.JobID < b.JobID
}

// youngestFirst is a max-heap of entries by [olderGap].
type youngestFirst []*entry

func (q youngestFirst) Len() int           { return len(q) }
func (q youngestFirst) Less(i, j int) bool { return olderGap(q[j].Gap, q[i].Gap) }
func (q youngestFirst) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *youngestFirst) Push(x any)        { *q = append(*q, x.(*entry)) }
func (q *youngestFirst) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// Len is the number of held jobs.
func (d *Detector) Len() int { return len(d.gaps) }

// Gap returns job's record, if it is held.
func (d *Detector) Gap(job string) (Gap, bool) {
	e, ok := d.gaps[job]
	if !ok {
		return Gap{}, false
	}
	return d.view(e), true
}

// view is e's record as the detector returns it.
func (d *Detector) view(e *entry) Gap {
	g := e.Gap
	g.ReadsTo = -1
	if e.Attempts == 0 && e.until >= 0 && d.policy.Wait > 0 {
		g.ReadsTo = e.until
	}
	return g
}

// dueQueue is a min-heap of entries by NextAttempt, then job.
type dueQueue []*entry

func (q dueQueue) Len() int { return len(q) }
func (q dueQueue) Less(i, j int) bool {
	if !q[i].NextAttempt.Equal(q[j].NextAttempt) {
		return q[i].NextAttempt.Before(q[j].NextAttempt)
	}
	return q[i].JobID < q[j].JobID
}
func (q dueQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *dueQueue) Push(x any) {
	e := x.(*entry)
	e.index = len(*q)
	*q = append(*q, e)
}
func (q *dueQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	e.index = -1
	return e
}

// gateQueue orders the jobs whose first attempt waits for the lane by how
// far the lane must read; those whose lane's end is not known yet last.
type gateQueue []*entry

func (q gateQueue) Len() int           { return len(q) }
func (q gateQueue) Less(i, j int) bool { return gateKey(q[i]) < gateKey(q[j]) }
func (q gateQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].gi, q[j].gi = i, j
}

func (q *gateQueue) Push(x any) {
	e := x.(*entry)
	e.gi = len(*q)
	*q = append(*q, e)
}

func (q *gateQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	e.gi = -1
	return e
}

// gateKey orders the gate: how far the lane must read, as unsigned so that
// endToLearn (negative) comes after every known end.
func gateKey(e *entry) uint64 { return uint64(e.until) }

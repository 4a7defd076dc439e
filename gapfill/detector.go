package gapfill

import (
	"sort"
	"time"
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
}

// WithDefaults fills the retry bounds.
func (p Policy) WithDefaults() Policy {
	if p.RetryMin <= 0 {
		p.RetryMin = time.Second
	}
	if p.RetryMax <= 0 {
		p.RetryMax = 5 * time.Minute
	}
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
}

// Detector is the clock of the policy chain for one partition's held jobs.
// It is pure: every method takes the time it should use.
type Detector struct {
	policy Policy
	gaps   map[string]*Gap
}

// NewDetector returns a detector with no held jobs.
func NewDetector(p Policy) *Detector {
	return &Detector{policy: p.WithDefaults(), gaps: map[string]*Gap{}}
}

// Policy is the policy in force.
func (d *Detector) Policy() Policy { return d.policy }

// Hold records that job is held since since; an older record is kept.
func (d *Detector) Hold(job string, since time.Time) {
	if g, ok := d.gaps[job]; ok {
		if since.Before(g.Since) {
			g.Since = since
			g.NextAttempt = since.Add(d.policy.Wait)
		}
		return
	}
	d.gaps[job] = &Gap{JobID: job, Since: since, NextAttempt: since.Add(d.policy.Wait), LastStep: StepWait}
}

// Progress records that a held job moved forward but is still held: it
// waits afresh for the next missing version.
func (d *Detector) Progress(job string, now time.Time) {
	if g, ok := d.gaps[job]; ok {
		g.Since, g.Attempts, g.NextAttempt, g.LastStep, g.LastErr = now, 0, now.Add(d.policy.Wait), StepWait, ""
	}
}

// Close forgets a job whose gap closed.
func (d *Detector) Close(job string) { delete(d.gaps, job) }

// Reset forgets every gap.
func (d *Detector) Reset() { clear(d.gaps) }

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

// Due lists, sorted, the held jobs whose next attempt is due at now.
func (d *Detector) Due(now time.Time) []string {
	if len(d.Steps()) == 0 {
		return nil
	}
	var due []string
	for id, g := range d.gaps {
		if !now.Before(g.NextAttempt) {
			due = append(due, id)
		}
	}
	sort.Strings(due)
	return due
}

// NextDue is the earliest time an attempt falls due, if any.
func (d *Detector) NextDue() (time.Time, bool) {
	if len(d.Steps()) == 0 {
		return time.Time{}, false
	}
	var next time.Time
	for _, g := range d.gaps {
		if next.IsZero() || g.NextAttempt.Before(next) {
			next = g.NextAttempt
		}
	}
	return next, !next.IsZero()
}

// Failed records an attempt that left job held, and schedules the next
// with capped exponential backoff.
func (d *Detector) Failed(job string, now time.Time, last Step, err string) {
	g, ok := d.gaps[job]
	if !ok {
		return
	}
	g.Attempts++
	g.LastStep, g.LastErr = last, err
	wait := d.policy.RetryMin
	for i := 1; i < g.Attempts && wait < d.policy.RetryMax; i++ {
		wait *= 2
	}
	g.NextAttempt = now.Add(min(wait, d.policy.RetryMax))
}

// Gaps returns a copy of every held job's record, sorted by job.
func (d *Detector) Gaps() []Gap {
	out := make([]Gap, 0, len(d.gaps))
	for _, g := range d.gaps {
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].JobID < out[j].JobID })
	return out
}

// Len is the number of held jobs.
func (d *Detector) Len() int { return len(d.gaps) }

// Gap returns job's record, if it is held.
func (d *Detector) Gap(job string) (Gap, bool) {
	g, ok := d.gaps[job]
	if !ok {
		return Gap{}, false
	}
	return *g, true
}

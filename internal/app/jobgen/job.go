package jobgen

import (
	"crypto/md5"
	"encoding/binary"
	"math/bits"
	"strconv"
	"time"
)

// Every random choice of a job is a pure function of the seed, the job's
// number and what it is for (and of the version, for a version's choices),
// so that any record of the stream can be made again on its own, when it
// is emitted, from a few numbers: the stream never needs to be whole.

// What a draw is for.
const (
	tagJob uint64 = iota + 1
	tagVersion
	tagFault
	tagPhase
	tagPartition
)

// draws is a splitmix64 sequence: small, fast, and seeded per purpose.
type draws struct{ s uint64 }

func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// newDraws seeds the draws of tag for (a, b).
func newDraws(seed, tag, a, b uint64) draws {
	s := mix64(seed ^ 0x9e3779b97f4a7c15)
	s = mix64(s ^ tag*0xd1b54a32d192ed03)
	s = mix64(s ^ a*0x8cb92ba72f3d8dd7)
	return draws{s: mix64(s ^ b*0xa0761d6478bd642f)}
}

func (d *draws) next() uint64 {
	d.s += 0x9e3779b97f4a7c15
	return mix64(d.s)
}

// intN is in [0, n).
func (d *draws) intN(n int) int {
	hi, _ := bits.Mul64(d.next(), uint64(n))
	return int(hi)
}

// float64 is in [0, 1).
func (d *draws) float64() float64 { return float64(d.next()>>11) / (1 << 53) }

// Kinds of a job's events.
const (
	kindSnapshot = iota
	kindDelta
	kindDelete
)

// Faults a record can carry, as Record.Fault names them.
const (
	faultNone uint8 = iota
	faultMissing
	faultMisrouted
	faultDuplicate
	faultLate
	faultBad
)

var faultNames = [...]string{"", "missing", "misrouted", "duplicate", "late", "bad"}

// entry is one record of a job, in the order the job's partition gets
// them: which version it carries (0 for a bad record) and where it goes.
type entry struct {
	version int32
	part    int32
	fault   uint8
	bad     uint8 // a bad record's template
}

// job is everything one job's records are made from.
type job struct {
	i    int
	id   []byte
	home int
	// n is the version of its last event before any delete.
	n         int
	jobType   int
	failed    bool
	deleted   bool
	recreated bool
	recType   int
	start     time.Time
	// seq is its records in its partition's order, faults applied.
	seq []entry
	// Which faults it got (counted once, when the stream is planned).
	missing, misrouted, duplicate, late, bad bool
}

var base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// makeJob fills j with job i, reusing j's buffers.
func (g *gen) makeJob(i int, j *job) {
	cfg := &g.cfg
	j.i = i
	j.id = appendJobID(j.id[:0], i)
	j.home = partitionOf(j.id, cfg.Partitions)
	j.start = base.Add(time.Duration(i) * time.Second)
	d := newDraws(cfg.Seed, tagJob, uint64(i), 0)
	j.n = max(cfg.EventsPerJob*3/4+d.intN(cfg.EventsPerJob/2+1), 3)
	j.jobType = d.intN(len(jobTypes))
	j.failed = d.intN(5) == 0
	j.deleted = cfg.DeleteRate > 0 && d.float64() < cfg.DeleteRate
	j.recreated = j.deleted && d.intN(3) == 0
	j.recType = d.intN(len(jobTypes))
	g.sequence(j)
}

// last is the job's final version.
func (j *job) last() int {
	switch {
	case j.recreated:
		return j.n + 2
	case j.deleted:
		return j.n + 1
	}
	return j.n
}

// version is the draws of one version: its kind of change, an increment's
// amount, and where in its second it occurred.
type version struct {
	r, amount int
	jitter    time.Duration
}

func (g *gen) version(j *job, v int) version {
	d := newDraws(g.cfg.Seed, tagVersion, uint64(j.i), uint64(v))
	return version{r: d.intN(10), amount: 1 + d.intN(50), jitter: time.Duration(d.intN(900)) * time.Millisecond}
}

// kind is what the job's event at version v is.
func (g *gen) kind(j *job, v int) int {
	switch {
	case v == 1 || v == j.n+2:
		return kindSnapshot
	case v == j.n+1:
		return kindDelete
	case g.cfg.SnapshotsOnly:
		return kindSnapshot
	case v >= 3 && v < j.n && !g.cfg.DeltasOnly && g.version(j, v).r == 0:
		return kindSnapshot
	}
	return kindDelta
}

// at is when the job's event at version v occurred: a second a version,
// within it at random.
func (g *gen) at(j *job, v int) time.Time {
	return j.start.Add(time.Duration(v)*time.Second + g.version(j, v).jitter)
}

// sequence lays out j's records and applies at most one fault of each
// kind to them.
func (g *gen) sequence(j *job) {
	cfg := &g.cfg
	seq := j.seq[:0]
	for v := 1; v <= j.last(); v++ {
		seq = append(seq, entry{version: int32(v), part: int32(j.home)})
	}
	j.missing, j.misrouted, j.duplicate, j.late, j.bad = false, false, false, false, false
	d := newDraws(cfg.Seed, tagFault, uint64(j.i), 0)
	n := len(seq)
	// Deltas that have a later event of the job may go missing or astray:
	// the later event is what reveals the gap (a missing last delta would
	// be invisible, which no projector can detect).
	pickDelta := func() int {
		cands := 0
		for k := 1; k < n-1; k++ {
			if seq[k].fault == faultNone && g.kind(j, int(seq[k].version)) == kindDelta {
				cands++
			}
		}
		if cands == 0 {
			return -1
		}
		c := d.intN(cands)
		for k := 1; k < n-1; k++ {
			if seq[k].fault == faultNone && g.kind(j, int(seq[k].version)) == kindDelta {
				if c == 0 {
					return k
				}
				c--
			}
		}
		return -1
	}
	if d.float64() < cfg.MissingRate {
		if k := pickDelta(); k >= 0 {
			seq[k].fault = faultMissing
			j.missing = true
		}
	}
	if cfg.Partitions > 1 && d.float64() < cfg.MisrouteRate {
		if k := pickDelta(); k >= 0 {
			seq[k].part = int32((j.home + 1 + d.intN(cfg.Partitions-1)) % cfg.Partitions)
			seq[k].fault = faultMisrouted
			j.misrouted = true
		}
	}
	if d.float64() < cfg.DuplicateRate {
		k := d.intN(n)
		if seq[k].fault == faultNone {
			dup := seq[k]
			dup.fault = faultDuplicate
			seq = insertEntry(seq, min(k+1+d.intN(4), n), dup)
			n++
			j.duplicate = true
		}
	}
	if d.float64() < cfg.LateRate && n > 3 {
		k := 1 + d.intN(n-2)
		if seq[k].fault == faultNone {
			late := seq[k]
			late.fault = faultLate
			to := min(k+1+d.intN(3), n-1)
			seq = append(seq[:k], seq[k+1:]...)
			seq = insertEntry(seq, to, late)
			j.late = true
		}
	}
	if d.float64() < cfg.BadRate {
		at := d.intN(n + 1)
		seq = insertEntry(seq, at, entry{part: int32(j.home), fault: faultBad, bad: uint8(d.intN(len(badValues)))})
		j.bad = true
	}
	if j.missing {
		out := seq[:0]
		for _, e := range seq {
			if e.fault != faultMissing {
				out = append(out, e)
			}
		}
		seq = out
	}
	j.seq = seq
}

func insertEntry(seq []entry, at int, e entry) []entry {
	seq = append(seq, entry{})
	copy(seq[at+1:], seq[at:])
	seq[at] = e
	return seq
}

// state is a job's state in few words: the generator's states all have
// the same few members, so a state at any version is folded from the
// versions' draws without a map (TestFoldIsDeltaApply checks it against
// the delta package's fold of the ops).
type state struct {
	status     string
	jobType    int
	processed  int64
	startedAt  int // the version whose time it holds; 0: absent
	finishedAt int
	errored    bool
	progress   bool
	stage      int // 0: absent
	warning    bool
	retries    int64 // 0: absent
	recreated  bool
}

// apply folds version v's change into s.
func (g *gen) apply(s *state, j *job, v int) {
	switch {
	case v == 1:
		*s = state{status: "pending", jobType: j.jobType}
	case v == 2:
		s.status, s.startedAt = "running", 2
	case v == j.n && j.failed:
		s.status, s.errored, s.finishedAt = "failed", true, v
	case v == j.n:
		s.status, s.finishedAt = "completed", v
		s.progress, s.stage, s.warning = false, 0, false
	case v == j.n+1:
		*s = state{} // deleted
	case v == j.n+2:
		*s = state{status: "pending", jobType: j.recType, recreated: true}
	default:
		ver := g.version(j, v)
		switch {
		case ver.r == 0 && !g.cfg.DeltasOnly, ver.r == 1:
			s.progress, s.stage = true, v
			if ver.r == 1 {
				s.warning = false
			}
		case ver.r == 2:
			s.progress, s.warning = true, true
			s.retries++
		default:
			s.processed += int64(ver.amount)
		}
	}
}

// stateAt is j's state after version v.
func (g *gen) stateAt(j *job, v int) state {
	var s state
	from := 1
	if j.recreated && v >= j.n+2 {
		from = j.n + 2
	}
	for u := from; u <= v; u++ {
		g.apply(&s, j, u)
	}
	return s
}

// appendOps appends the ops of version v (a delta's, or what a snapshot
// folds in).
func (g *gen) appendOps(b []byte, j *job, v int) []byte {
	set := func(b []byte, path string, value []byte) []byte {
		b = append(b, `{"op":"set","path":"`...)
		b = append(b, path...)
		b = append(b, `","value":`...)
		return append(append(b, value...), '}')
	}
	str := func(s string) []byte { return strconv.AppendQuote(nil, s) }
	tm := func(v int) []byte { return g.appendTime(nil, j, v, time.RFC3339) }
	b = append(b, '[')
	switch {
	case v == 1:
		b = set(b, "/status", str("pending"))
		b = set(append(b, ','), "/job_type", str(jobTypes[j.jobType]))
		b = set(append(b, ','), "/processed_articles", []byte("0"))
		b = set(append(b, ','), "/created_at", append(j.start.AppendFormat([]byte{'"'}, time.RFC3339), '"'))
		if pad := g.cfg.StateBytes - naturalStateBytes; pad > 0 {
			b = set(append(b, ','), "/payload", g.payload)
		}
	case v == 2:
		b = set(b, "/status", str("running"))
		b = set(append(b, ','), "/started_at", tm(2))
	case v == j.n && j.failed:
		b = set(b, "/status", str("failed"))
		b = set(append(b, ','), "/error", str("source unavailable"))
		b = set(append(b, ','), "/finished_at", tm(v))
	case v == j.n:
		b = set(b, "/status", str("completed"))
		b = append(b, `,{"op":"remove","path":"/progress"}`...)
		b = set(append(b, ','), "/finished_at", tm(v))
	default:
		ver := g.version(j, v)
		switch {
		case ver.r == 0 && !g.cfg.DeltasOnly:
			b = set(b, "/progress/stage", strconv.AppendQuote(nil, "stage-"+strconv.Itoa(v)))
		case ver.r == 1:
			b = set(b, "/progress/stage", strconv.AppendQuote(nil, "stage-"+strconv.Itoa(v)))
			b = append(b, `,{"op":"remove","path":"/progress/warning"}`...)
		case ver.r == 2:
			b = set(b, "/progress/warning", str("slow source"))
			b = append(b, `,{"op":"increment","path":"/retries","by":1}`...)
		default:
			b = append(b, `{"op":"increment","path":"/processed_articles","by":`...)
			b = append(strconv.AppendInt(b, int64(ver.amount), 10), '}')
		}
	}
	return append(b, ']')
}

func (g *gen) appendTime(b []byte, j *job, v int, layout string) []byte {
	b = append(b, '"')
	return append(g.at(j, v).AppendFormat(b, layout), '"')
}

// appendState appends s as JSON. With jsonb set it is exactly the text
// PostgreSQL prints for the state as jsonb (members ordered by the
// length of their name and then its bytes, ": " and ", " between parts),
// which Ref.Hash is the MD5 of; without, it is compact, in that order.
func (g *gen) appendState(b []byte, j *job, s *state, jsonb bool) []byte {
	colon, comma := ":", ","
	if jsonb {
		colon, comma = ": ", ", "
	}
	first := true
	member := func(name string) {
		if !first {
			b = append(b, comma...)
		}
		first = false
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, '"')
		b = append(b, colon...)
	}
	b = append(b, '{')
	if s.errored {
		member("error")
		b = append(b, `"source unavailable"`...)
	}
	member("status")
	b = strconv.AppendQuote(b, s.status)
	if s.recreated {
		member("job_type")
		b = strconv.AppendQuote(b, jobTypes[s.jobType])
		member("recreated")
		return append(b, "true}"...)
	}
	if g.cfg.StateBytes > naturalStateBytes {
		member("payload")
		b = append(b, g.payload...)
	}
	if s.retries > 0 {
		member("retries")
		b = strconv.AppendInt(b, s.retries, 10)
	}
	member("job_type")
	b = strconv.AppendQuote(b, jobTypes[s.jobType])
	if s.progress {
		member("progress")
		b = append(b, '{')
		if s.stage > 0 {
			b = append(b, `"stage"`...)
			b = append(b, colon...)
			b = append(b, `"stage-`...)
			b = append(strconv.AppendInt(b, int64(s.stage), 10), '"')
		}
		if s.warning {
			if s.stage > 0 {
				b = append(b, comma...)
			}
			b = append(b, `"warning"`...)
			b = append(b, colon...)
			b = append(b, `"slow source"`...)
		}
		b = append(b, '}')
	}
	member("created_at")
	b = append(j.start.AppendFormat(append(b, '"'), time.RFC3339), '"')
	if s.startedAt > 0 {
		member("started_at")
		b = g.appendTime(b, j, s.startedAt, time.RFC3339)
	}
	if s.finishedAt > 0 {
		member("finished_at")
		b = g.appendTime(b, j, s.finishedAt, time.RFC3339)
	}
	member("processed_articles")
	b = strconv.AppendInt(b, s.processed, 10)
	return append(b, '}')
}

// stateHash is Ref.Hash of s.
func (g *gen) stateHash(j *job, s *state, buf []byte) (int64, []byte) {
	buf = g.appendState(buf[:0], j, s, true)
	sum := md5.Sum(buf)
	return int64(binary.BigEndian.Uint64(sum[:8])), buf
}

// appendValue appends the value of the record e of j.
func (g *gen) appendValue(b []byte, j *job, e entry) []byte {
	if e.fault == faultBad {
		return appendBad(b, j.id, int(e.bad))
	}
	v := int(e.version)
	kind := g.kind(j, v)
	b = append(b, `{"event_id":"evt-`...)
	b = append(b, j.id...)
	b = append(b, '-')
	b = strconv.AppendInt(b, int64(v), 10)
	b = append(b, `","job_id":"`...)
	b = append(b, j.id...)
	b = append(b, `","kind":"`...)
	b = append(b, [...]string{"snapshot", "delta", "delete"}[kind]...)
	b = append(b, `","occurred_at":`...)
	b = g.appendTime(b, j, v, time.RFC3339Nano)
	switch kind {
	case kindSnapshot:
		s := g.stateAt(j, v)
		b = append(b, `,"state":`...)
		b = g.appendState(b, j, &s, false)
	case kindDelta:
		b = append(b, `,"ops":`...)
		b = g.appendOps(b, j, v)
	}
	b = append(b, `,"version":`...)
	b = strconv.AppendInt(b, int64(v), 10)
	return append(b, '}')
}

var badValues = []string{
	`{"job_id": "broken`,
	`{"job_id":"%s","kind":"snapshot","state":{}}`,
	`{"job_id":"%s","version":0,"kind":"snapshot","state":{}}`,
	`{"job_id":"%s","version":"7","kind":"delta","ops":[]}`,
	`{"job_id":"%s","version":3,"kind":"rumour"}`,
	`{"job_id":"%s","version":3,"kind":"delta","ops":[{"op":"multiply","path":"/n"}]}`,
	``,
}

// appendBad appends bad value k, with the job's id where it has a place
// for one.
func appendBad(b []byte, id []byte, k int) []byte {
	before, after, ok := cutVerb(badValues[k])
	b = append(b, before...)
	if ok {
		b = append(b, id...)
		b = append(b, after...)
	}
	return b
}

func cutVerb(s string) (before, after string, ok bool) {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '%' && s[i+1] == 's' {
			return s[:i], s[i+2:], true
		}
	}
	return s, "", false
}

// appendJobID appends JobID(i).
func appendJobID(b []byte, i int) []byte {
	b = append(b, "job-"...)
	for w := 10000; w > 1 && i < w; w /= 10 {
		b = append(b, '0')
	}
	return strconv.AppendInt(b, int64(i), 10)
}

// partitionOf is PartitionOf without a string.
func partitionOf(id []byte, partitions int) int {
	h := uint32(2166136261)
	for _, c := range id {
		h ^= uint32(c)
		h *= 16777619
	}
	return int(h % uint32(partitions))
}

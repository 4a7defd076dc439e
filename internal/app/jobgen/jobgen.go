package jobgen

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Shapes of a stream: where a job's events sit in its partition's log.
const (
	// ShapeClustered keeps a job's events close together: about 64 jobs
	// are live at a time in a partition, so a batch of the projector
	// folds many versions of each job it holds.
	ShapeClustered = "clustered"
	// ShapeSpread spreads every job's events evenly over its partition's
	// whole log, as long-running jobs side by side would: consecutive
	// events of a job are about as far apart as the partition has jobs,
	// so most events meet a job not seen for a while.
	ShapeSpread = "spread"
)

// Shapes lists the shapes in the order --help shows them.
var Shapes = []string{ShapeClustered, ShapeSpread}

// Config shapes a stream. Rates are per job: the chance that a job gets
// one fault of that kind.
type Config struct {
	Seed         uint64
	Jobs         int
	EventsPerJob int // about; each job gets EventsPerJob ± 25%
	Partitions   int
	// Shape is ShapeClustered (the default) or ShapeSpread.
	Shape string
	// LeanReference keeps the reference as Refs (a version and a state
	// hash a job) instead of Truth (every final state): at millions of
	// jobs the states would take gigabytes.
	LeanReference bool
	// SnapshotsOnly makes every event a full snapshot (the benchmark's
	// baseline workload).
	SnapshotsOnly bool
	// DeltasOnly makes every job one snapshot (its first event) followed
	// by deltas only (the benchmark's deltas workload).
	DeltasOnly bool
	// StateBytes, when above the natural size of a state (about 200
	// bytes), pads every state to about that size with a field no delta
	// touches.
	StateBytes int

	LateRate      float64 // an event produced after later ones of its job
	DuplicateRate float64 // an event delivered twice
	MissingRate   float64 // a delta that never arrives (healed by the authority)
	MisrouteRate  float64 // a delta produced into another partition (healed by re-read)
	BadRate       float64 // a bad record in the job's partition (quarantined)
	// DeleteRate is the chance that a job is deleted after its last
	// event; a third of the deleted jobs are created again by a snapshot
	// one version above the delete.
	DeleteRate float64
}

// WithDefaults fills the demo's defaults.
func (c Config) WithDefaults() Config {
	if c.Jobs == 0 {
		c.Jobs = 2000
	}
	if c.EventsPerJob == 0 {
		c.EventsPerJob = 20
	}
	if c.Partitions == 0 {
		c.Partitions = 6
	}
	if c.Shape == "" {
		c.Shape = ShapeClustered
	}
	return c
}

// Faults counts the faults injected.
type Faults struct {
	Late      int `json:"late"`
	Duplicate int `json:"duplicate"`
	Missing   int `json:"missing"`
	Misrouted int `json:"misrouted"`
	Bad       int `json:"bad"`
	// Deleted jobs end deleted; Recreated ones were deleted and then
	// created again.
	Deleted   int `json:"deleted"`
	Recreated int `json:"recreated"`
}

// Record is one record to produce, in order, at an explicit partition.
type Record struct {
	Partition int
	Key       []byte
	Value     []byte
	// Fault names the fault this record carries, if any.
	Fault string
}

// Truth is a job's final state in the reference model: its version and
// state, or Deleted at Version (no row, no state).
type Truth struct {
	Version int64           `json:"version"`
	State   json.RawMessage `json:"state,omitempty"`
	Deleted bool            `json:"deleted,omitempty"`
}

// Stream is a generated stream with its reference model.
type Stream struct {
	// Records is every record in produce order, for a stream made by
	// Generate. A stream made by Plan leaves it nil: its Reader makes the
	// records as they are read, so that they are never all in memory.
	Records []Record
	// Len counts the stream's records (events, duplicates and bad
	// records).
	Len int
	// Truth is the reference, unless Config.LeanReference; then Refs is,
	// Refs[i] being job JobID(i)'s.
	Truth  map[string]Truth
	Refs   []Ref
	Faults Faults
	// Events counts the job events (without bad records or duplicates).
	Events int
	// Jobs counts the jobs; StateBytes sums their final states' sizes.
	Jobs       int
	StateBytes int64

	g *gen
}

// gen is what a planned stream's records are made from again, record by
// record: the config, and for each job how many records it has and its
// partition (8 bytes a job).
type gen struct {
	cfg     Config
	payload []byte // the padding's JSON string, when StateBytes asks for one
	jobs    []jobInfo
}

type jobInfo struct {
	records uint32
	home    uint32
}

func newGen(cfg Config) *gen {
	g := &gen{cfg: cfg}
	if pad := cfg.StateBytes - naturalStateBytes; pad > 0 {
		g.payload = strconv.AppendQuote(nil, strings.Repeat("x", pad))
	}
	return g
}

// Plan makes a stream's reference model, counts and faults, but not its
// records: its Reader makes them, in produce order, as they are read. The
// same Config always yields the same stream, whatever the size.
func Plan(cfg Config) *Stream {
	cfg = cfg.WithDefaults()
	if !slices.Contains(Shapes, cfg.Shape) {
		panic(fmt.Sprintf("jobgen: shape %q: not one of %v", cfg.Shape, Shapes))
	}
	g := newGen(cfg)
	g.jobs = make([]jobInfo, cfg.Jobs)
	s := &Stream{Jobs: cfg.Jobs, g: g}
	if cfg.LeanReference {
		s.Refs = make([]Ref, cfg.Jobs)
	} else {
		s.Truth = make(map[string]Truth, cfg.Jobs)
	}
	var j job
	var buf []byte
	for i := range cfg.Jobs {
		g.makeJob(i, &j)
		g.jobs[i] = jobInfo{records: uint32(len(j.seq)), home: uint32(j.home)}
		s.Len += len(j.seq)
		s.Events += j.last()
		s.Faults.count(&j)
		last := j.last()
		if j.deleted && !j.recreated {
			if cfg.LeanReference {
				s.Refs[i] = Ref{Version: uint32(last), Deleted: true}
			} else {
				s.Truth[string(j.id)] = Truth{Version: int64(last), Deleted: true}
			}
			continue
		}
		st := g.stateAt(&j, last)
		buf = g.appendState(buf[:0], &j, &st, false)
		s.StateBytes += int64(len(buf))
		if cfg.LeanReference {
			var h int64
			h, buf = g.stateHash(&j, &st, buf)
			s.Refs[i] = Ref{Version: uint32(last), Hash: h}
		} else {
			s.Truth[string(j.id)] = Truth{Version: int64(last), State: slices.Clone(buf)}
		}
	}
	return s
}

// count adds j's faults.
func (f *Faults) count(j *job) {
	one := func(ok bool) int {
		if ok {
			return 1
		}
		return 0
	}
	f.Missing += one(j.missing)
	f.Misrouted += one(j.misrouted)
	f.Duplicate += one(j.duplicate)
	f.Late += one(j.late)
	f.Bad += one(j.bad)
	f.Deleted += one(j.deleted && !j.recreated)
	f.Recreated += one(j.recreated)
}

// Generate is Plan with every record read into Records: for tests and the
// demo, whose streams are small.
func Generate(cfg Config) *Stream {
	s := Plan(cfg)
	s.Records = make([]Record, 0, s.Len)
	rd := s.Reader()
	for {
		recs := rd.Next(4096)
		if len(recs) == 0 {
			return s
		}
		s.Records = append(s.Records, recs...)
	}
}

// Reader yields a stream's records in produce order, making each when it
// is read: partition by partition 50 records at a time, each partition's
// log being its jobs' records placed as the stream's shape has them (and
// the records misrouted from it, where they fell). It holds 16 bytes a
// job (spread) or the 64 jobs being placed (clustered), never the
// records it has yielded.
type Reader struct {
	g       *gen
	parts   []placer
	pending []Record
	slab    []byte
	done    bool
}

// placer makes one partition's log.
type placer interface {
	// next appends up to n of the log's next records to out.
	next(out []Record, n int, mk *maker) []Record
}

// Reader starts reading the stream from its first record; every Reader of
// a stream yields the same records.
func (s *Stream) Reader() *Reader {
	r := &Reader{g: s.g, parts: make([]placer, s.g.cfg.Partitions)}
	for p := range r.parts {
		if s.g.cfg.Shape == ShapeSpread {
			r.parts[p] = newSpreadPlacer(s.g, p)
		} else {
			r.parts[p] = &clusteredPlacer{g: s.g, p: p, d: newDraws(s.g.cfg.Seed, tagPartition, uint64(p), 0)}
		}
	}
	return r
}

// Next returns the stream's next n records, fewer only at its end (none
// after it). The records are the caller's: the Reader keeps none.
func (r *Reader) Next(n int) []Record {
	mk := &maker{g: r.g, slab: r.slab}
	for len(r.pending) < n && !r.done {
		had := len(r.pending)
		for _, p := range r.parts {
			r.pending = p.next(r.pending, 50, mk)
		}
		r.done = len(r.pending) == had
	}
	r.slab = mk.slab
	k := min(n, len(r.pending))
	out := r.pending[:k:k]
	r.pending = slices.Clone(r.pending[k:])
	return out
}

// maker makes records into a slab of bytes shared by many.
type maker struct {
	g    *gen
	slab []byte
}

func (m *maker) record(j *job, e entry) Record {
	if cap(m.slab)-len(m.slab) < 4096+len(m.g.payload)*2 {
		m.slab = make([]byte, 0, max(1<<20, 16*len(m.g.payload)))
	}
	at := len(m.slab)
	m.slab = append(m.slab, j.id...)
	key := m.slab[at:len(m.slab):len(m.slab)]
	at = len(m.slab)
	m.slab = m.g.appendValue(m.slab, j, e)
	return Record{Partition: int(e.part), Key: key, Value: m.slab[at:len(m.slab):len(m.slab)], Fault: faultNames[e.fault]}
}

// spreadPlacer places each job's records evenly over the whole log,
// keeping each job's own order: the k-th of a job's n records goes to
// about (k + phase) / n of the way, the phase drawn once a job so that
// jobs with as many records do not all move in step. A heap holds each
// job's next place.
type spreadPlacer struct {
	g    *gen
	heap []slot
	j    job
}

type slot struct {
	at  float64
	job uint32
	k   uint32
}

func (a slot) before(b slot) bool { return a.at < b.at || a.at == b.at && a.job < b.job }

func (g *gen) phase(i int) float64 {
	d := newDraws(g.cfg.Seed, tagPhase, uint64(i), 0)
	return d.float64()
}

func newSpreadPlacer(g *gen, p int) *spreadPlacer {
	s := &spreadPlacer{g: g}
	for i, info := range g.jobs {
		if int(info.home) == p {
			s.heap = append(s.heap, slot{at: g.phase(i) / float64(info.records), job: uint32(i)})
		}
	}
	for i := len(s.heap)/2 - 1; i >= 0; i-- {
		s.down(i)
	}
	return s
}

func (s *spreadPlacer) down(i int) {
	h := s.heap
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h[r].before(h[l]) {
			m = r
		}
		if !h[m].before(h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

func (s *spreadPlacer) next(out []Record, n int, mk *maker) []Record {
	for ; n > 0 && len(s.heap) > 0; n-- {
		top := s.heap[0]
		s.g.makeJob(int(top.job), &s.j)
		out = append(out, mk.record(&s.j, s.j.seq[top.k]))
		if m := len(s.j.seq); int(top.k)+1 < m {
			k := top.k + 1
			s.heap[0] = slot{at: (float64(k) + s.g.phase(int(top.job))) / float64(m), job: top.job, k: k}
		} else {
			s.heap[0] = s.heap[len(s.heap)-1]
			s.heap = s.heap[:len(s.heap)-1]
		}
		s.down(0)
	}
	if len(s.heap) == 0 {
		s.heap = nil
	}
	return out
}

// clusteredPlacer interleaves the jobs of the partition 64 at a time, so
// that a batch holds many jobs: it draws which live job of the 64 gives
// the next record, keeping each job's own order.
type clusteredPlacer struct {
	g    *gen
	p    int
	d    draws
	scan int // the next job to look at for the next 64
	// active are the 64 jobs being placed, live the indexes of those with
	// records left, in job order.
	active []job
	taken  []int
	live   []int
}

func (c *clusteredPlacer) next(out []Record, n int, mk *maker) []Record {
	const window = 64
	for ; n > 0; n-- {
		if len(c.live) == 0 {
			c.active = c.active[:0]
			for ; c.scan < len(c.g.jobs) && len(c.active) < window; c.scan++ {
				if int(c.g.jobs[c.scan].home) != c.p {
					continue
				}
				if len(c.active) < cap(c.active) {
					c.active = c.active[:len(c.active)+1]
				} else {
					c.active = append(c.active, job{})
				}
				c.g.makeJob(c.scan, &c.active[len(c.active)-1])
			}
			if len(c.active) == 0 {
				return out
			}
			c.taken = append(c.taken[:0], make([]int, len(c.active))...)
			c.live = c.live[:0]
			for a := range c.active {
				c.live = append(c.live, a)
			}
		}
		li := c.d.intN(len(c.live))
		a := c.live[li]
		j := &c.active[a]
		out = append(out, mk.record(j, j.seq[c.taken[a]]))
		if c.taken[a]++; c.taken[a] == len(j.seq) {
			c.live = slices.Delete(c.live, li, li+1)
		}
	}
	return out
}

// PartitionOf routes a job id to a partition the way the generator's
// producer does.
func PartitionOf(id string, partitions int) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % uint32(partitions))
}

// naturalStateBytes is about the size of a generated state without
// padding.
const naturalStateBytes = 200

var jobTypes = []string{"crawl", "index", "export", "summarize"}

// JobIDs lists the stream's jobs, sorted.
func (s *Stream) JobIDs() []string {
	ids := make([]string, 0, s.Jobs)
	for i := range s.Jobs {
		ids = append(ids, JobID(i))
	}
	sort.Strings(ids)
	return ids
}

// DistinctJobsPerBatch is the mean, over the batches of partition p's log
// cut every batchSize records, of the distinct jobs a batch holds: what
// the projector's batches hold when each is full (a batch cut short by
// its linger holds fewer). It reads Records (see Batches for a stream
// read by a Reader).
func (s *Stream) DistinctJobsPerBatch(p, batchSize int) float64 {
	b := NewBatches(p, batchSize)
	b.Add(s.Records)
	return b.Mean()
}

// Batches measures DistinctJobsPerBatch of records given in produce
// order, a chunk at a time.
type Batches struct {
	p, size           int
	seen              map[string]struct{}
	n, batches, total int
}

// NewBatches counts partition p's log cut every size records.
func NewBatches(p, size int) *Batches {
	return &Batches{p: p, size: size, seen: map[string]struct{}{}}
}

// Add counts the next records of the stream.
func (b *Batches) Add(recs []Record) {
	for _, r := range recs {
		if r.Partition != b.p {
			continue
		}
		b.seen[string(r.Key)] = struct{}{}
		if b.n++; b.n == b.size {
			b.batches++
			b.total += len(b.seen)
			clear(b.seen)
			b.n = 0
		}
	}
}

// Mean is the mean of the distinct jobs of the batches so far, the last
// one counted even if short.
func (b *Batches) Mean() float64 {
	batches, total := b.batches, b.total
	if b.n > 0 {
		batches++
		total += len(b.seen)
	}
	if batches == 0 {
		return 0
	}
	return float64(total) / float64(batches)
}

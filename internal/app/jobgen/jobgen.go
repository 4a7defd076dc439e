package jobgen

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/projector/projector/delta"
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
	Records []Record
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
}

type ev struct {
	job       string
	version   int64
	value     []byte
	isDelta   bool
	recreated bool // a snapshot that creates a deleted job again
}

// Generate builds a stream. The same Config always yields the same stream.
func Generate(cfg Config) *Stream {
	cfg = cfg.WithDefaults()
	if !slices.Contains(Shapes, cfg.Shape) {
		panic(fmt.Sprintf("jobgen: shape %q: not one of %v", cfg.Shape, Shapes))
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	s := &Stream{Jobs: cfg.Jobs}
	if cfg.LeanReference {
		s.Refs = make([]Ref, cfg.Jobs)
	} else {
		s.Truth = make(map[string]Truth, cfg.Jobs)
	}
	perPart := make([][]Record, cfg.Partitions)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	for i := 0; i < cfg.Jobs; i++ {
		id := JobID(i)
		p := PartitionOf(id, cfg.Partitions)
		evs, truth := history(rng, id, cfg, base.Add(time.Duration(i)*time.Second))
		s.StateBytes += int64(len(truth.State))
		if cfg.LeanReference {
			ref := Ref{Version: uint32(truth.Version), Deleted: truth.Deleted}
			if !truth.Deleted {
				h, err := StateHash(truth.State)
				if err != nil {
					panic(err)
				}
				ref.Hash = h
			}
			s.Refs[i] = ref
		} else {
			s.Truth[id] = truth
		}
		switch {
		case truth.Deleted:
			s.Faults.Deleted++
		case len(evs) > 0 && evs[len(evs)-1].recreated:
			s.Faults.Recreated++
		}
		s.Events += len(evs)
		recs := make([]Record, len(evs))
		key := []byte(id) // one key a job, shared by its records
		for k, e := range evs {
			recs[k] = Record{Partition: p, Key: key, Value: e.value}
		}
		recs = s.inject(rng, cfg, evs, recs, p)
		perPart[p] = append(perPart[p], recs...)
	}
	// Interleave jobs within each partition so a batch holds many jobs,
	// keeping each job's own order (faults already placed it).
	for p := range perPart {
		if cfg.Shape == ShapeSpread {
			perPart[p] = spread(rng, perPart[p])
		} else {
			perPart[p] = interleave(rng, perPart[p])
		}
	}
	// Misrouted records sit in another partition; gather all by round robin.
	for more := true; more; {
		more = false
		for p := range perPart {
			n := min(len(perPart[p]), 50)
			if n > 0 {
				s.Records = append(s.Records, perPart[p][:n]...)
				perPart[p] = perPart[p][n:]
				more = true
			}
		}
	}
	return s
}

// inject applies at most one fault of each kind to a job's records.
func (s *Stream) inject(rng *rand.Rand, cfg Config, evs []ev, recs []Record, p int) []Record {
	n := len(recs)
	// Deltas that have a later event of the job may go missing or astray:
	// the later event is what reveals the gap (a missing last delta would
	// be invisible, which no projector can detect).
	pickDelta := func() int {
		var cands []int
		for k := 1; k < n-1; k++ {
			if evs[k].isDelta && recs[k].Fault == "" {
				cands = append(cands, k)
			}
		}
		if len(cands) == 0 {
			return -1
		}
		return cands[rng.IntN(len(cands))]
	}
	drop := -1
	if rng.Float64() < cfg.MissingRate {
		if k := pickDelta(); k >= 0 {
			drop = k
			recs[k].Fault = "missing"
			s.Faults.Missing++
		}
	}
	if cfg.Partitions > 1 && rng.Float64() < cfg.MisrouteRate {
		if k := pickDelta(); k >= 0 {
			recs[k].Partition = (p + 1 + rng.IntN(cfg.Partitions-1)) % cfg.Partitions
			recs[k].Fault = "misrouted"
			s.Faults.Misrouted++
		}
	}
	if rng.Float64() < cfg.DuplicateRate {
		k := rng.IntN(n)
		if recs[k].Fault == "" {
			dup := recs[k]
			dup.Fault = "duplicate"
			at := min(k+1+rng.IntN(4), n)
			recs = insert(recs, at, dup)
			evs = insertEv(evs, at, evs[k])
			n++
			s.Faults.Duplicate++
		}
	}
	if rng.Float64() < cfg.LateRate && n > 3 {
		k := 1 + rng.IntN(n-2)
		if recs[k].Fault == "" {
			late := recs[k]
			late.Fault = "late"
			to := min(k+1+rng.IntN(3), n-1)
			recs = append(recs[:k], recs[k+1:]...)
			recs = insert(recs, to, late)
			s.Faults.Late++
		}
	}
	if rng.Float64() < cfg.BadRate {
		at := rng.IntN(n + 1)
		recs = insert(recs, at, badRecord(rng, string(recs[0].Key), p))
		s.Faults.Bad++
	}
	if drop >= 0 {
		out := recs[:0]
		for _, r := range recs {
			if r.Fault != "missing" {
				out = append(out, r)
			}
		}
		recs = out
	}
	return recs
}

func insert(recs []Record, at int, r Record) []Record {
	recs = append(recs, Record{})
	copy(recs[at+1:], recs[at:])
	recs[at] = r
	return recs
}

func insertEv(evs []ev, at int, e ev) []ev {
	evs = append(evs, ev{})
	copy(evs[at+1:], evs[at:])
	evs[at] = e
	return evs
}

// interleave merges jobs' runs so that records of many jobs alternate,
// preserving each job's own order.
func interleave(rng *rand.Rand, recs []Record) []Record {
	byJob := map[string][]Record{}
	var order []string
	for _, r := range recs {
		k := string(r.Key)
		if _, ok := byJob[k]; !ok {
			order = append(order, k)
		}
		byJob[k] = append(byJob[k], r)
	}
	out := make([]Record, 0, len(recs))
	window := 64
	for start := 0; start < len(order); start += window {
		active := order[start:min(start+window, len(order))]
		for {
			var live []string
			for _, k := range active {
				if len(byJob[k]) > 0 {
					live = append(live, k)
				}
			}
			if len(live) == 0 {
				break
			}
			k := live[rng.IntN(len(live))]
			out = append(out, byJob[k][0])
			byJob[k] = byJob[k][1:]
		}
	}
	return out
}

// spread places each job's records evenly over the whole of recs, keeping
// each job's own order: the k-th of a job's n records goes to about
// (k + phase) / n of the way, the phase drawn once a job so that jobs
// with as many records do not all move in step.
func spread(rng *rand.Rand, recs []Record) []Record {
	type placed struct {
		at  float64
		rec Record
	}
	out := make([]placed, 0, len(recs))
	for start := 0; start < len(recs); {
		end := start + 1
		for end < len(recs) && string(recs[end].Key) == string(recs[start].Key) {
			end++
		}
		n, phase := float64(end-start), rng.Float64()
		for k, r := range recs[start:end] {
			out = append(out, placed{at: (float64(k) + phase) / n, rec: r})
		}
		start = end
	}
	slices.SortStableFunc(out, func(a, b placed) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return 0
	})
	res := recs[:0]
	for _, p := range out {
		res = append(res, p.rec)
	}
	return res
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

// history is one job's events and final state.
func history(rng *rand.Rand, id string, cfg Config, start time.Time) ([]ev, Truth) {
	n := max(cfg.EventsPerJob*3/4+rng.IntN(cfg.EventsPerJob/2+1), 3)
	state := map[string]any{}
	var evs []ev
	at := start
	emit := func(v int64, ops []map[string]any, snapshot bool) {
		at = at.Add(time.Duration(100+rng.IntN(900)) * time.Millisecond)
		if ops != nil {
			raw, _ := json.Marshal(ops)
			parsed, err := delta.ParseOps(raw)
			if err != nil {
				panic(err)
			}
			next, err := delta.Apply(state, parsed)
			if err != nil {
				panic(err)
			}
			state = next
		}
		rec := map[string]any{
			"job_id": id, "version": v, "event_id": fmt.Sprintf("evt-%s-%d", id, v),
			"occurred_at": at.Format(time.RFC3339Nano),
		}
		if snapshot || cfg.SnapshotsOnly {
			raw, _ := delta.EncodeState(state)
			rec["kind"], rec["state"] = "snapshot", raw
		} else {
			rec["kind"], rec["ops"] = "delta", ops
		}
		val, _ := json.Marshal(rec)
		evs = append(evs, ev{job: id, version: v, value: val, isDelta: rec["kind"] == "delta"})
	}
	set := func(path string, v any) map[string]any { return map[string]any{"op": "set", "path": path, "value": v} }

	first := []map[string]any{
		set("/status", "pending"), set("/job_type", jobTypes[rng.IntN(len(jobTypes))]),
		set("/processed_articles", 0), set("/created_at", start.Format(time.RFC3339)),
	}
	if pad := cfg.StateBytes - naturalStateBytes; pad > 0 {
		first = append(first, set("/payload", strings.Repeat("x", pad)))
	}
	emit(1, first, true)
	emit(2, []map[string]any{set("/status", "running"), set("/started_at", at.Format(time.RFC3339))}, false)
	for v := int64(3); v < int64(n); v++ {
		switch r := rng.IntN(10); {
		case r == 0 && !cfg.DeltasOnly:
			emit(v, []map[string]any{set("/progress/stage", fmt.Sprintf("stage-%d", v))}, true)
		case r == 1:
			emit(v, []map[string]any{set("/progress/stage", fmt.Sprintf("stage-%d", v)), {"op": "remove", "path": "/progress/warning"}}, false)
		case r == 2:
			emit(v, []map[string]any{set("/progress/warning", "slow source"), {"op": "increment", "path": "/retries", "by": 1}}, false)
		default:
			emit(v, []map[string]any{{"op": "increment", "path": "/processed_articles", "by": 1 + rng.IntN(50)}}, false)
		}
	}
	if rng.IntN(5) == 0 {
		emit(int64(n), []map[string]any{set("/status", "failed"), set("/error", "source unavailable"), set("/finished_at", at.Format(time.RFC3339))}, false)
	} else {
		emit(int64(n), []map[string]any{set("/status", "completed"), {"op": "remove", "path": "/progress"}, set("/finished_at", at.Format(time.RFC3339))}, false)
	}
	raw, _ := delta.EncodeState(state)
	truth := Truth{Version: int64(n), State: raw}
	if cfg.DeleteRate > 0 && rng.Float64() < cfg.DeleteRate {
		// Deleted after its last event: purged, cancelled or erased.
		at = at.Add(time.Second)
		del, _ := json.Marshal(map[string]any{
			"job_id": id, "version": n + 1, "kind": "delete", "event_id": fmt.Sprintf("evt-%s-%d", id, n+1),
			"occurred_at": at.Format(time.RFC3339Nano),
		})
		evs = append(evs, ev{job: id, version: int64(n + 1), value: del})
		truth = Truth{Version: int64(n + 1), Deleted: true}
		if rng.IntN(3) == 0 {
			// Created again, from nothing, by a snapshot above the delete.
			state = map[string]any{"status": "pending", "job_type": jobTypes[rng.IntN(len(jobTypes))], "recreated": true}
			raw, _ := delta.EncodeState(state)
			snap, _ := json.Marshal(map[string]any{
				"job_id": id, "version": n + 2, "kind": "snapshot", "state": raw, "event_id": fmt.Sprintf("evt-%s-%d", id, n+2),
				"occurred_at": at.Add(time.Second).Format(time.RFC3339Nano),
			})
			evs = append(evs, ev{job: id, version: int64(n + 2), value: snap, recreated: true})
			truth = Truth{Version: int64(n + 2), State: raw}
		}
	}
	return evs, truth
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

func badRecord(rng *rand.Rand, id string, p int) Record {
	tmpl := badValues[rng.IntN(len(badValues))]
	v := tmpl
	if len(tmpl) > 0 && tmpl[len(tmpl)-1] == '}' && countVerbs(tmpl) == 1 {
		v = fmt.Sprintf(tmpl, id)
	}
	return Record{Partition: p, Key: []byte(id), Value: []byte(v), Fault: "bad"}
}

func countVerbs(s string) int {
	n := 0
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '%' && s[i+1] == 's' {
			n++
		}
	}
	return n
}

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
// its linger holds fewer).
func (s *Stream) DistinctJobsPerBatch(p, batchSize int) float64 {
	seen := map[string]struct{}{}
	var batches, sum, n int
	flush := func() {
		if n > 0 {
			batches++
			sum += len(seen)
			clear(seen)
			n = 0
		}
	}
	for _, r := range s.Records {
		if r.Partition != p {
			continue
		}
		seen[string(r.Key)] = struct{}{}
		if n++; n == batchSize {
			flush()
		}
	}
	flush()
	if batches == 0 {
		return 0
	}
	return float64(sum) / float64(batches)
}

package observe

import (
	"container/heap"
	"encoding/base64"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// The bounds of the list of held jobs that a status (the engine's
// StatusPage, and /status) gives. However many jobs are held, a status
// lists at most MaxHeldLimit of them, and each partition keeps only its MaxHeldLimit
// oldest for it: a status costs the same with fifty thousand held jobs as
// with a thousand.
const (
	// DefaultHeldLimit is how many held jobs a status lists unless asked
	// for another number.
	DefaultHeldLimit = 100
	// MaxHeldLimit is the most a status lists at once, and how many of
	// its oldest held jobs each partition keeps for the list.
	MaxHeldLimit = 1000
)

// HeldQuery chooses the held jobs a status lists: the oldest that come
// after After, up to Limit. Jobs are ordered by how long they have been
// held (HeldJob.Since), then by partition, then by job id.
type HeldQuery struct {
	// Limit is how many to list, 1 to MaxHeldLimit; 0 means
	// DefaultHeldLimit.
	Limit int
	// After is the HeldPage.Next of the page before; empty starts from the
	// oldest held job.
	After string
}

// HeldPage says which of this instance's held jobs the partitions' Held
// lists of a [Status] show, and how to ask for the next ones.
type HeldPage struct {
	Limit int    `json:"limit"`
	After string `json:"after,omitempty"`
	// Listed is how many held jobs the partitions' Held lists show;
	// Omitted how many of the instance's held jobs they leave out (before
	// After, after this page, or beyond the view).
	Listed  int   `json:"listed"`
	Omitted int64 `json:"omitted"`
	// Next is the After of the next page; empty when no later held job
	// can be listed.
	Next string `json:"next,omitempty"`
	// Beyond counts the held jobs that no page can list: those younger
	// than their partition's MaxHeldLimit oldest. A page ends at the
	// youngest job such a partition keeps. projector status lists every
	// held job from PostgreSQL.
	Beyond int64 `json:"beyond"`
}

// errHeldQuery is a HeldQuery that cannot be answered.
var errHeldQuery = errors.New("bad held jobs query")

// heldKey is where a held job sorts in a status's list.
type heldKey struct {
	since     int64 // HeldJob.Since in Unix nanoseconds
	partition int
	job       string
}

func (a heldKey) before(b heldKey) bool {
	if a.since != b.since {
		return a.since < b.since
	}
	if a.partition != b.partition {
		return a.partition < b.partition
	}
	return a.job < b.job
}

func keyOf(partition int, h HeldJob) heldKey {
	return heldKey{since: h.Since.UnixNano(), partition: partition, job: h.JobID}
}

// String is k as a HeldPage cursor: opaque to its reader, safe in a URL.
func (k heldKey) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(k.since, 10) + "." + strconv.Itoa(k.partition) + "." + k.job))
}

func parseHeldKey(s string) (heldKey, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		parts := strings.SplitN(string(b), ".", 3)
		if len(parts) == 3 {
			since, err1 := strconv.ParseInt(parts[0], 10, 64)
			partition, err2 := strconv.Atoi(parts[1])
			if err1 == nil && err2 == nil {
				return heldKey{since: since, partition: partition, job: parts[2]}, nil
			}
		}
	}
	return heldKey{}, fmt.Errorf("%w: held_after %q is not a cursor a status gave (held_page.next)", errHeldQuery, clipString(s))
}

// SortHeld sorts a partition's view of its held jobs by heldKey.
func SortHeld(partition int, jobs []HeldJob) []HeldJob {
	sort.Slice(jobs, func(i, j int) bool { return keyOf(partition, jobs[i]).before(keyOf(partition, jobs[j])) })
	return jobs
}

// PageHeld fills parts' Held lists with the page q asks for, from each
// partition's view, and says what it shows. It costs a search per
// partition and a step per job listed, whatever the number held.
func PageHeld(parts []PartitionStatus, q HeldQuery) (HeldPage, error) {
	limit := q.Limit
	switch {
	case limit == 0:
		limit = DefaultHeldLimit
	case limit < 0 || limit > MaxHeldLimit:
		return HeldPage{}, fmt.Errorf("%w: held_limit %d: want 1 to %d", errHeldQuery, limit, MaxHeldLimit)
	}
	pg := HeldPage{Limit: limit, After: q.After}
	var after *heldKey
	if q.After != "" {
		k, err := parseHeldKey(q.After)
		if err != nil {
			return HeldPage{}, err
		}
		after = &k
	}
	// bound is the youngest job that a partition with more held jobs than
	// it keeps shows: past it, a job of that partition may be missing.
	var bound *heldKey
	var held int64
	h := make(heldHeads, 0, len(parts))
	for i := range parts {
		ps := &parts[i]
		ps.Held = []HeldJob{}
		held += int64(ps.HeldJobs)
		if n := len(ps.View); ps.HeldJobs > n {
			pg.Beyond += int64(ps.HeldJobs - n)
			if ps.ViewOf > n && n > 0 {
				if k := keyOf(ps.Partition, ps.View[n-1]); bound == nil || k.before(*bound) {
					bound = &k
				}
			}
		}
		start := 0
		if after != nil {
			start = sort.Search(len(ps.View), func(j int) bool { return after.before(keyOf(ps.Partition, ps.View[j])) })
		}
		if start < len(ps.View) {
			h = append(h, heldHead{part: i, next: start, key: keyOf(ps.Partition, ps.View[start])})
		}
	}
	heap.Init(&h)
	within := func(k heldKey) bool { return bound == nil || !bound.before(k) }
	var last heldKey
	for len(h) > 0 && within(h[0].key) {
		if pg.Listed == limit {
			pg.Next = last.String()
			break
		}
		top := &h[0]
		ps := &parts[top.part]
		ps.Held = append(ps.Held, ps.View[top.next])
		pg.Listed++
		last = top.key
		if top.next++; top.next < len(ps.View) {
			top.key = keyOf(ps.Partition, ps.View[top.next])
			heap.Fix(&h, 0)
		} else {
			heap.Pop(&h)
		}
	}
	pg.Omitted = held - int64(pg.Listed)
	return pg, nil
}

// heldHeads is a min-heap of partitions by the key of the next job each
// would list.
type heldHeads []heldHead

type heldHead struct {
	part, next int
	key        heldKey
}

func (h heldHeads) Len() int           { return len(h) }
func (h heldHeads) Less(i, j int) bool { return h[i].key.before(h[j].key) }
func (h heldHeads) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *heldHeads) Push(x any)        { *h = append(*h, x.(heldHead)) }
func (h *heldHeads) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func clipString(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

package projection

import (
	"hash/maphash"
	"sync/atomic"
)

// writtenBits is the size of a [writtenSet], in bits: 2 MiB. At a million
// jobs it answers "maybe" for about one job in 200 never written, at five
// million for about one in five; past that it reads more, never less.
const writtenBits = 1 << 24

// writtenSet is a Bloom filter of the jobs a rebuild that started from an
// empty shadow has planned a write for, in any of its partitions. A job it
// has not seen has no row and no tombstone in the shadow (this process is
// its only writer while it holds [store.Store.LockRebuild], and adds a job
// before its write can commit), so the plan takes it as new without reading
// it: a rebuild from scratch read every job it met, and found none; its
// write copies it in ([store.Write.New]). Should the shadow hold the job all
// the same, the copy meets its key (or the read before it its tombstone),
// the batch is stale, and the job is read again ([worker.reload]) and
// cached: a wrong answer costs a retry, never a wrong row (if a check
// constraint refuses the state planned from nothing, [worker.commit] plans
// the batch again with those rows read). Its memory is fixed, whatever the
// number of jobs; more jobs only make "maybe" more frequent. Safe for
// concurrent use.
type writtenSet struct {
	bits []atomic.Uint64
	seed maphash.Seed
}

func newWrittenSet() *writtenSet {
	return &writtenSet{bits: make([]atomic.Uint64, writtenBits/64), seed: maphash.MakeSeed()}
}

// probes are the three bits of id (double hashing of one 64-bit hash).
func (s *writtenSet) probes(id string) [3]uint64 {
	h := maphash.String(s.seed, id)
	a, b := h&(writtenBits-1), (h>>32)|1
	return [3]uint64{a, (a + b) & (writtenBits - 1), (a + 2*b) & (writtenBits - 1)}
}

// add records that id may have a row or a tombstone from now on.
func (s *writtenSet) add(id string) {
	for _, p := range s.probes(id) {
		w := &s.bits[p/64]
		if m := uint64(1) << (p % 64); w.Load()&m == 0 {
			w.Or(m)
		}
	}
}

// mayHold reports whether id may have been added; false is certain.
func (s *writtenSet) mayHold(id string) bool {
	for _, p := range s.probes(id) {
		if s.bits[p/64].Load()&(uint64(1)<<(p%64)) == 0 {
			return false
		}
	}
	return true
}

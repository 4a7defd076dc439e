package delta

import (
	"bytes"
	"encoding/json"
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"
)

// A stream repeats a handful of paths (/processed_articles, /status) and
// small increments millions of times. Decoding each op made a new path
// string, a new token slice and a new amount string: three of the nine
// allocations of decoding a delta record, and the garbage collector's work
// that goes with them. What is interned here is shared by every op that
// names it, so an [Op]'s Path, Tokens and By are read-only.

// maxInternedPaths bounds the path table: a stream whose paths are all
// different (ids in paths) fills it once and then parses as before.
const maxInternedPaths = 512

// maxInternedPathBytes is the longest path literal kept.
const maxInternedPathBytes = 64

// internedPath is a valid path and its tokens.
type internedPath struct {
	path   string
	tokens []string
}

// paths maps a path member's raw JSON literal, quotes included, to the
// parsed path. Readers load the map without a lock; a writer copies it
// (at most maxInternedPaths times in a process's life).
var (
	paths   atomic.Pointer[map[string]internedPath]
	pathsMu sync.Mutex
)

// internedPathOf returns the path a raw path literal parsed to before.
func internedPathOf(raw []byte) (internedPath, bool) {
	m := paths.Load()
	if m == nil {
		return internedPath{}, false
	}
	p, ok := (*m)[string(raw)] // no allocation for a lookup
	return p, ok
}

// internPath remembers what raw parsed to, while the table has room.
func internPath(raw []byte, path string, tokens []string) {
	if len(raw) > maxInternedPathBytes {
		return
	}
	if m := paths.Load(); m != nil && len(*m) >= maxInternedPaths {
		return // full: no lock taken for the paths that miss from now on
	}
	pathsMu.Lock()
	defer pathsMu.Unlock()
	old := paths.Load()
	n := 0
	if old != nil {
		n = len(*old)
	}
	if n >= maxInternedPaths {
		return
	}
	next := make(map[string]internedPath, n+1)
	if old != nil {
		for k, v := range *old {
			next[k] = v
		}
	}
	next[string(raw)] = internedPath{path: path, tokens: tokens}
	paths.Store(&next)
}

// smallAmounts are the amounts 0 to 999 as an increment writes them.
var smallAmounts = func() (a [1000]string) {
	for i := range a {
		a[i] = strconv.Itoa(i)
	}
	return a
}()

// amountOf returns a number literal as a string, without allocating for
// the small non-negative integers most increments add.
func amountOf(b []byte) string {
	if n, ok := smallInt(b); ok {
		return smallAmounts[n]
	}
	return string(b)
}

// smallInt reads a number literal of 0 to 999 written as JSON writes it
// (no leading zero).
func smallInt(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 3 || (b[0] == '0' && len(b) > 1) {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// smallNumbers are the amounts 0 to 999 as a decoded state holds them,
// already boxed: a state's counters and sizes are mostly small.
var smallNumbers = func() (a [1000]any) {
	for i := range a {
		a[i] = json.Number(smallAmounts[i])
	}
	return a
}()

// numberOf returns a valid JSON number literal as a decoded state holds
// it, without allocating for 0 to 999.
func numberOf(b []byte) any {
	if n, ok := smallInt(b); ok {
		return smallNumbers[n]
	}
	return json.Number(b)
}

// The member names of a stream's states are a few dozen, repeated in
// every state: decoding one made a string for each name. nameSlots keeps
// the first name seen at each hash: a name found there is shared, with no
// allocation. Names are read-only strings, so sharing them is safe. A slot
// is never replaced, so names that miss (ids as names, or two names that
// share a slot) cost what they did without the table: one string each.
const (
	nameSlotCount    = 4096
	maxInternedNames = 64 // the longest name kept, in bytes
)

var (
	nameSlots [nameSlotCount]atomic.Pointer[string]
	nameSeed  = maphash.MakeSeed()
)

// nameOf returns the text of a member name's valid string literal.
func nameOf(raw []byte) string {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return unquote(raw) // not valid JSON: see DecodeValidState
	}
	body := raw[1 : len(raw)-1]
	if len(body) > maxInternedNames || bytes.IndexByte(body, '\\') >= 0 {
		return unquote(raw)
	}
	slot := &nameSlots[maphash.Bytes(nameSeed, body)&(nameSlotCount-1)]
	if p := slot.Load(); p != nil {
		if *p == string(body) {
			return *p
		}
		return unquote(raw) // the slot is another name's
	}
	s := unquote(raw)
	slot.CompareAndSwap(nil, &s)
	return s
}

package delta

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Kind names what an [Op] does.
type Kind string

// The op kinds of docs/contract.md section 1.
const (
	Set       Kind = "set"
	Remove    Kind = "remove"
	Increment Kind = "increment"
)

// MaxOps is the most ops one delta may carry.
const MaxOps = 1000

// MaxPathDepth bounds a path's levels. Together with the bound on a value's
// nesting it keeps every state shallow enough to be stored and read back:
// an op can only address, and so only deepen, what is within its reach.
const MaxPathDepth = 256

// Op is one validated operation of a delta.
type Op struct {
	Kind Kind
	// Path is the op's JSON Pointer as written by the producer.
	Path string
	// Tokens is Path split and unescaped (~1 is "/", ~0 is "~"); never empty.
	Tokens []string
	// Value is the JSON value of a set op.
	Value json.RawMessage
	// By is the amount of an increment op, as the producer wrote it.
	By json.Number
}

// OpError says which op of a delta is malformed and why.
type OpError struct {
	Index  int    // position in the ops array; -1 for the array itself
	Field  string // "ops", "op", "path", "value" or "by"
	Reason string
}

func (e *OpError) Error() string {
	if e.Index < 0 {
		return fmt.Sprintf("%s: %s", e.Field, e.Reason)
	}
	return fmt.Sprintf("ops[%d].%s: %s", e.Index, e.Field, e.Reason)
}

// ParseOps decodes and validates the ops array of a delta: 1 to [MaxOps]
// ops, each a known kind with a valid, non-root JSON Pointer and the operand
// its kind requires. Errors are *[OpError].
func ParseOps(raw json.RawMessage) ([]Op, error) {
	return parseOps(raw, false)
}

// ParseValidOps is [ParseOps] for text that a JSON validator at least as
// strict as encoding/json's has already accepted, such as a record value
// event's scanner has read: it does not check the JSON again.
func ParseValidOps(raw json.RawMessage) ([]Op, error) {
	return parseOps(raw, true)
}

func parseOps(raw json.RawMessage, valid bool) ([]Op, error) {
	if valid {
		raw = TrimJSONSpace(raw)
	} else {
		raw = bytes.TrimSpace(raw)
	}
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, &OpError{Index: -1, Field: "ops", Reason: "required for a delta"}
	}
	if raw[0] != '[' {
		return nil, &OpError{Index: -1, Field: "ops", Reason: "must be an array"}
	}
	if !valid && !json.Valid(raw) {
		return nil, &OpError{Index: -1, Field: "ops", Reason: "must be an array of op objects"}
	}
	// Parsed in one pass into a small array on the stack, then copied to
	// one of the exact size: a growing slice allocated up to three times
	// more per delta, and counting first walked the ops twice.
	var (
		local [4]Op
		grown []Op // past len(local) ops, on the heap
		k     int
		n     int
		err   error
	)
	elements(raw, func(w []byte) bool {
		n++
		if err != nil || n > MaxOps {
			return true // only counting, to say how many
		}
		var op Op
		if op, err = parseOp(k, w); err != nil {
			return true
		}
		switch {
		case k < len(local):
			local[k] = op
		case grown == nil:
			grown = append(make([]Op, 0, 2*len(local)), local[:]...)
			fallthrough
		default:
			grown = append(grown, op)
		}
		k++
		return true
	})
	if err := CheckOpCount(n); err != nil {
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	if grown != nil {
		return grown, nil
	}
	ops := make([]Op, k)
	copy(ops, local[:k])
	return ops, nil
}

func parseOp(i int, raw json.RawMessage) (Op, error) {
	raw = TrimJSONSpace(raw) // an element of a validated array
	if len(raw) == 0 || raw[0] != '{' {
		return Op{}, &OpError{Index: i, Field: "op", Reason: "each op must be a JSON object"}
	}
	// Members by exact name: encoding/json's struct decoding matches
	// names regardless of case, which would let an unknown member such as
	// "PATH" override "path". A repeated name is refused, at any depth:
	// readers disagree on which value counts.
	var (
		w    OpMembers
		seen nameSet
		err  error
	)
	rawMembers(raw, func(key, v []byte) {
		if err != nil {
			return
		}
		name := memberName(key)
		if seen.add(name) {
			err = &OpError{Index: i, Field: opField(name), Reason: RepeatedName(name)}
			return
		}
		if inner, ok := repeatedName(v); ok {
			err = &OpError{Index: i, Field: opField(name), Reason: RepeatedName(inner)}
			return
		}
		w.set(key, v)
	})
	if err != nil {
		return Op{}, err
	}
	return parseOpMembers(i, w)
}

// opField is the field of an [OpError] about the op member name: the
// member itself if the format knows it, else the op.
func opField(name string) string {
	switch name {
	case "path", "value", "by":
		return name
	}
	return "op"
}

// RepeatedName is why a JSON object that repeats the member name is
// refused: I-JSON (RFC 7493) forbids it, because readers disagree on
// which value counts (encoding/json and PostgreSQL's jsonb keep the last,
// others the first), so a record with one would not mean one thing.
func RepeatedName(name string) string {
	return fmt.Sprintf("repeats the member name %q (I-JSON, RFC 7493, forbids repeated names: readers disagree on which value counts)", clip([]byte(name)))
}

// OpMembers are the raw values of the members of an op object the format
// names, nil when absent, for a reader that has walked the op object
// already (see [OpMemberIndex]).
type OpMembers struct {
	Op, Path, Value, By []byte
}

// The members of an op object, as [OpMemberIndex] numbers them.
const (
	OpMemberOp = iota
	OpMemberPath
	OpMemberValue
	OpMemberBy
)

// OpMemberIndex numbers an op object's member by its name, given as a JSON
// string literal (quotes and escapes included): OpMemberOp to OpMemberBy,
// or -1 for a name the format does not know. Names are exact: "PATH" is
// not "path".
func OpMemberIndex(key []byte) int {
	// Compared without making a string of each name (a name with an
	// escape is unquoted first).
	if bytes.IndexByte(key, '\\') >= 0 {
		key = []byte(unquote(key))
	} else {
		key = key[1 : len(key)-1]
	}
	switch string(key) {
	case "op":
		return OpMemberOp
	case "path":
		return OpMemberPath
	case "value":
		return OpMemberValue
	case "by":
		return OpMemberBy
	}
	return -1
}

// set takes one member of an op object.
func (w *OpMembers) set(key, v []byte) {
	switch OpMemberIndex(key) {
	case OpMemberOp:
		w.Op = v
	case OpMemberPath:
		w.Path = v
	case OpMemberValue:
		w.Value = v
	case OpMemberBy:
		w.By = v
	}
}

// CheckOpCount refuses an ops array of n elements that is empty or holds
// more than [MaxOps], as [ParseOps] does (a *[OpError]); nil otherwise.
func CheckOpCount(n int) error {
	switch {
	case n == 0:
		return &OpError{Index: -1, Field: "ops", Reason: "must hold at least 1 op"}
	case n > MaxOps:
		return &OpError{Index: -1, Field: "ops", Reason: fmt.Sprintf("holds %d ops, at most %d allowed", n, MaxOps)}
	}
	return nil
}

// ParseOpMembers is [ParseValidOps] for a reader that has validated the
// ops array and collected each element's members already (every element
// an object): it gives the same ops, and the same error, without walking
// the array again.
func ParseOpMembers(elems []OpMembers) ([]Op, error) {
	if err := CheckOpCount(len(elems)); err != nil {
		return nil, err
	}
	ops := make([]Op, len(elems))
	for i, w := range elems {
		op, err := parseOpMembers(i, w)
		if err != nil {
			return nil, err
		}
		ops[i] = op
	}
	return ops, nil
}

func parseOpMembers(i int, w OpMembers) (Op, error) {
	kind, ok, err := opKind(w.Op)
	if err != nil {
		return Op{}, &OpError{Index: i, Field: "op", Reason: "must be the string set, remove or increment"}
	}
	if !ok {
		return Op{}, &OpError{Index: i, Field: "op", Reason: "required (set, remove or increment)"}
	}
	var op Op
	if p, ok := internedPathOf(w.Path); ok {
		op = Op{Kind: Kind(kind), Path: p.path, Tokens: p.tokens}
	} else {
		path, ok, err := stringMember(w.Path)
		if err != nil {
			return Op{}, &OpError{Index: i, Field: "path", Reason: "must be a JSON Pointer string"}
		}
		if !ok {
			return Op{}, &OpError{Index: i, Field: "path", Reason: "required"}
		}
		tokens, err := ParsePointer(path)
		if err != nil {
			return Op{}, &OpError{Index: i, Field: "path", Reason: err.Error()}
		}
		internPath(w.Path, path, tokens)
		op = Op{Kind: Kind(kind), Path: path, Tokens: tokens}
	}
	switch op.Kind {
	case Set:
		value := TrimJSONSpace(w.Value)
		if len(value) == 0 {
			return Op{}, &OpError{Index: i, Field: "value", Reason: "required for set (use null to store null)"}
		}
		op.Value = value
	case Remove:
	case Increment:
		by := TrimJSONSpace(w.By)
		if len(by) == 0 {
			return Op{}, &OpError{Index: i, Field: "by", Reason: "required for increment"}
		}
		if !isJSONNumber(by) {
			return Op{}, &OpError{Index: i, Field: "by", Reason: fmt.Sprintf("must be a number, got %s", clip(by))}
		}
		op.By = json.Number(amountOf(by))
	default:
		return Op{}, &OpError{Index: i, Field: "op", Reason: fmt.Sprintf("unknown op %q (want set, remove or increment)", clip([]byte(kind)))}
	}
	return op, nil
}

// ParsePointer splits an RFC 6901 JSON Pointer into unescaped reference
// tokens. The root pointer "" is refused: an op replaces members of the
// state, never the state object itself.
func ParsePointer(p string) ([]string, error) {
	if p == "" {
		return nil, fmt.Errorf("the root pointer \"\" is not allowed; ops address members of the state")
	}
	if p[0] != '/' {
		return nil, fmt.Errorf("%q is not a JSON Pointer: it must start with \"/\"", p)
	}
	if strings.IndexByte(p[1:], '/') < 0 && strings.IndexByte(p, '~') < 0 {
		// One member name with no escape, the most common path.
		return []string{p[1:]}, nil
	}
	parts := strings.Split(p[1:], "/")
	if len(parts) > MaxPathDepth {
		return nil, fmt.Errorf("the path is %d levels deep, at most %d allowed", len(parts), MaxPathDepth)
	}
	for i, part := range parts {
		for j := 0; j < len(part); j++ {
			if part[j] == '~' && (j+1 >= len(part) || (part[j+1] != '0' && part[j+1] != '1')) {
				return nil, fmt.Errorf("%q has a bad escape: \"~\" must be followed by 0 or 1", p)
			}
		}
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
	}
	return parts, nil
}

// opKind reads the op member: the three kinds as producers write them
// without a new string each, anything else as [stringMember] does.
func opKind(raw []byte) (string, bool, error) {
	switch string(raw) {
	case `"set"`:
		return string(Set), true, nil
	case `"remove"`:
		return string(Remove), true, nil
	case `"increment"`:
		return string(Increment), true, nil
	}
	return stringMember(raw)
}

// stringMember reads a member of an op object as a string; ok is false
// when the member is absent or null.
func stringMember(raw []byte) (s string, ok bool, err error) {
	if raw == nil || bytes.Equal(TrimJSONSpace(raw), []byte("null")) {
		return "", false, nil
	}
	if s, ok := plainString(raw); ok {
		return s, true, nil
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false, err
	}
	return s, true, nil
}

// isJSONNumber reports whether b is exactly one JSON number (RFC 8259:
// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?), what encoding/json
// accepts into a json.Number, checked without a decoder: it runs for
// every increment.
func isJSONNumber(b []byte) bool {
	i := 0
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case digits() == 0:
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(b)
}

func clip(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "..."
	}
	return string(b)
}

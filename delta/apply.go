package delta

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"strconv"
	"strings"
	"sync"
)

// ApplyError says which op of a delta could not be applied to a state and
// why. The op itself was well formed (see [ParseOps]); the state it met was
// not what it expected, for example an increment of a string.
type ApplyError struct {
	Index  int    // position of the op in the ops applied
	Path   string // the op's JSON Pointer
	Reason string
}

func (e *ApplyError) Error() string {
	return fmt.Sprintf("ops[%d] at %q: %s", e.Index, e.Path, e.Reason)
}

// DecodeState decodes a job state. Numbers are kept as [json.Number] so an
// integer never passes through float64 on its way to an increment. An empty
// raw state is the empty state {} of version 0.
func DecodeState(raw json.RawMessage) (map[string]any, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return map[string]any{}, nil
	}
	v, err := decodeValue(raw)
	if err != nil {
		return nil, fmt.Errorf("delta: decode state: %w", err)
	}
	state, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("delta: decode state: must be a JSON object, got %s", typeName(v))
	}
	return state, nil
}

// DecodeValidState is [DecodeState] for text already known to be valid
// JSON, as the event decoder, [EncodeState] and PostgreSQL's jsonb output
// make it: it skips the validation pass, which was a third of decoding a
// state (and a thirtieth of a rebuild's CPU). Text that is not valid JSON
// decodes to some value or an error, never a panic, and is not checked
// further: it is the caller's promise.
func DecodeValidState(raw json.RawMessage) (map[string]any, error) {
	raw = TrimJSONSpace(raw)
	if len(raw) == 0 {
		return map[string]any{}, nil
	}
	if raw[0] != '{' {
		return DecodeState(raw)
	}
	return decodeValid(raw).(map[string]any), nil
}

// EncodeState encodes a job state as compact JSON. HTML characters are not
// escaped: the state is data for a jsonb column, not for a web page. A nil
// state encodes as {}, never null, because a job's state is always an object.
func EncodeState(state map[string]any) (json.RawMessage, error) {
	if state == nil {
		return json.RawMessage("{}"), nil
	}
	if out, ok := appendValue(make([]byte, 0, 256), state); ok {
		if cap(out) > 256 && cap(out)-len(out) > 64 {
			// Grown by doubling: a state kept while its batch is
			// written should not hold twice its size.
			out = append(make([]byte, 0, len(out)), out...)
		}
		return out, nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(state); err != nil {
		return nil, fmt.Errorf("delta: encode state: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// ApplyJSON is [Apply] on encoded states, as they sit in the read model.
func ApplyJSON(state json.RawMessage, ops []Op) (json.RawMessage, error) {
	s, err := DecodeState(state)
	if err != nil {
		return nil, err
	}
	next, err := Apply(s, ops)
	if err != nil {
		return nil, err
	}
	return EncodeState(next)
}

// Fold joins the ops of consecutive deltas into one run. Folding needs no
// cleverness: applying delta a then delta b is, by definition, applying a's
// ops and then b's, so Apply(Apply(s, a), b) equals Apply(s, Fold(a, b)).
// Ops are never merged (two increments are not summed in advance), so an
// error still points at the op that caused it, counted across all runs.
// The result shares no backing array with the runs.
func Fold(runs ...[]Op) []Op {
	n := 0
	for _, r := range runs {
		n += len(r)
	}
	out := make([]Op, 0, n)
	for _, r := range runs {
		out = append(out, r...)
	}
	return out
}

// Apply runs ops in order on a copy of state and returns the copy. The
// input is never modified, so a failed or abandoned batch leaves the
// caller's state intact. Either every op applies or the result is an error
// (a *[ApplyError] for a state the ops do not fit) and no state.
func Apply(state map[string]any, ops []Op) (map[string]any, error) {
	out, _ := deepCopy(state).(map[string]any)
	if out == nil {
		out = map[string]any{}
	}
	for i := range ops {
		if err := applyOp(out, &ops[i]); err != nil {
			err.Index = i
			return nil, err
		}
	}
	return out, nil
}

// Patch runs ops in order on state itself, for a caller that owns state
// and would otherwise throw away the copy [Apply] makes. Either every op
// applies, or the result is an error (a *[ApplyError]) and state is as it
// was: what the ops before the failing one changed is undone. The values
// ops set share nothing with the ops.
func Patch(state map[string]any, ops []Op) error {
	undo := undoLogs.Get().(*undoLog)
	defer func() {
		if cap(*undo) > maxPooledUndo {
			return // a delta of many ops: its log is left to the collector
		}
		clear(*undo) // no state kept alive from the pool
		*undo = (*undo)[:0]
		undoLogs.Put(undo)
	}()
	for i := range ops {
		if err := patchOp(state, &ops[i], undo); err != nil {
			undo.rollback()
			err.Index = i
			return err
		}
	}
	return nil
}

// maxPooledUndo is the largest undo log kept for reuse, in entries.
const maxPooledUndo = 64

// undoLogs are Patch's undo logs, reused: a new one for every delta was
// one allocation per record folded.
var undoLogs = sync.Pool{New: func() any {
	u := make(undoLog, 0, 4) // most deltas change a few members
	return &u
}}

// undoLog records, for each member an op changed, what it was before, so
// that a failed [Patch] can put it back, newest first.
type undoLog []undoEntry

type undoEntry struct {
	obj     map[string]any
	name    string
	old     any
	existed bool
}

func (u *undoLog) record(obj map[string]any, name string) {
	old, existed := obj[name]
	*u = append(*u, undoEntry{obj: obj, name: name, old: old, existed: existed})
}

func (u undoLog) rollback() {
	for i := len(u) - 1; i >= 0; i-- {
		e := u[i]
		if e.existed {
			e.obj[e.name] = e.old
		} else {
			delete(e.obj, e.name)
		}
	}
}

func applyOp(state map[string]any, op *Op) *ApplyError {
	return patchOp(state, op, nil)
}

// patchOp applies one op to state, recording in undo (when not nil) each
// member it changes before changing it.
func patchOp(state map[string]any, op *Op, undo *undoLog) *ApplyError {
	fail := func(format string, args ...any) *ApplyError {
		return &ApplyError{Path: op.Path, Reason: fmt.Sprintf(format, args...)}
	}
	tokens := op.Tokens
	if len(tokens) == 0 {
		// An Op built by hand rather than by ParseOps may carry only a Path.
		var err error
		if tokens, err = ParsePointer(op.Path); err != nil {
			return fail("%v", err)
		}
	}
	create := op.Kind != Remove
	parent, err := walk(state, tokens[:len(tokens)-1], create, undo)
	if err != nil {
		return fail("%v", err)
	}
	name := tokens[len(tokens)-1]
	switch op.Kind {
	case Set:
		v, err := decodeValue(op.Value)
		if err != nil {
			return fail("value: %v", err)
		}
		if undo != nil {
			undo.record(parent, name)
		}
		parent[name] = v
	case Remove:
		if parent != nil {
			if undo != nil {
				undo.record(parent, name)
			}
			delete(parent, name)
		}
	case Increment:
		cur := "0"
		if v, ok := parent[name]; ok {
			if cur, ok = numberLiteral(v); !ok {
				return fail("increment: the member is not a number (it is %s)", typeName(v))
			}
		}
		sum, err := add(cur, string(op.By))
		if err != nil {
			return fail("increment: %v", err)
		}
		if undo != nil {
			undo.record(parent, name)
		}
		parent[name] = sum
	default:
		return fail("unknown op %q (want set, remove or increment)", op.Kind)
	}
	return nil
}

// walk follows tokens from state down to the object that holds the op's
// member. Missing objects are created when create is set; otherwise a
// missing one yields nil, which makes a remove a no-op. A member in the way
// that is not an object is an error: overwriting it would lose data the
// producer did not ask to lose. Arrays count as "not an object" because the
// contract addresses object members only.
// Objects it creates are recorded in undo, when not nil.
func walk(state map[string]any, tokens []string, create bool, undo *undoLog) (map[string]any, error) {
	cur := state
	for i, tok := range tokens {
		next, ok := cur[tok]
		if !ok {
			if !create {
				return nil, nil
			}
			if undo != nil {
				undo.record(cur, tok)
			}
			m := map[string]any{}
			cur[tok] = m
			cur = m
			continue
		}
		m, ok := next.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("parent %q is not an object (it is %s)", pointer(tokens[:i+1]), typeName(next))
		}
		cur = m
	}
	return cur, nil
}

// add adds two JSON number literals. Two integers are added exactly, at any
// size, because a counter that drifts past 2^53 is silently wrong forever;
// anything else is added as float64, the precision JSON promises readers.
// An integral value written with a fraction or an exponent (5.0, 1e20)
// counts as an integer: PostgreSQL stores 1e20 as 100000000000000000000,
// and the sum must not depend on which of the two spellings a row had.
func add(a, b string) (json.Number, error) {
	if (!isIntegerLiteral(a) || !isIntegerLiteral(b)) && smallExponent(a) && smallExponent(b) {
		x, okX := new(big.Rat).SetString(a)
		y, okY := new(big.Rat).SetString(b)
		if okX && okY && x.IsInt() && y.IsInt() {
			return json.Number(new(big.Int).Add(x.Num(), y.Num()).String()), nil
		}
	}
	if isIntegerLiteral(a) && isIntegerLiteral(b) {
		x, errX := strconv.ParseInt(a, 10, 64)
		y, errY := strconv.ParseInt(b, 10, 64)
		if errX == nil && errY == nil {
			if s := x + y; (s > x) == (y > 0) {
				return json.Number(strconv.FormatInt(s, 10)), nil
			}
		}
		bx, okX := new(big.Int).SetString(a, 10)
		by, okY := new(big.Int).SetString(b, 10)
		if !okX || !okY {
			return "", fmt.Errorf("%q or %q is not an integer", a, b)
		}
		return json.Number(bx.Add(bx, by).String()), nil
	}
	x, err := parseFloat(a)
	if err != nil {
		return "", err
	}
	y, err := parseFloat(b)
	if err != nil {
		return "", err
	}
	s := x + y
	if math.IsInf(s, 0) || math.IsNaN(s) {
		return "", fmt.Errorf("%s + %s is beyond the range of a float64", a, b)
	}
	return json.Number(strconv.FormatFloat(s, 'g', -1, 64)), nil
}

// maxExactExponent bounds the exponents added exactly: PostgreSQL's numeric
// holds 131072 digits before the point, and a literal such as 1e999999999
// must not cost the time and memory of a billion digits.
const maxExactExponent = 140000

// smallExponent reports whether a number literal's exponent is within
// maxExactExponent.
func smallExponent(s string) bool {
	i := strings.IndexAny(s, "eE")
	if i < 0 {
		return true
	}
	e, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
	return err == nil && e >= -maxExactExponent && e <= maxExactExponent
}

func parseFloat(s string) (float64, error) {
	f, err := strconv.ParseFloat(s, 64)
	// A range error still yields the nearest float (±Inf or 0); the sum is
	// checked for a finite result instead.
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	return f, nil
}

// isIntegerLiteral reports whether a JSON number literal has no fraction or
// exponent. 1.0 and 1e2 are not integers here: the producer chose a float.
func isIntegerLiteral(s string) bool {
	return s != "" && !strings.ContainsAny(s, ".eE")
}

// numberLiteral returns the literal of a number in a state. States from
// [DecodeState] hold json.Number; the other types appear only in states
// built in code.
func numberLiteral(v any) (string, bool) {
	switch n := v.(type) {
	case json.Number:
		return string(n), true
	case float64:
		if math.IsInf(n, 0) || math.IsNaN(n) {
			return "", false
		}
		return strconv.FormatFloat(n, 'g', -1, 64), true
	case int:
		return strconv.Itoa(n), true
	case int64:
		return strconv.FormatInt(n, 10), true
	}
	return "", false
}

func decodeValue(raw []byte) (any, error) {
	// Scalars, the common case, without a decoder.
	switch t := bytes.TrimSpace(raw); {
	case len(t) == 0:
	case t[0] == '"':
		if s, ok := plainString(t); ok {
			return s, nil
		}
	case string(t) == "true":
		return true, nil
	case string(t) == "false":
		return false, nil
	case string(t) == "null":
		return nil, nil
	case (t[0] == '-' || (t[0] >= '0' && t[0] <= '9')) && isJSONNumber(t):
		return json.Number(t), nil
	case (t[0] == '{' || t[0] == '[') && json.Valid(t):
		return decodeValid(t), nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("unexpected data after the JSON value")
	}
	return v, nil
}

func deepCopy(v any) any {
	switch t := v.(type) {
	case map[string]any:
		if t == nil {
			return t
		}
		m := make(map[string]any, len(t))
		for k, e := range t {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		if t == nil {
			return t
		}
		s := make([]any, len(t))
		for i, e := range t {
			s[i] = deepCopy(e)
		}
		return s
	}
	return v
}

// pointer escapes tokens back into a JSON Pointer, for error messages.
func pointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1"))
	}
	return b.String()
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number, float64, int, int64:
		return "a number"
	}
	return fmt.Sprintf("a %T", v)
}

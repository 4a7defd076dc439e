package event

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/bits"
	"unicode"
	"unicode/utf8"
	"unsafe"

	"github.com/projector/projector/delta"
)

// maxDepth bounds nesting: deeper values are bad input rather than a risk
// to the decoder's or PostgreSQL's stack.
const maxDepth = 1000

// members are the raw values of the top-level members the wire format
// names. A name is never repeated: the scanner refuses that.
type members struct {
	jobID, version, kind, state, ops, eventID, occurredAt []byte
	// plain marks, by plainJobID and its siblings, the members whose value
	// the scanner saw with no escape in it (a value of any type: text
	// takes only a string). A string's text is then the bytes between the
	// quotes, as they lie in the record, which the scanner has checked
	// are valid UTF-8, so it is taken without a decoder or a second
	// check. A member not marked is decoded (stringOf).
	plain uint8
	// opsObjects reports that every element of the ops array is an
	// object; opsElems (opsLocal[:opsN]
	// while it fits) then holds where each one's members lie in the value,
	// so the ops are parsed without walking them again.
	opsObjects bool
	opsStart   int
	opsN       int
	opsLocal   [4]opSpans
	opsMore    []opSpans
	// opsCount is how many elements the ops array has; past
	// delta.MaxOps, only they are counted, not noted: a 1 MiB record of
	// empty objects would otherwise note 350,000 of them.
	opsCount int
}

// The bits of members.plain.
const (
	plainJobID uint8 = 1 << iota
	plainEventID
	plainOccurredAt
)

// opSpans is where the values of an op object's members lie in the record
// value, by [delta.OpMemberIndex]: start and end, both 0 when absent.
type opSpans [4][2]int32

// opsElems returns the spans of the ops array's elements.
func (m *members) opsElems() []opSpans {
	if m.opsMore != nil {
		return m.opsMore
	}
	return m.opsLocal[:m.opsN]
}

// scanError is malformed JSON, or JSON that PostgreSQL would refuse, or
// an object that repeats a member name.
type scanError struct {
	malformed bool
	// repeated is set when an object repeats a member name.
	repeated bool
	// field is the top-level member the problem is in, when known.
	field string
	msg   string
}

// scanner validates a record value in one pass and picks out the known
// top-level members. It is stricter than JSON in what PostgreSQL needs:
// text must be valid UTF-8, with no \u0000 and no unpaired surrogate
// escape, and numbers must fit PostgreSQL's numeric type. And it is
// I-JSON (RFC 7493) in that no object, at any depth, may repeat a member
// name: readers disagree on which of two values counts (encoding/json and
// PostgreSQL's jsonb keep the last, others the first), so a record with
// one would mean different things to different readers of the topic.
type scanner struct {
	b   []byte
	i   int
	key []byte // the raw key of the top-level member being scanned
	err *scanError
	// escaped is set by a string with an escape; [scanner.name] clears it
	// before each member name, and scanObject before each top-level value.
	escaped bool
}

func scanObject(b []byte) (members, *scanError) {
	s := scanner{b: b}
	var m members
	s.ws()
	if s.i >= len(b) || b[s.i] != '{' {
		return m, &scanError{malformed: true, msg: "not a JSON object"}
	}
	s.i++
	s.ws()
	if s.peek() == '}' {
		s.i++
	} else {
		var seen names
		for s.err == nil {
			s.ws()
			kstart := s.i
			if !s.name(&seen) {
				break
			}
			key, keyEscaped := b[kstart:s.i], s.escaped
			s.ws()
			if !s.expect(':') {
				break
			}
			s.ws()
			vstart := s.i
			s.key = key
			s.escaped = false
			if s.peek() == '[' && memberNameOf(key, keyEscaped) == "ops" {
				if !s.opsArray(&m) {
					break
				}
			} else if !s.value(1) {
				break
			}
			s.key = nil
			m.set(key, keyEscaped, b[vstart:s.i], s.escaped)
			s.ws()
			if s.peek() == ',' {
				s.i++
				continue
			}
			s.expect('}')
			break
		}
	}
	if s.err == nil {
		s.ws()
		if s.i < len(b) {
			s.fail("invalid character %s after the top-level object%s", charAt(b, s.i), notJSONSpace(b, s.i))
		}
	}
	return m, s.err
}

// field names the top-level member being scanned, for an error.
func (s *scanner) field() string {
	if s.key == nil {
		return ""
	}
	return unquote(s.key)
}

// unquote returns a scanned string's text.
func unquote(raw []byte) string {
	for _, c := range raw {
		if c == '\\' {
			var key string
			_ = json.Unmarshal(raw, &key)
			return key
		}
	}
	return string(raw[1 : len(raw)-1])
}

// memberName is a member name's text, without allocating for a name
// with no escape (the result is only compared).
func memberName(rawKey []byte) string {
	return memberNameOf(rawKey, bytes.IndexByte(rawKey, '\\') >= 0)
}

// memberNameOf is [memberName] for a name known to have an escape or
// not, as the scanner saw it.
func memberNameOf(rawKey []byte, escaped bool) string {
	if escaped {
		return unquote(rawKey)
	}
	return unsafe.String(unsafe.SliceData(rawKey[1:]), len(rawKey)-2)
}

// opsArray scans the ops member's array as value(1) does, and records
// where the members of each element lie when every element is an object.
func (s *scanner) opsArray(m *members) bool {
	m.opsObjects, m.opsN, m.opsMore, m.opsStart, m.opsCount = true, 0, nil, s.i, 0
	s.i++ // '['
	s.ws()
	if s.peek() == ']' {
		s.i++
		return true
	}
	for {
		s.ws()
		if s.peek() == '{' {
			if !s.opObject(m) {
				return false
			}
		} else {
			m.opsObjects = false
			if !s.value(2) {
				return false
			}
		}
		s.ws()
		if s.peek() == ',' {
			s.i++
			continue
		}
		return s.expect(']')
	}
}

// opObject scans one op object as value(2) does, noting its members.
func (s *scanner) opObject(m *members) bool {
	var sp opSpans
	s.i++ // '{'
	s.ws()
	if s.peek() == '}' {
		s.i++
		m.addOp(sp)
		return true
	}
	var seen names
	for {
		s.ws()
		kstart := s.i
		if !s.name(&seen) {
			return false
		}
		key := s.b[kstart:s.i]
		s.ws()
		if !s.expect(':') {
			return false
		}
		s.ws()
		vstart := s.i
		if !s.value(3) {
			return false
		}
		if k := delta.OpMemberIndex(key); k >= 0 {
			sp[k] = [2]int32{int32(vstart), int32(s.i)}
		}
		s.ws()
		if s.peek() == ',' {
			s.i++
			continue
		}
		if !s.expect('}') {
			return false
		}
		m.addOp(sp)
		return true
	}
}

func (m *members) addOp(sp opSpans) {
	m.opsCount++
	switch {
	case m.opsCount > delta.MaxOps:
		// Refused for its length: nothing more to note.
	case m.opsMore != nil:
		m.opsMore = append(m.opsMore, sp)
	case m.opsN < len(m.opsLocal):
		m.opsLocal[m.opsN] = sp
		m.opsN++
	default:
		m.opsMore = append(append(make([]opSpans, 0, 2*len(m.opsLocal)), m.opsLocal[:]...), sp)
	}
}

// set notes the value v of the member named by rawKey; keyEscaped
// reports that the name has an escape, escaped that a string in v has.
func (m *members) set(rawKey []byte, keyEscaped bool, v []byte, escaped bool) {
	// memberNameOf does not allocate for a name with no escape: this runs
	// for every member of every record.
	switch memberNameOf(rawKey, keyEscaped) {
	case "job_id":
		m.jobID = v
		m.markPlain(plainJobID, escaped)
	case "version":
		m.version = v
	case "kind":
		m.kind = v
	case "state":
		m.state = v
	case "ops":
		m.ops = v
	case "event_id":
		m.eventID = v
		m.markPlain(plainEventID, escaped)
	case "occurred_at":
		m.occurredAt = v
		m.markPlain(plainOccurredAt, escaped)
	}
}

// markPlain sets bit of m.plain when the member's value had no escape
// (a value that is not a string is told apart by text).
func (m *members) markPlain(bit uint8, escaped bool) {
	if escaped {
		m.plain &^= bit
	} else {
		m.plain |= bit
	}
}

// text returns the text of the member v, a string the scanner accepted,
// as it lies in the record when it has no escape (bit of m.plain). ok is
// false for a string with an escape, one not marked, or a value that is
// not a string.
func (m *members) text(v []byte, bit uint8) (body []byte, ok bool) {
	if m.plain&bit == 0 || len(v) < 2 || v[0] != '"' {
		return nil, false
	}
	return v[1 : len(v)-1], true
}

// charAt names the character at b[i] for an error: quoted when it is
// ASCII, as U+XXXX (quoted too when printable) when it is a UTF-8
// character, as a byte when it is not UTF-8. Printing the byte alone
// would name a character the record does not hold (0xC2 of U+00A0 is
// 'Â').
func charAt(b []byte, i int) string {
	if b[i] < utf8.RuneSelf {
		return fmt.Sprintf("%q", b[i])
	}
	r, n := utf8.DecodeRune(b[i:])
	switch {
	case r == utf8.RuneError && n <= 1:
		return fmt.Sprintf("byte 0x%02X (not UTF-8)", b[i])
	case unicode.IsPrint(r):
		return fmt.Sprintf("%q (U+%04X)", r, r)
	}
	return fmt.Sprintf("U+%04X", r)
}

// notJSONSpace explains a character at b[i] that is white space to
// other readers but not to JSON, for an error; "" for any other.
func notJSONSpace(b []byte, i int) string {
	r, _ := utf8.DecodeRune(b[i:])
	if (unicode.IsSpace(r) || r == '\uFEFF') && r != ' ' && r != '\t' && r != '\n' && r != '\r' {
		return " (only space, tab, line feed and carriage return may surround the object)"
	}
	return ""
}

func (s *scanner) fail(format string, args ...any) {
	if s.err == nil {
		s.err = &scanError{malformed: true, msg: fmt.Sprintf(format, args...) + fmt.Sprintf(" at offset %d", s.i)}
	}
}

func (s *scanner) refuse(msg string) {
	if s.err == nil {
		s.err = &scanError{field: s.field(), msg: msg}
	}
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) ws() {
	// Compact JSON, the usual record, has none: one comparison, inlined.
	if s.i < len(s.b) && s.b[s.i] > ' ' {
		return
	}
	s.skipSpace()
}

func (s *scanner) skipSpace() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) expect(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return s.unexpected(c)
}

// unexpected fails the scan where [scanner.expect] wanted c.
func (s *scanner) unexpected(c byte) bool {
	if s.i >= len(s.b) {
		s.fail("unexpected end of JSON input, want %q", c)
	} else {
		s.fail("invalid character %s, want %q", charAt(s.b, s.i), c)
	}
	return false
}

func (s *scanner) value(depth int) bool {
	if depth > maxDepth {
		s.refuse(fmt.Sprintf("nested deeper than %d levels", maxDepth))
		return false
	}
	switch c := s.peek(); {
	case c == '{':
		return s.object(depth)
	case c == '[':
		s.i++
		s.ws()
		if s.peek() == ']' {
			s.i++
			return true
		}
		for {
			s.ws()
			if !s.value(depth + 1) {
				return false
			}
			s.ws()
			if s.peek() == ',' {
				s.i++
				continue
			}
			return s.expect(']')
		}
	case c == '"':
		return s.str()
	case c == '-' || (c >= '0' && c <= '9'):
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case s.i >= len(s.b):
		s.fail("unexpected end of JSON input")
	default:
		s.fail("invalid character %s looking for a value", charAt(s.b, s.i))
	}
	return false
}

// object scans an object, as value does.
func (s *scanner) object(depth int) bool {
	s.i++ // '{'
	s.ws()
	if s.peek() == '}' {
		s.i++
		return true
	}
	var seen names
	for {
		s.ws()
		if !s.name(&seen) {
			return false
		}
		s.ws()
		if !s.expect(':') {
			return false
		}
		s.ws()
		if !s.value(depth + 1) {
			return false
		}
		s.ws()
		if s.peek() == ',' {
			s.i++
			continue
		}
		return s.expect('}')
	}
}

// names are the member names of one object scanned so far. While there
// are at most len(fp), none with an escape, each is known by where it
// starts and a fingerprint (its length, first and last bytes), and only
// a name whose fingerprint matches is compared: two members of a record
// seldom share one. Past that, or once a name has an escape ("a" and
// "\u0061" are one name), they are compared unquoted, in a map.
type names struct {
	n    int
	fp   [16]uint64
	at   [16]int32
	more map[string]struct{}
}

// name scans a member name into seen, and refuses it if seen has it
// already.
func (s *scanner) name(seen *names) bool {
	kstart := s.i
	s.escaped = false
	if !s.str() {
		return false
	}
	n := seen.n
	if s.escaped || n >= len(seen.fp) {
		return s.nameInMap(seen, s.b[kstart:s.i])
	}
	// The name lies in s.b from kstart (its opening quote) to s.i.
	b, end := s.b, s.i
	fp := uint64(end-kstart)<<16 | uint64(b[kstart+1])<<8 | uint64(b[end-2])
	for i := range n {
		if seen.fp[i] == fp {
			at := int(seen.at[i])
			if string(b[at:at+end-kstart]) == string(b[kstart:end]) {
				return s.repeated(b[kstart:end])
			}
		}
	}
	seen.fp[n], seen.at[n] = fp, int32(kstart)
	seen.n = n + 1
	return true
}

// nameInMap is [scanner.name] with seen's names in a map, by their text.
func (s *scanner) nameInMap(seen *names, key []byte) bool {
	if seen.more == nil {
		seen.more = make(map[string]struct{}, 2*len(seen.fp))
		for i, f := range seen.fp[:seen.n] {
			at := int(seen.at[i])
			seen.more[memberName(s.b[at:at+int(f>>16)])] = struct{}{}
		}
		// From now on every name goes to the map.
		seen.n = len(seen.fp) + 1
	}
	name := memberName(key)
	if _, ok := seen.more[name]; ok {
		return s.repeated(key)
	}
	seen.more[name] = struct{}{}
	return true
}

// repeated refuses the member name key, which its object has already.
func (s *scanner) repeated(key []byte) bool {
	if s.err == nil {
		s.err = &scanError{repeated: true, field: s.field(), msg: delta.RepeatedName(unquote(key))}
	}
	return false
}

func (s *scanner) literal(lit string) bool {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		s.fail("invalid literal, want %s", lit)
		return false
	}
	s.i += len(lit)
	return true
}

// plainByte marks the bytes a string holds as they are: printable ASCII
// other than the quote and the backslash.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// specialBytes marks, by the high bit of its byte, each byte of w that is
// not plain (plainByte): a quote, a backslash, a control character or a
// byte of a multi-byte UTF-8 sequence. Bytes above the first one marked
// may be marked wrongly (a borrow carries upward), never the first one:
// its lowest mark is exact.
func specialBytes(w uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	zero := func(x uint64) uint64 { return (x - ones) &^ x & highs }
	return (zero(w^(ones*'"')) | zero(w^(ones*'\\')) | (w-ones*0x20)&^w | w) & highs
}

// str scans a string, checking escapes and UTF-8.
func (s *scanner) str() bool {
	if !s.expect('"') {
		return false
	}
	for s.i < len(s.b) {
		// Runs of plain bytes, most of every record, eight at a time and
		// then in a tight loop.
		b, i := s.b, s.i
		for i+8 <= len(b) {
			if m := specialBytes(binary.LittleEndian.Uint64(b[i:])); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		for i < len(b) && plainByte[b[i]] {
			i++
		}
		s.i = i
		if i >= len(b) {
			break
		}
		c := b[i]
		switch {
		case c == '"':
			s.i++
			return true
		case c == '\\':
			s.i++
			s.escaped = true
			switch s.peek() {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i++
			case 'u':
				r := s.hex4(s.i + 1)
				if r < 0 {
					s.fail("invalid \\u escape")
					return false
				}
				s.i += 5
				switch {
				case r == 0:
					s.refuse(`contains the escape \u0000, which PostgreSQL cannot store in text or jsonb`)
					return false
				case r >= 0xD800 && r <= 0xDBFF:
					if s.peek() == '\\' && s.i+1 < len(s.b) && s.b[s.i+1] == 'u' {
						if lo := s.hex4(s.i + 2); lo >= 0xDC00 && lo <= 0xDFFF {
							s.i += 6
							continue
						}
					}
					s.refuse("contains an unpaired UTF-16 surrogate escape, which PostgreSQL jsonb refuses")
					return false
				case r >= 0xDC00 && r <= 0xDFFF:
					s.refuse("contains an unpaired UTF-16 surrogate escape, which PostgreSQL jsonb refuses")
					return false
				}
			default:
				s.fail("invalid escape in string")
				return false
			}
		case c < 0x20:
			s.fail("invalid control character in string")
			return false
		case c < utf8.RuneSelf:
			s.i++
		default:
			r, n := utf8.DecodeRune(s.b[s.i:])
			if r == utf8.RuneError && n <= 1 {
				s.refuse("contains bytes that are not valid UTF-8")
				return false
			}
			s.i += n
		}
	}
	s.fail("unexpected end of JSON input in a string")
	return false
}

func (s *scanner) hex4(at int) rune {
	if at+4 > len(s.b) {
		return -1
	}
	return hex4(s.b[at : at+4])
}

// PostgreSQL numeric limits: digits before the decimal point, and after.
const (
	maxNumericWeight = 131072
	maxNumericScale  = 16383
)

// number scans a JSON number and checks it fits PostgreSQL's numeric.
func (s *scanner) number() bool {
	b := s.b
	if b[s.i] == '-' {
		s.i++
	}
	intDigits, fracDigits := 0, 0
	switch {
	case s.peek() == '0':
		s.i++
		intDigits = 1
	case s.peek() >= '1' && s.peek() <= '9':
		for s.i < len(b) && b[s.i] >= '0' && b[s.i] <= '9' {
			s.i++
			intDigits++
		}
	default:
		s.fail("invalid number")
		return false
	}
	if s.peek() == '.' {
		s.i++
		for s.i < len(b) && b[s.i] >= '0' && b[s.i] <= '9' {
			s.i++
			fracDigits++
		}
		if fracDigits == 0 {
			s.fail("invalid number: no digits after the decimal point")
			return false
		}
	}
	exp := 0
	if c := s.peek(); c == 'e' || c == 'E' {
		s.i++
		neg := false
		if c := s.peek(); c == '+' || c == '-' {
			neg = c == '-'
			s.i++
		}
		digits := 0
		for s.i < len(b) && b[s.i] >= '0' && b[s.i] <= '9' {
			if exp < 10*maxNumericWeight {
				exp = exp*10 + int(b[s.i]-'0')
			}
			s.i++
			digits++
		}
		if digits == 0 {
			s.fail("invalid number: no digits in the exponent")
			return false
		}
		if neg {
			exp = -exp
		}
	}
	if intDigits+exp > maxNumericWeight || fracDigits-exp > maxNumericScale {
		s.refuse("contains a number beyond the range PostgreSQL can store")
		return false
	}
	return true
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return -1
		}
	}
	return r
}

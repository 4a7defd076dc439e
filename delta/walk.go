package delta

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
	"unsafe"
)

// The walkers below read JSON text that json.Valid has accepted; they pick
// members out by their exact names, which encoding/json's struct decoding
// would not (it matches names regardless of case), in one pass with no
// reflection.

// skip returns the index just past the value that starts at b[i] (after
// any whitespace), at most len(b) even for text that is not valid JSON.
func skip(b []byte, i int) int {
	return min(skipValue(b, i), len(b))
}

func skipValue(b []byte, i int) int {
	i = ws(b, i)
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		for i++; i < len(b); i++ {
			switch b[i] {
			case '\\':
				i++
			case '"':
				return i + 1
			}
		}
		return i
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			case '"':
				i = skip(b, i) - 1
			}
		}
		return i
	default:
		for ; i < len(b); i++ {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return i
			}
		}
		return i
	}
}

// TrimJSONSpace trims the whitespace JSON allows around a value, for text
// a JSON validator has accepted, where no other whitespace can be: cheaper
// than bytes.TrimSpace, which also looks for Unicode spaces.
func TrimJSONSpace(b []byte) []byte {
	for len(b) > 0 && isJSONSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isJSONSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func ws(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// elements calls fn with each element of a valid JSON array.
func elements(b []byte, fn func(v []byte) bool) {
	i := ws(b, 0) + 1 // past '['
	for {
		i = ws(b, i)
		if i >= len(b) || b[i] == ']' {
			return
		}
		end := skip(b, i)
		if end == i {
			return // not valid JSON: no element here
		}
		if !fn(b[i:end]) {
			return
		}
		i = ws(b, end)
		if i < len(b) && b[i] == ',' {
			i++
		}
	}
}

// rawMembers calls fn with each member of a valid JSON object, its name
// as its string literal, quotes and escapes included.
func rawMembers(b []byte, fn func(key, v []byte)) {
	i := ws(b, 0) + 1 // past '{'
	for {
		i = ws(b, i)
		if i >= len(b) || b[i] == '}' {
			return
		}
		kend := skip(b, i)
		key := b[i:kend]
		i = ws(b, kend) + 1 // past ':'
		if i > len(b) {
			return // not valid JSON: no value follows
		}
		i = ws(b, i)
		vend := skip(b, i)
		fn(key, b[i:vend])
		i = ws(b, vend)
		if i < len(b) && b[i] == ',' {
			i++
		}
	}
}

// unquote returns the text of a valid JSON string literal.
func unquote(raw []byte) string {
	if s, ok := plainString(raw); ok {
		return s
	}
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}

// memberName is the text of a valid JSON string literal, for a name
// that is only compared while raw is: one with nothing to unescape is
// read where it lies, without a copy.
func memberName(raw []byte) string {
	body := raw[1 : len(raw)-1]
	if bytes.IndexByte(body, '\\') >= 0 {
		return unquote(raw)
	}
	return unsafe.String(unsafe.SliceData(body), len(body))
}

// plainString returns the text of a string literal that needs no
// unescaping.
func plainString(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	body := raw[1 : len(raw)-1]
	for _, c := range body {
		if c == '\\' || c == '"' || c < 0x20 {
			return "", false
		}
	}
	if !utf8.Valid(body) {
		return "", false
	}
	return string(body), true
}

// nameSet holds member names of one object, to find a repeated one:
// compared one by one while they are few (an op object has four), in a
// map past that.
type nameSet struct {
	n     int
	local [16]string
	more  map[string]struct{}
}

// add adds name and reports whether it was there already.
func (n *nameSet) add(name string) bool {
	if n.more == nil {
		for _, s := range n.local[:n.n] {
			if s == name {
				return true
			}
		}
		if n.n < len(n.local) {
			n.local[n.n] = name
			n.n++
			return false
		}
		n.more = make(map[string]struct{}, 2*len(n.local))
		for _, s := range n.local {
			n.more[s] = struct{}{}
		}
	}
	if _, ok := n.more[name]; ok {
		return true
	}
	n.more[name] = struct{}{}
	return false
}

// repeatedName returns the first member name that an object repeats,
// at any depth of the valid JSON value v; the name may lie in v.
func repeatedName(v []byte) (string, bool) {
	v = TrimJSONSpace(v)
	if len(v) == 0 {
		return "", false
	}
	switch v[0] {
	case '{':
		var (
			seen  nameSet
			found string
			dup   bool
		)
		rawMembers(v, func(key, inner []byte) {
			if dup {
				return
			}
			if name := memberName(key); seen.add(name) {
				found, dup = name, true
			} else {
				found, dup = repeatedName(inner)
			}
		})
		return found, dup
	case '[':
		var found string
		var ok bool
		elements(v, func(e []byte) bool {
			found, ok = repeatedName(e)
			return !ok
		})
		return found, ok
	}
	return "", false
}

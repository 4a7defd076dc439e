package delta

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
)

// The state codec below decodes and encodes job states in one pass with no
// reflection, as encoding/json would with UseNumber and SetEscapeHTML(false):
// a delta's batch decodes the row it follows and encodes the row it makes,
// and encoding/json's decoder and encoder were a tenth of the deltas path's
// CPU. Anything unusual (text json.Valid refuses, a string that needs
// escaping, a value of a type a decoded state never holds) is left to
// encoding/json, so the two cannot disagree; a fuzz target holds them to it.

// decodeValid decodes a JSON value json.Valid has accepted. Members
// repeated in an object keep the last value, as encoding/json does.
func decodeValid(b []byte) any { return decodeValidAt(b, 0) }

// walkDepth bounds how deep decodeValid walks: each level skips over the
// whole of the value below it, so a walk costs the text's size times its
// depth. Below it encoding/json decodes the rest, in one pass. States are
// seldom more than a few levels deep (events at most 1,000).
const walkDepth = 1000

func decodeValidAt(b []byte, depth int) any {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil
	}
	if depth > walkDepth && (b[0] == '{' || b[0] == '[') {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		var v any
		_ = dec.Decode(&v) // valid text decodes; other text is the caller's promise broken
		return v
	}
	switch b[0] {
	case '{':
		m := map[string]any{}
		rawMembers(b, func(key, v []byte) { m[nameOf(key)] = decodeValidAt(v, depth+1) })
		return m
	case '[':
		s := []any{}
		elements(b, func(v []byte) bool { s = append(s, decodeValidAt(v, depth+1)); return true })
		return s
	case '"':
		return unquote(b)
	case 't':
		return true
	case 'f':
		return false
	case 'n':
		return nil
	}
	return numberOf(b)
}

// appendValue appends the compact encoding of v to buf. ok is false when
// v holds something only encoding/json should encode.
func appendValue(buf []byte, v any) ([]byte, bool) {
	switch t := v.(type) {
	case nil:
		return append(buf, "null"...), true
	case bool:
		if t {
			return append(buf, "true"...), true
		}
		return append(buf, "false"...), true
	case string:
		if !plainASCII(t) {
			return buf, false
		}
		buf = append(buf, '"')
		buf = append(buf, t...)
		return append(buf, '"'), true
	case json.Number:
		if !isJSONNumber([]byte(t)) {
			return buf, false
		}
		return append(buf, t...), true
	case []any:
		if t == nil {
			return append(buf, "null"...), true
		}
		buf = append(buf, '[')
		for i, e := range t {
			if i > 0 {
				buf = append(buf, ',')
			}
			var ok bool
			if buf, ok = appendValue(buf, e); !ok {
				return buf, false
			}
		}
		return append(buf, ']'), true
	case map[string]any:
		if t == nil {
			return append(buf, "null"...), true
		}
		keys := make([]string, 0, len(t))
		for k := range t {
			if !plainASCII(k) {
				return buf, false
			}
			keys = append(keys, k)
		}
		slices.Sort(keys)
		buf = append(buf, '{')
		for i, k := range keys {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, '"')
			buf = append(buf, k...)
			buf = append(buf, '"', ':')
			var ok bool
			if buf, ok = appendValue(buf, t[k]); !ok {
				return buf, false
			}
		}
		return append(buf, '}'), true
	}
	return buf, false
}

// plainASCII reports whether encoding/json writes s as it is between
// quotes: printable ASCII with no quote or backslash (HTML characters are
// not escaped here).
func plainASCII(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r > 0x7e || r == '"' || r == '\\' })
}

package jobgen

import (
	"bytes"
	"crypto/md5"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Ref is a job's final state in the lean reference: its version, and the
// first 8 bytes of the MD5 of its state as PostgreSQL prints it as jsonb
// text, so that a read model of millions of rows can be checked against
// 16 bytes a job instead of a copy of every state.
type Ref struct {
	Version uint32
	Deleted bool
	Hash    int64 // zero when Deleted
}

// JobID is the id of the generator's job number i.
func JobID(i int) string { return fmt.Sprintf("job-%05d", i) }

// StateHash is [Ref.Hash] of a state: what
// ('x' || left(md5(state::text), 16))::bit(64)::bigint gives for it in
// PostgreSQL.
func StateHash(state json.RawMessage) (int64, error) {
	dec := json.NewDecoder(bytes.NewReader(state))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return 0, fmt.Errorf("jobgen: state hash: %w", err)
	}
	text, err := appendJSONB(nil, v)
	if err != nil {
		return 0, err
	}
	sum := md5.Sum(text)
	return int64(binary.BigEndian.Uint64(sum[:8])), nil
}

// appendJSONB prints v as PostgreSQL prints a jsonb value: object keys
// sorted by length and then by their bytes, ": " and ", " between parts,
// and strings escaped as its escape_json does.
func appendJSONB(out []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return append(out, "null"...), nil
	case bool:
		return strconv.AppendBool(out, x), nil
	case json.Number:
		// The generator's numbers are integers, which numeric prints as
		// given; anything else would need numeric's own rules.
		if _, err := strconv.ParseInt(string(x), 10, 64); err != nil {
			return nil, fmt.Errorf("jobgen: state hash: number %s is not an integer", x)
		}
		return append(out, x...), nil
	case string:
		return appendJSONBString(out, x), nil
	case []any:
		out = append(out, '[')
		for i, e := range x {
			if i > 0 {
				out = append(out, ", "...)
			}
			var err error
			if out, err = appendJSONB(out, e); err != nil {
				return nil, err
			}
		}
		return append(out, ']'), nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b string) int {
			if len(a) != len(b) {
				return len(a) - len(b)
			}
			return bytes.Compare([]byte(a), []byte(b))
		})
		out = append(out, '{')
		for i, k := range keys {
			if i > 0 {
				out = append(out, ", "...)
			}
			out = appendJSONBString(out, k)
			out = append(out, ": "...)
			var err error
			if out, err = appendJSONB(out, x[k]); err != nil {
				return nil, err
			}
		}
		return append(out, '}'), nil
	}
	return nil, fmt.Errorf("jobgen: state hash: unexpected %T", v)
}

func appendJSONBString(out []byte, s string) []byte {
	out = append(out, '"')
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"':
			out = append(out, `\"`...)
		case c == '\\':
			out = append(out, `\\`...)
		case c == '\b':
			out = append(out, `\b`...)
		case c == '\f':
			out = append(out, `\f`...)
		case c == '\n':
			out = append(out, `\n`...)
		case c == '\r':
			out = append(out, `\r`...)
		case c == '\t':
			out = append(out, `\t`...)
		case c < 0x20:
			out = fmt.Appendf(out, `\u%04x`, c)
		default:
			_, n := utf8.DecodeRuneInString(s[i:])
			out = append(out, s[i:i+n]...)
			i += n
			continue
		}
		i++
	}
	return append(out, '"')
}

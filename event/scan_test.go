package event

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzScanAgreesWithEncodingJSON holds the one-pass scanner to
// encoding/json: whatever it accepts is a valid JSON object whose members
// it picked out as encoding/json reads them, and it never calls a valid
// JSON object malformed (it may refuse one PostgreSQL would refuse). Of
// repeated member names it agrees with a reference built on
// encoding/json's tokens: it accepts no valid object that repeats a name
// in any object, and it says a name is repeated only when one is.
func FuzzScanAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, ` {"job_id":"a","version":1} `, `{"a":[1,2,{"b":null}],"c":"\u00e9\ud83d\ude00"}`,
		`{"job_id":"a","job_id":"b"}`, `{"j\u006fb_id":"x"}`, `{"x":1e5,"y":-0.5E-3,"z":true,"w":false}`,
		`{"a":"\ud800"}`, `{"a":"\u0000"}`, `{"a":1e999999}`, `{"a":01}`, `{"a":1.}`, `{"a":}`, `{"a":1,}`,
		`{"a":{"b":1,"c":[{"b":2,"b":3}]}}`, `{"a":1,"\u0061":2}`, `{"a\/b":1,"a/b":2}`, `{"":{},"":1}`,
		`{"ops":[{"op":"set","op":"remove"}]}`, `{"a":[{"x":1},{"x":1}],"b":{"x":{"x":1}}}`,
		`[]`, `"x"`, `{"a":"` + "\xff" + `"}`, `{"a":"\x01"}`, `{"a":[` + string(bytes.Repeat([]byte("["), 1001)) + `}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, serr := scanObject(b)
		trimmed := bytes.TrimSpace(b)
		isObject := len(trimmed) > 0 && trimmed[0] == '{'
		valid := json.Valid(b) && isObject
		if valid {
			name, repeated := repeatedName(b)
			if repeated && serr == nil {
				t.Fatalf("scanner accepted %q, which repeats the member name %q", b, name)
			}
			if !repeated && serr != nil && serr.repeated {
				t.Fatalf("scanner says %q repeats a member name (%s); encoding/json's tokens repeat none", b, serr.msg)
			}
		}
		if serr == nil {
			if !valid {
				t.Fatalf("scanner accepted %q, which is not a valid JSON object", b)
			}
			var want map[string]json.RawMessage
			if err := json.Unmarshal(b, &want); err != nil {
				t.Fatalf("encoding/json cannot read what the scanner accepted: %v", err)
			}
			for name, got := range map[string][]byte{"job_id": m.jobID, "version": m.version, "kind": m.kind,
				"state": m.state, "ops": m.ops, "event_id": m.eventID, "occurred_at": m.occurredAt} {
				if w, ok := want[name]; ok != (got != nil) || (ok && !bytes.Equal(bytes.TrimSpace(w), got)) {
					t.Fatalf("member %s: scanner %q, encoding/json %q", name, got, w)
				}
			}
			return
		}
		if serr.malformed && valid {
			t.Fatalf("scanner called the valid JSON object %q malformed: %s", b, serr.msg)
		}
	})
}

// repeatedName is the reference the scanner's refusal of repeated names is
// held to: it walks encoding/json's tokens of a valid JSON value, each
// object's names unescaped, and returns the first name an object repeats.
func repeatedName(b []byte) (string, bool) {
	type frame struct {
		names map[string]bool // nil for an array
		key   bool            // the next token is a name
	}
	var stack []*frame
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].names != nil {
			stack[n-1].key = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		if n := len(stack); n > 0 && stack[n-1].key {
			if name, ok := tok.(string); ok {
				if stack[n-1].names[name] {
					return name, true
				}
				stack[n-1].names[name] = true
				stack[n-1].key = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{names: map[string]bool{}, key: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			valueDone()
		default:
			valueDone()
		}
	}
}

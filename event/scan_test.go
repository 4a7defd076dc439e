package event

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzScanAgreesWithEncodingJSON holds the one-pass scanner to
// encoding/json: whatever it accepts is a valid JSON object whose members
// it picked out as encoding/json reads them, and it never calls a valid
// JSON object malformed (it may refuse one PostgreSQL would refuse).
func FuzzScanAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, ` {"job_id":"a","version":1} `, `{"a":[1,2,{"b":null}],"c":"\u00e9\ud83d\ude00"}`,
		`{"job_id":"a","job_id":"b"}`, `{"j\u006fb_id":"x"}`, `{"x":1e5,"y":-0.5E-3,"z":true,"w":false}`,
		`{"a":"\ud800"}`, `{"a":"\u0000"}`, `{"a":1e999999}`, `{"a":01}`, `{"a":1.}`, `{"a":}`, `{"a":1,}`,
		`[]`, `"x"`, `{"a":"` + "\xff" + `"}`, `{"a":"\x01"}`, `{"a":[` + string(bytes.Repeat([]byte("["), 1001)) + `}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, serr := scanObject(b)
		trimmed := bytes.TrimSpace(b)
		isObject := len(trimmed) > 0 && trimmed[0] == '{'
		valid := json.Valid(b) && isObject
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

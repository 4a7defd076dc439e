package delta

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// FuzzWalkersAgreeWithEncodingJSON holds the one-pass walkers to
// encoding/json on every valid JSON array of values and object, and
// [DecodeValidState] to [DecodeState]; on text that is not valid JSON,
// DecodeValidState (which trusts its caller) must still not panic.
func FuzzWalkersAgreeWithEncodingJSON(f *testing.F) {
	for _, s := range []string{
		`[]`, `[1, "a", {"b": [1, {"c": "]"}]}, null]`, ` [ {"op":"set","path":"/a\"b","value":"x\\"} ] `,
		`{"op":"set","OP":"x","op":"remove"}`, `{"a\u0062":1,"\"":2}`, `{}`, `{"a":{"b":"}"},"c":[]}`,
		`{"a":"\`, `{"a"`, `{"a":{"b":"\"}`, `{"a":[1,{"b`, `{"a":"x\"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, gotErr := DecodeValidState(b)
		if !json.Valid(b) {
			return
		}
		want, wantErr := DecodeState(b)
		if (gotErr == nil) != (wantErr == nil) || !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: DecodeValidState %v, %v; DecodeState %v, %v", b, got, gotErr, want, wantErr)
		}
		switch t0 := bytes.TrimSpace(b); {
		case len(t0) > 0 && t0[0] == '[':
			var want []json.RawMessage
			if err := json.Unmarshal(b, &want); err != nil {
				t.Fatal(err)
			}
			var got [][]byte
			elements(b, func(v []byte) bool { got = append(got, v); return true })
			if len(got) != len(want) {
				t.Fatalf("%q: %d elements, encoding/json %d", b, len(got), len(want))
			}
			for i := range got {
				if !bytes.Equal(got[i], bytes.TrimSpace(want[i])) {
					t.Fatalf("%q: element %d %q, encoding/json %q", b, i, got[i], want[i])
				}
			}
		case len(t0) > 0 && t0[0] == '{':
			var want map[string]json.RawMessage
			if err := json.Unmarshal(b, &want); err != nil {
				t.Fatal(err)
			}
			got := map[string][]byte{}
			rawMembers(b, func(k, v []byte) { got[unquote(k)] = v })
			if len(got) != len(want) {
				t.Fatalf("%q: %d members, encoding/json %d", b, len(got), len(want))
			}
			for k, v := range want {
				if !bytes.Equal(got[k], bytes.TrimSpace(v)) {
					t.Fatalf("%q: member %q %q, encoding/json %q", b, k, got[k], v)
				}
			}
		}
	})
}

// TestDecodeValidStateDeepText: past walkDepth levels encoding/json
// decodes the rest, so deep valid text still decodes as DecodeState
// decodes it, and deep text that is not JSON returns rather than panics.
func TestDecodeValidStateDeepText(t *testing.T) {
	t.Parallel()
	deep := `{"a":` + strings.Repeat(`[{"b":`, 3*walkDepth) + `1` + strings.Repeat(`}]`, 3*walkDepth) + `}`
	want, err := DecodeState([]byte(deep))
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeValidState([]byte(deep))
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("DecodeValidState of %d levels: %v; DecodeState: no error", 6*walkDepth, err)
	}
	_, _ = DecodeValidState([]byte(`{"a":` + strings.Repeat(`[`, 100_000)))
}

package delta

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzStateCodecAgreesWithEncodingJSON holds the one-pass state decoder
// and encoder to encoding/json (UseNumber, SetEscapeHTML(false)) on every
// valid JSON text: the same value decoded, the same bytes encoded.
func FuzzStateCodecAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"a":1,"b":[1,"x",{"c":null}],"d":true,"e":false}`, `{"a":1,"a":{"b":2}}`,
		`{"s":"<a&b>","u":"\u00e9\u2028","q":"\"\\\/","k\n":1}`, `{"n":-0.5e+10,"m":1E3,"z":0}`,
		`[1,[2,[3,{}]],"\ud800"]`, `{"\xff":"\xfe"}`, `"str"`, `12.5`, `null`, ` {"a" : [ ] } `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		var want any
		require.NoError(t, dec.Decode(&want))
		got := decodeValid(b)
		require.Equal(t, want, got, "decode %q", b)

		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		require.NoError(t, enc.Encode(want))
		if out, ok := appendValue(nil, got); ok {
			require.Equal(t, string(bytes.TrimSuffix(buf.Bytes(), []byte("\n"))), string(out), "encode %q", b)
		}
		if m, isObject := got.(map[string]any); isObject {
			out, err := EncodeState(m)
			require.NoError(t, err)
			require.Equal(t, string(bytes.TrimSuffix(buf.Bytes(), []byte("\n"))), string(out), "EncodeState %q", b)
		}
	})
}

// TestStateCodecFallsBack checks the values the one-pass encoder leaves to
// encoding/json are still encoded as encoding/json does.
func TestStateCodecFallsBack(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		state map[string]any
		want  string
	}{
		{map[string]any{"f": 1.5, "i": 2, "s": "é\n"}, `{"f":1.5,"i":2,"s":"é\n"}`},
		{map[string]any{"é": json.Number("1")}, `{"é":1}`},
		{map[string]any{"n": json.Number("")}, `{"n":0}`},
		{map[string]any{"a": []any(nil), "m": map[string]any(nil)}, `{"a":null,"m":null}`},
	} {
		got, err := EncodeState(tc.state)
		require.NoError(t, err)
		require.Equal(t, tc.want, string(got))
	}
}

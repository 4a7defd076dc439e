package event

import (
	"encoding/json"
	"testing"
)

// FuzzStringOf: the fast path for plain strings decodes as encoding/json,
// for what it is given: one JSON string token the scanner accepted.
func FuzzStringOf(f *testing.F) {
	for _, s := range []string{`"job-1"`, `""`, `"a\"b"`, `"\u00e9t\u00e9"`, `"été"`, `"tab\there"`, `"\ud83d\ude00"`, `"x`, `x"`, `1`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 || b[0] != '"' || !json.Valid(b) {
			return
		}
		var want string
		wantErr := json.Unmarshal(b, &want)
		got, err := stringOf(b)
		if (err != nil) != (wantErr != nil) || (err == nil && got != want) {
			t.Fatalf("stringOf(%q) = %q, %v; encoding/json: %q, %v", b, got, err, want, wantErr)
		}
	})
}

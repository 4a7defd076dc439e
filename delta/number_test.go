package delta

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzIsJSONNumber: the hand-written number check agrees with
// encoding/json, which it replaced on the hot path, on what it is given:
// a value with the white space around it trimmed.
func FuzzIsJSONNumber(f *testing.F) {
	for _, s := range []string{"0", "-0", "1", "-1", "12", "01", "1.", ".5", "1.5", "-1.5e10", "1e", "1e+", "1E-3", "+1", "--1",
		"1.5.5", "0x10", "1_000", "Infinity", "NaN", "", "-", "9223372036854775808", "1e400", " 1", "1 "} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 || len(bytes.TrimSpace(b)) != len(b) {
			return
		}
		var n json.Number
		want := (b[0] == '-' || (b[0] >= '0' && b[0] <= '9')) && json.Unmarshal(b, &n) == nil
		if got := isJSONNumber(b); got != want {
			t.Fatalf("isJSONNumber(%q) = %v, encoding/json says %v", b, got, want)
		}
	})
}

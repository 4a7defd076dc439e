package event

import (
	"testing"
	"time"
)

// FuzzParseUTCAgreesWithTimeParse holds the fast path for occurred_at to
// time.Parse with time.RFC3339Nano: whatever it takes, time.Parse takes
// too, to the same time.Time (== compares the location as well).
func FuzzParseUTCAgreesWithTimeParse(f *testing.F) {
	for _, s := range []string{"2026-01-01T00:00:07.5Z", "2026-01-01T00:00:07Z", "2024-02-29T23:59:59.999999999Z",
		"2023-02-29T00:00:00Z", "2026-04-31T00:00:00Z", "2026-13-01T00:00:00Z", "2026-01-01T24:00:00Z",
		"2026-01-01T00:60:00Z", "2026-01-01T00:00:60Z", "2026-01-01T00:00:00.Z", "2026-01-01T00:00:00.1234567891Z",
		"2026-01-01T00:00:00+01:00", "2026-01-01t00:00:00z", "0000-01-01T00:00:00Z", "1900-02-29T00:00:00Z",
		"2000-02-29T00:00:00Z", "-001-01-01T00:00:00Z", "2026-01-01T00:00:0xZ", "2026-1-01T00:00:00Z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := parseUTC(s)
		want, err := time.Parse(time.RFC3339Nano, s)
		if ok && (err != nil || got != want) {
			t.Fatalf("parseUTC(%q) = %v; time.Parse: %v, %v", s, got, want, err)
		}
	})
}

// TestParseUTCTakesTheUsualForm: the fast path is taken for the form
// producers write, so the fuzz test above checks something.
func TestParseUTCTakesTheUsualForm(t *testing.T) {
	for _, s := range []string{"2026-01-01T00:00:07.5Z", "2026-01-01T00:00:07Z", "2024-02-29T23:59:59.123456789Z"} {
		if _, ok := parseUTC(s); !ok {
			t.Errorf("parseUTC(%q) fell back to time.Parse", s)
		}
	}
	for _, s := range []string{"2026-01-01T00:00:00+01:00", "2023-02-29T00:00:00Z", "2026-01-01T00:00:60Z"} {
		if _, ok := parseUTC(s); ok {
			t.Errorf("parseUTC(%q) took a form it must leave to time.Parse", s)
		}
	}
}

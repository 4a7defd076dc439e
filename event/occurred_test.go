package event

import (
	"regexp"
	"testing"
	"time"
)

// usualForm is the form parseUTC takes on its own.
var usualForm = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z$`)

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
		// And the fast path is taken for every string of its form that
		// time.Parse accepts.
		if !ok && err == nil && usualForm.MatchString(s) {
			t.Fatalf("parseUTC(%q) fell back to time.Parse, which takes it", s)
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

// BenchmarkParseUTC: the fast path against time.Parse, on the form
// producers write.
func BenchmarkParseUTC(b *testing.B) {
	const s = "2026-01-01T00:00:07.5Z"
	b.Run("parseUTC", func(b *testing.B) {
		for b.Loop() {
			if _, ok := parseUTC(s); !ok {
				b.Fatal("fell back")
			}
		}
	})
	b.Run("time.Parse", func(b *testing.B) {
		for b.Loop() {
			if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestScanMarksPlainMembers: job_id, event_id and occurred_at are taken as
// they lie in the record only when the scanner saw them as strings with
// no escape; an escape anywhere in one, or a value that is not a string,
// leaves it to the decoder.
func TestScanMarksPlainMembers(t *testing.T) {
	for _, c := range []struct {
		value string
		plain uint8
	}{
		{`{"job_id":"j","event_id":"e","occurred_at":"2026-01-01T00:00:00Z"}`, plainJobID | plainEventID | plainOccurredAt},
		{`{"job_id":"j\u00e9","event_id":"e","occurred_at":"2026-01-01T00:00:00\u005a"}`, plainEventID},
		{`{"event_id":"e\"1","state":{"a":"\n"},"job_id":"j"}`, plainJobID},
		{`{"job_id":"j","state":"\t","event_id":1}`, plainJobID | plainEventID},
		{`{"j\u006fb_id":"j","event_id":"e"}`, plainJobID | plainEventID},
	} {
		m, serr := scanObject([]byte(c.value))
		if serr != nil {
			t.Fatalf("%s: %s", c.value, serr.msg)
		}
		if m.plain != c.plain {
			t.Errorf("%s: plain %03b, want %03b", c.value, m.plain, c.plain)
		}
		if _, ok := m.text(m.eventID, plainEventID); ok != (c.plain&plainEventID != 0 && m.eventID[0] == '"') {
			t.Errorf("%s: event_id taken as it lies: %v", c.value, ok)
		}
	}
}

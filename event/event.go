package event

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/projector/projector/delta"
)

// Kind is what an event carries: a whole state, a change to one, or the
// end of the job.
type Kind string

// The three kinds of event. A delete is a whole-state event like a
// snapshot, whose state is "absent": it needs no predecessor.
const (
	Snapshot Kind = "snapshot"
	Delta    Kind = "delta"
	Delete   Kind = "delete"
)

// WholeState reports whether an event replaces the whole state (a snapshot
// or a delete) rather than changing it.
func (k Kind) WholeState() bool { return k == Snapshot || k == Delete }

// Limits of the wire format.
const (
	MaxValueBytes = 1 << 20
	MaxJobIDBytes = 256
)

// Event is one decoded, valid job event.
type Event struct {
	JobID   string
	Version int64
	Kind    Kind
	// State is the whole job state of a snapshot: a JSON object. A delete
	// has none.
	State json.RawMessage
	// Ops is how state(Version-1) becomes state(Version), for a delta.
	Ops []delta.Op
	// RawOps is the ops array as the producer sent it, kept so held deltas
	// can be stored and compared byte for byte.
	RawOps     json.RawMessage
	EventID    string
	OccurredAt time.Time
}

// FieldError says which field of a record broke the wire format and how.
type FieldError struct {
	Field  string // "value", "key", "job_id", "version", "kind", "state", "ops", "event_id", "occurred_at"
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Decode decodes a record value and checks it against its key. An empty
// key is accepted (the value's job_id is used); a non-empty key must equal
// job_id. Errors are *[FieldError].
func Decode(key, value []byte) (Event, error) {
	ev, err := DecodeValue(value)
	if err != nil {
		return Event{}, err
	}
	if len(key) > 0 && string(key) != ev.JobID {
		return Event{}, &FieldError{Field: "key", Reason: fmt.Sprintf("record key %q does not match job_id %q", clip(string(key)), clip(ev.JobID))}
	}
	return ev, nil
}

// tombstoneReason is why a Kafka tombstone is bad input, and what to
// publish instead.
const tombstoneReason = `value (a Kafka tombstone carries no version and cannot be ordered; to delete a job, publish {"job_id":"...","version":N,"kind":"delete"})`

// DecodeValue decodes a record value on its own, as the trusted snapshot
// endpoint returns it.
func DecodeValue(value []byte) (Event, error) {
	if len(value) == 0 {
		return Event{}, &FieldError{Field: "value", Reason: "empty or null " + tombstoneReason}
	}
	if len(value) > MaxValueBytes {
		return Event{}, &FieldError{Field: "value", Reason: fmt.Sprintf("%d bytes, over the 1 MiB limit", len(value))}
	}
	// JSON's own white space only: bytes.TrimSpace would also take \v,
	// \f, U+0085 and U+00A0, and let a value that is not JSON through.
	trimmed := delta.TrimJSONSpace(value)
	if bytes.Equal(trimmed, []byte("null")) {
		return Event{}, &FieldError{Field: "value", Reason: "null " + tombstoneReason}
	}
	if len(trimmed) == 0 {
		return Event{}, &FieldError{Field: "value", Reason: "not a JSON object"}
	}
	if trimmed[0] != '{' {
		reason := "not a JSON object"
		if why := notJSONSpace(trimmed, 0); why != "" {
			reason += ": it starts with " + charAt(trimmed, 0) + why
		}
		return Event{}, &FieldError{Field: "value", Reason: reason}
	}
	// One pass validates the value and picks out the members by their
	// exact names (encoding/json would match struct fields regardless of
	// case, letting an unknown "Version" override "version").
	w, serr := scanObject(trimmed)
	if serr != nil {
		if serr.malformed {
			return Event{}, &FieldError{Field: "value", Reason: "malformed JSON: " + serr.msg}
		}
		field := "value"
		switch serr.field {
		case "job_id", "state", "ops", "event_id", "occurred_at":
			field = serr.field
		}
		return Event{}, &FieldError{Field: field, Reason: serr.msg}
	}
	var ev Event
	var err error
	if ev.JobID, err = jobID(&w); err != nil {
		return Event{}, err
	}
	if ev.Version, err = version(w.version); err != nil {
		return Event{}, err
	}
	if ev.Kind, err = kind(w.kind); err != nil {
		return Event{}, err
	}
	switch ev.Kind {
	case Snapshot:
		st := delta.TrimJSONSpace(w.state)
		if len(st) == 0 || bytes.Equal(st, []byte("null")) {
			return Event{}, &FieldError{Field: "state", Reason: "required for a snapshot"}
		}
		if st[0] != '{' {
			return Event{}, &FieldError{Field: "state", Reason: "must be a JSON object"}
		}
		ev.State = bytes.Clone(st) // never alias the record's buffer
	case Delta:
		// The scanner has validated the whole value, ops included, and
		// noted where each op's members lie when every op is an object.
		if w.opsObjects {
			// Refused for its length before anything is copied.
			if err := delta.CheckOpCount(w.opsCount); err != nil {
				return Event{}, &FieldError{Field: "ops", Reason: err.Error()}
			}
		}
		// Parsed from a copy: the ops' values must not alias the record.
		ev.RawOps = bytes.Clone(w.ops)
		var ops []delta.Op
		var err error
		if w.opsObjects {
			ops, err = opsOf(&w, ev.RawOps)
		} else {
			ops, err = delta.ParseValidOps(ev.RawOps)
		}
		if err != nil {
			return Event{}, &FieldError{Field: "ops", Reason: err.Error()}
		}
		ev.Ops = ops
	case Delete:
		// A delete says "absent": a state or ops beside it would be a
		// producer's mistake that the projector must not guess about.
		if len(w.state) > 0 {
			return Event{}, &FieldError{Field: "state", Reason: "must be absent for a delete (a delete carries no state; publish a snapshot to set one)"}
		}
		if len(w.ops) > 0 {
			return Event{}, &FieldError{Field: "ops", Reason: "must be absent for a delete (a delete carries no ops)"}
		}
	}
	if raw := w.eventID; len(raw) > 0 && !isNull(raw) {
		if body, ok := w.text(raw, plainEventID); ok {
			ev.EventID = string(body)
		} else if ev.EventID, err = stringOf(raw); err != nil {
			return Event{}, &FieldError{Field: "event_id", Reason: "must be a string"}
		}
	}
	if raw := w.occurredAt; len(raw) > 0 && !isNull(raw) {
		if ev.OccurredAt, err = occurredAt(&w, raw); err != nil {
			return Event{}, err
		}
	}
	return ev, nil
}

func jobID(w *members) (string, error) {
	raw := w.jobID
	if len(raw) == 0 || isNull(raw) {
		return "", &FieldError{Field: "job_id", Reason: "required"}
	}
	var s string
	if body, ok := w.text(raw, plainJobID); ok {
		s = string(body)
	} else {
		var err error
		if s, err = stringOf(raw); err != nil {
			return "", &FieldError{Field: "job_id", Reason: "must be a string"}
		}
	}
	switch {
	case s == "":
		return "", &FieldError{Field: "job_id", Reason: "must not be empty"}
	case len(s) > MaxJobIDBytes:
		return "", &FieldError{Field: "job_id", Reason: fmt.Sprintf("%d bytes, at most %d allowed", len(s), MaxJobIDBytes)}
	case s == "/":
		// Encoded or not, "/" reaches a path-routing authority as a
		// trailing slash, never as the job {id} of /jobs/{id}.
		return "", &FieldError{Field: "job_id", Reason: `"/" alone is not a job id: no authority URL /jobs/{job_id} can carry it`}
	}
	return s, nil
}

func version(raw json.RawMessage) (int64, error) {
	if len(raw) == 0 || isNull(raw) {
		return 0, &FieldError{Field: "version", Reason: "required"}
	}
	s := string(raw)
	if s[0] == '"' {
		return 0, &FieldError{Field: "version", Reason: fmt.Sprintf("must be a JSON integer, got the string %s", clip(s))}
	}
	for i := 0; i < len(s); i++ {
		if (s[i] < '0' || s[i] > '9') && !(i == 0 && s[i] == '-') {
			return 0, &FieldError{Field: "version", Reason: fmt.Sprintf("must be an integer from 1 to %d, got %s", int64(math.MaxInt64), clip(s))}
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, &FieldError{Field: "version", Reason: fmt.Sprintf("%s is out of range: must be from 1 to %d", clip(s), int64(math.MaxInt64))}
	}
	if v < 1 {
		return 0, &FieldError{Field: "version", Reason: fmt.Sprintf("must be at least 1 (version 0 is the empty state), got %d", v)}
	}
	return v, nil
}

func kind(raw json.RawMessage) (Kind, error) {
	if len(raw) == 0 || isNull(raw) {
		return "", &FieldError{Field: "kind", Reason: `required ("snapshot", "delta" or "delete")`}
	}
	switch string(raw) { // the usual spellings, without allocating
	case `"snapshot"`:
		return Snapshot, nil
	case `"delta"`:
		return Delta, nil
	case `"delete"`:
		return Delete, nil
	}
	s, err := stringOf(raw)
	if err != nil {
		return "", &FieldError{Field: "kind", Reason: `must be the string "snapshot", "delta" or "delete"`}
	}
	// An escaped spelling ("\u0064elta") decodes to a string of its own:
	// the constant is returned instead, so no event keeps that string.
	for _, k := range []Kind{Snapshot, Delta, Delete} {
		if Kind(s) == k {
			return k, nil
		}
	}
	return "", &FieldError{Field: "kind", Reason: fmt.Sprintf(`unknown kind %q (want "snapshot", "delta" or "delete")`, clip(s))}
}

// stringOf decodes a JSON string as encoding/json does; one with nothing
// to unescape (the usual case) is taken as it is, without a decoder.
func stringOf(raw json.RawMessage) (string, error) {
	if body, ok := plainBody(raw); ok {
		return string(body), nil
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}

// plainBody returns the text of a JSON string literal with nothing to
// unescape, as it lies in raw. The scanner has already checked that it is
// valid UTF-8; checked again, for a caller other than the scanner.
func plainBody(raw []byte) ([]byte, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return nil, false
	}
	body := raw[1 : len(raw)-1]
	return body, bytes.IndexByte(body, '\\') < 0 && utf8.Valid(body)
}

// opsOf parses the ops from the members the scanner noted, each taken
// from raw, the copy of the ops array.
func opsOf(w *members, raw []byte) ([]delta.Op, error) {
	spans := w.opsElems()
	var local [4]delta.OpMembers
	elems := local[:0]
	if len(spans) > len(local) {
		elems = make([]delta.OpMembers, 0, len(spans))
	}
	at := func(sp [2]int32) []byte {
		if sp[1] == 0 {
			return nil
		}
		a, b := int(sp[0])-w.opsStart, int(sp[1])-w.opsStart
		return raw[a:b:b]
	}
	for _, sp := range spans {
		elems = append(elems, delta.OpMembers{Op: at(sp[delta.OpMemberOp]), Path: at(sp[delta.OpMemberPath]), Value: at(sp[delta.OpMemberValue]), By: at(sp[delta.OpMemberBy])})
	}
	return delta.ParseOpMembers(elems)
}

// occurredAt parses the occurred_at member raw of w. A string with
// nothing to unescape is parsed where it lies in the record, without a
// copy: it is only read.
func occurredAt(w *members, raw json.RawMessage) (time.Time, error) {
	var s string
	if body, ok := w.text(raw, plainOccurredAt); ok {
		s = unsafe.String(unsafe.SliceData(body), len(body))
	} else {
		var err error
		if s, err = stringOf(raw); err != nil {
			return time.Time{}, &FieldError{Field: "occurred_at", Reason: "must be an RFC 3339 time string"}
		}
	}
	if t, ok := parseUTC(s); ok {
		return t, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		// %q writes a new string: the message does not alias the record.
		return time.Time{}, &FieldError{Field: "occurred_at", Reason: fmt.Sprintf("%q is not an RFC 3339 time", clip(s))}
	}
	return t, nil
}

// parseUTC parses the form producers write, YYYY-MM-DDTHH:MM:SS with an
// optional fraction of 1 to 9 digits and Z, to what time.Parse with
// time.RFC3339Nano returns, faster (BenchmarkParseUTC). ok is false for any
// other form, or a field out of range: time.Parse then decides.
func parseUTC(s string) (t time.Time, ok bool) {
	if len(s) < 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[len(s)-1] != 'Z' {
		return time.Time{}, false
	}
	year, month, day := digits(s, 0, 4), digits(s, 5, 2), digits(s, 8, 2)
	hour, minute, sec := digits(s, 11, 2), digits(s, 14, 2), digits(s, 17, 2)
	if year < 0 || month < 1 || month > 12 || day < 1 || hour < 0 || hour > 23 || minute < 0 || minute > 59 || sec < 0 || sec > 59 {
		return time.Time{}, false
	}
	// Day 0 of the next month is the last of this one.
	if day > 28 && day > time.Date(year, time.Month(month)+1, 0, 0, 0, 0, 0, time.UTC).Day() {
		return time.Time{}, false
	}
	nsec := 0
	if frac := s[19 : len(s)-1]; frac != "" {
		if frac[0] != '.' || len(frac) < 2 || len(frac) > 10 {
			return time.Time{}, false
		}
		if nsec = digits(s, 20, len(frac)-1); nsec < 0 {
			return time.Time{}, false
		}
		for range 10 - len(frac) {
			nsec *= 10
		}
	}
	return time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC), true
}

// digits is the number the n decimal digits of s from at spell, or -1 if
// one is not a digit.
func digits(s string, at, n int) int {
	v := 0
	for i := at; i < at+n; i++ {
		d := s[i] - '0'
		if d > 9 {
			return -1
		}
		v = v*10 + int(d)
	}
	return v
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(delta.TrimJSONSpace(raw), []byte("null")) }

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

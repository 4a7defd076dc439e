package event_test

import (
	"encoding/json"
	"errors"
	"math"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
)

// record builds a valid snapshot value and lets a test change, add or drop
// members (a nil value drops the member).
func record(changes map[string]any) []byte {
	m := map[string]any{
		"job_id":  "job-1",
		"version": 7,
		"kind":    "snapshot",
		"state":   map[string]any{"status": "running"},
	}
	for k, v := range changes {
		if v == nil {
			delete(m, k)
			continue
		}
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

var goodOps = json.RawMessage(`[{"op":"increment","path":"/processed_articles","by":5}]`)

// oversized is a valid snapshot one byte over the value limit, so only the
// size can be the reason it is refused.
func oversized() []byte {
	base := record(map[string]any{"state": map[string]any{"pad": ""}})
	pad := strings.Repeat("x", event.MaxValueBytes+1-len(base))
	return record(map[string]any{"state": map[string]any{"pad": pad}})
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name   string
		key    []byte
		value  []byte
		field  string
		reason string
	}{
		{name: "malformed JSON", value: []byte(`{"job_id":"job-1","version":7,`), field: "value", reason: "malformed JSON"},
		{name: "trailing garbage", value: append(record(nil), []byte(" {}")...), field: "value", reason: "malformed JSON"},
		{name: "not an object", value: []byte(`["job-1",7]`), field: "value", reason: "not a JSON object"},
		{name: "missing job_id", value: record(map[string]any{"job_id": nil}), field: "job_id", reason: "required"},
		{name: "null job_id", value: []byte(`{"job_id":null,"version":7,"kind":"snapshot","state":{}}`), field: "job_id", reason: "required"},
		{name: "job_id not a string", value: record(map[string]any{"job_id": 17}), field: "job_id", reason: "must be a string"},
		{name: "empty job_id", value: record(map[string]any{"job_id": ""}), field: "job_id", reason: "must not be empty"},
		{name: "job_id a single slash", value: record(map[string]any{"job_id": "/"}), field: "job_id", reason: "no authority URL"},
		{name: "job_id over 256 bytes", value: record(map[string]any{"job_id": strings.Repeat("j", 257)}), field: "job_id", reason: "257 bytes, at most 256"},
		{name: "job_id over 256 bytes in multibyte runes", value: record(map[string]any{"job_id": strings.Repeat("é", 129)}), field: "job_id", reason: "258 bytes, at most 256"},
		{name: "job_id not UTF-8", value: []byte("{\"job_id\":\"job-\xff\",\"version\":7,\"kind\":\"snapshot\",\"state\":{}}"), field: "job_id", reason: "UTF-8"},
		{name: "missing version", value: record(map[string]any{"version": nil}), field: "version", reason: "required"},
		{name: "version 0", value: record(map[string]any{"version": 0}), field: "version", reason: "at least 1"},
		{name: "negative version", value: record(map[string]any{"version": -3}), field: "version", reason: "must be at least 1 (version 0 is the empty state), got -3"},
		{name: "version above 2^63-1", value: record(map[string]any{"version": json.Number("9223372036854775808")}), field: "version", reason: "9223372036854775808 is out of range"},
		{name: "version as a string", value: record(map[string]any{"version": "7"}), field: "version", reason: "got the string \"7\""},
		{name: "version as a float", value: record(map[string]any{"version": 1.5}), field: "version", reason: "must be an integer from 1 to 9223372036854775807, got 1.5"},
		{name: "version with an exponent", value: record(map[string]any{"version": json.Number("1e3")}), field: "version", reason: "must be an integer"},
		{name: "version as a boolean", value: record(map[string]any{"version": true}), field: "version", reason: "must be an integer"},
		{name: "missing kind", value: record(map[string]any{"kind": nil}), field: "kind", reason: "required"},
		{name: "unknown kind", value: record(map[string]any{"kind": "patch"}), field: "kind", reason: `unknown kind "patch"`},
		{name: "kind not a string", value: record(map[string]any{"kind": 1}), field: "kind", reason: "must be the string"},
		{name: "kind in another case", value: record(map[string]any{"kind": "Snapshot"}), field: "kind", reason: `unknown kind "Snapshot"`},
		{name: "key does not match job_id", key: []byte("job-2"), value: record(nil), field: "key", reason: `record key "job-2" does not match job_id "job-1"`},
		{name: "snapshot without state", value: record(map[string]any{"state": nil}), field: "state", reason: "required for a snapshot"},
		{name: "snapshot with null state", value: []byte(`{"job_id":"job-1","version":7,"kind":"snapshot","state":null}`), field: "state", reason: "required for a snapshot"},
		{name: "snapshot with array state", value: record(map[string]any{"state": []int{1}}), field: "state", reason: "must be a JSON object"},
		{name: "snapshot with string state", value: record(map[string]any{"state": "{}"}), field: "state", reason: "must be a JSON object"},
		{name: "delta without ops", value: record(map[string]any{"kind": "delta", "state": nil}), field: "ops", reason: "required for a delta"},
		{name: "delta with empty ops", value: record(map[string]any{"kind": "delta", "ops": []any{}}), field: "ops", reason: "at least 1 op"},
		{name: "delta with bad op", value: record(map[string]any{"kind": "delta", "ops": json.RawMessage(`[{"op":"move","path":"/a"}]`)}), field: "ops", reason: `ops[0].op: unknown op "move"`},
		{name: "delta with bad pointer", value: record(map[string]any{"kind": "delta", "ops": json.RawMessage(`[{"op":"remove","path":"/a~2"}]`)}), field: "ops", reason: "ops[0].path"},
		{name: "delete with a state", value: record(map[string]any{"kind": "delete"}), field: "state", reason: "must be absent for a delete"},
		{name: "delete with a null state", value: []byte(`{"job_id":"job-1","version":7,"kind":"delete","state":null}`), field: "state", reason: "must be absent for a delete"},
		{name: "delete with ops", value: record(map[string]any{"kind": "delete", "state": nil, "ops": goodOps}), field: "ops", reason: "must be absent for a delete"},
		{name: "delete with empty ops", value: record(map[string]any{"kind": "delete", "state": nil, "ops": []any{}}), field: "ops", reason: "must be absent for a delete"},
		{name: "delete without a version", value: record(map[string]any{"kind": "delete", "state": nil, "version": nil}), field: "version", reason: "required"},
		{name: "value over 1 MiB", value: oversized(), field: "value", reason: "1048577 bytes, over the 1 MiB limit"},
		{name: "transaction control record", key: []byte{0, 0, 0, 0}, value: []byte{0, 0, 0, 0, 0, 0}, field: "value", reason: "not a JSON object"},
		{name: "empty value", value: []byte{}, field: "value", reason: "empty or null value"},
		{name: "nil value (tombstone)", value: nil, field: "value", reason: `tombstone carries no version and cannot be ordered; to delete a job, publish {"job_id":"...","version":N,"kind":"delete"}`},
		{name: "null value", value: []byte(" null "), field: "value", reason: "null value"},
		{name: "blank value", value: []byte(" \n"), field: "value", reason: "not a JSON object"},
		{name: "event_id not a string", value: record(map[string]any{"event_id": 90}), field: "event_id", reason: "must be a string"},
		{name: "occurred_at not RFC 3339", value: record(map[string]any{"occurred_at": "30/11/2026 10:00"}), field: "occurred_at", reason: `"30/11/2026 10:00" is not an RFC 3339 time`},
		{name: "occurred_at without zone", value: record(map[string]any{"occurred_at": "2026-11-30T10:00:00"}), field: "occurred_at", reason: "RFC 3339"},
		{name: "occurred_at not a string", value: record(map[string]any{"occurred_at": 1764496800}), field: "occurred_at", reason: "must be an RFC 3339 time string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			ev, err := event.Decode(tt.key, tt.value)
			require.Equal(t, event.Event{}, ev)
			var fieldErr *event.FieldError
			require.ErrorAs(t, err, &fieldErr)
			require.Equal(t, tt.field, fieldErr.Field)
			require.Contains(t, fieldErr.Reason, tt.reason)
			require.True(t, strings.HasPrefix(err.Error(), tt.field+": "), "error %q does not name the field", err)
		})
	}
}

func TestDecodeAccepts(t *testing.T) {
	t.Parallel()

	occurred := time.Date(2026, 11, 30, 10, 0, 0, 123000000, time.UTC)
	maxJobID := strings.Repeat("j", event.MaxJobIDBytes)

	tests := []struct {
		name  string
		key   []byte
		value []byte
		want  event.Event
	}{
		{
			name: "snapshot with every field",
			key:  []byte("job-1"),
			value: record(map[string]any{
				"event_id":    "evt-90",
				"occurred_at": "2026-11-30T10:00:00.123Z",
			}),
			want: event.Event{
				JobID: "job-1", Version: 7, Kind: event.Snapshot,
				State:   json.RawMessage(`{"status":"running"}`),
				EventID: "evt-90", OccurredAt: occurred,
			},
		},
		{
			name:  "delta",
			key:   []byte("job-1"),
			value: record(map[string]any{"kind": "delta", "state": nil, "ops": goodOps}),
			want: event.Event{
				JobID: "job-1", Version: 7, Kind: event.Delta,
				Ops:    []delta.Op{{Kind: delta.Increment, Path: "/processed_articles", Tokens: []string{"processed_articles"}, By: "5"}},
				RawOps: goodOps,
			},
		},
		{
			name:  "delete",
			key:   []byte("job-1"),
			value: record(map[string]any{"kind": "delete", "state": nil, "event_id": "evt-91", "occurred_at": "2026-11-30T10:00:00.123Z"}),
			want:  event.Event{JobID: "job-1", Version: 7, Kind: event.Delete, EventID: "evt-91", OccurredAt: occurred},
		},
		{
			name:  "empty key takes job_id from the value",
			key:   nil,
			value: record(nil),
			want:  event.Event{JobID: "job-1", Version: 7, Kind: event.Snapshot, State: json.RawMessage(`{"status":"running"}`)},
		},
		{
			name: "unknown fields ignored, whatever their case",
			key:  []byte("job-1"),
			value: record(map[string]any{
				"schema": 2, "Version": 99, "JOB_ID": "other", "Kind": "delta", "ops": "ignored by a snapshot",
			}),
			want: event.Event{JobID: "job-1", Version: 7, Kind: event.Snapshot, State: json.RawMessage(`{"status":"running"}`)},
		},
		{
			name:  "null optional fields",
			value: []byte(`{"job_id":"job-1","version":7,"kind":"snapshot","state":{},"event_id":null,"occurred_at":null}`),
			want:  event.Event{JobID: "job-1", Version: 7, Kind: event.Snapshot, State: json.RawMessage(`{}`)},
		},
		{
			name:  "version 2^63-1",
			value: record(map[string]any{"version": int64(math.MaxInt64)}),
			want:  event.Event{JobID: "job-1", Version: math.MaxInt64, Kind: event.Snapshot, State: json.RawMessage(`{"status":"running"}`)},
		},
		{
			name:  "version 1",
			value: record(map[string]any{"version": 1}),
			want:  event.Event{JobID: "job-1", Version: 1, Kind: event.Snapshot, State: json.RawMessage(`{"status":"running"}`)},
		},
		{
			name:  "job_id of exactly 256 bytes",
			key:   []byte(maxJobID),
			value: record(map[string]any{"job_id": maxJobID}),
			want:  event.Event{JobID: maxJobID, Version: 7, Kind: event.Snapshot, State: json.RawMessage(`{"status":"running"}`)},
		},
		{
			name:  "whitespace around the value and its members",
			value: []byte("\n { \"job_id\" : \"job-1\" , \"version\" : 7 , \"kind\" : \"snapshot\" , \"state\" : { } } \n"),
			want:  event.Event{JobID: "job-1", Version: 7, Kind: event.Snapshot, State: json.RawMessage(`{ }`)},
		},
		{
			name:  "occurred_at with an offset",
			value: record(map[string]any{"occurred_at": "2026-11-30T11:00:00.123+01:00"}),
			want:  event.Event{JobID: "job-1", Version: 7, Kind: event.Snapshot, State: json.RawMessage(`{"status":"running"}`), OccurredAt: occurred.In(time.FixedZone("", 3600))},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := event.Decode(tt.key, tt.value)
			require.NoError(t, err)
			require.True(t, tt.want.OccurredAt.Equal(got.OccurredAt), "occurred_at %v, want %v", got.OccurredAt, tt.want.OccurredAt)
			got.OccurredAt, tt.want.OccurredAt = time.Time{}, time.Time{}
			require.Equal(t, tt.want, got)
		})
	}
}

func TestDecodeValueAtTheSizeLimit(t *testing.T) {
	t.Parallel()

	value := oversized()
	value = record(map[string]any{"state": map[string]any{"pad": strings.Repeat("x", len(value)-len(record(map[string]any{"state": map[string]any{"pad": ""}}))-1)}})
	require.Len(t, value, event.MaxValueBytes)

	ev, err := event.DecodeValue(value)
	require.NoError(t, err)
	require.Equal(t, int64(7), ev.Version)
}

// TestDecodeDoesNotAlias guards against a client that reuses its record
// buffers: the event must not change when the value's bytes do.
func TestDecodeDoesNotAlias(t *testing.T) {
	t.Parallel()

	value := record(map[string]any{"kind": "delta", "state": nil, "ops": json.RawMessage(`[{"op":"set","path":"/a","value":"xyz"}]`)})
	ev, err := event.Decode(nil, value)
	require.NoError(t, err)
	for i := range value {
		value[i] = ' '
	}
	require.Equal(t, `[{"op":"set","path":"/a","value":"xyz"}]`, string(ev.RawOps))
	require.Equal(t, `"xyz"`, string(ev.Ops[0].Value))
}

func TestFieldErrorMessage(t *testing.T) {
	t.Parallel()

	_, err := event.Decode(nil, record(map[string]any{"version": json.Number(strconv.Itoa(0))}))
	require.EqualError(t, err, "version: must be at least 1 (version 0 is the empty state), got 0")
}

func TestDecodeRefusesNULThatPostgreSQLCannotStore(t *testing.T) {
	t.Parallel()
	for _, v := range []string{
		`{"job_id":"a\u0000b","version":1,"kind":"snapshot","state":{}}`,
		`{"job_id":"a","version":1,"kind":"snapshot","state":{"x":"\u0000"}}`,
		`{"job_id":"a","version":1,"kind":"delta","ops":[{"op":"set","path":"/x","value":"\\\u0000"}]}`,
	} {
		_, err := event.Decode(nil, []byte(v))
		var fe *event.FieldError
		require.ErrorAs(t, err, &fe, v)
		require.Contains(t, fe.Error(), `\u0000`)
	}
	// An escaped backslash followed by the text u0000 is an ordinary string.
	_, err := event.Decode(nil, []byte(`{"job_id":"a","version":1,"kind":"snapshot","state":{"x":"\\u0000"}}`))
	require.NoError(t, err)
}

func TestDecodeRefusesWhatPostgreSQLJSONBRefuses(t *testing.T) {
	t.Parallel()
	bad := map[string]string{
		"lone high surrogate":  `{"job_id":"a","version":1,"kind":"snapshot","state":{"x":"\ud800"}}`,
		"lone low surrogate":   `{"job_id":"a","version":1,"kind":"snapshot","state":{"x":"a\udc00b"}}`,
		"high then non-low":    `{"job_id":"a","version":1,"kind":"snapshot","state":{"x":"\ud83d\u0041"}}`,
		"number too large":     `{"job_id":"a","version":1,"kind":"snapshot","state":{"x":1e131072}}`,
		"number too precise":   `{"job_id":"a","version":1,"kind":"snapshot","state":{"x":1e-16384}}`,
		"in a delta set value": `{"job_id":"a","version":1,"kind":"delta","ops":[{"op":"set","path":"/x","value":2E200000}]}`,
	}
	for name, v := range bad {
		_, err := event.Decode(nil, []byte(v))
		var fe *event.FieldError
		require.ErrorAs(t, err, &fe, name)
		require.Contains(t, fe.Error(), "PostgreSQL", name)
	}
	good := []string{
		`{"job_id":"a","version":1,"kind":"snapshot","state":{"x":"\ud83d\ude00","y":1e131071,"z":1e-16383,"w":-0.5E+3}}`,
		`{"job_id":"a","version":1,"kind":"snapshot","state":{"x":"\\ud800"}}`,
	}
	for _, v := range good {
		_, err := event.Decode(nil, []byte(v))
		require.NoError(t, err, v)
	}
}

// TestManyOpsAreRefusedWithoutNotingEach decodes records of about 1 MiB
// whose ops array holds 350,000 empty objects: the delta is refused for
// its length and the snapshot (whose ops are ignored) accepted, and
// neither allocates more than a small part of the record's size for them.
func TestManyOpsAreRefusedWithoutNotingEach(t *testing.T) {
	elems := strings.Repeat(`{},`, (event.MaxValueBytes-200)/3)
	elems = elems[:len(elems)-1]
	for _, tc := range []struct{ kind, extra, wantErr string }{
		{"delta", "", "holds 349"},
		{"snapshot", `,"state":{}`, ""},
	} {
		value := []byte(`{"job_id":"j","version":1,"kind":"` + tc.kind + `"` + tc.extra + `,"ops":[` + elems + `]}`)
		require.LessOrEqual(t, len(value), event.MaxValueBytes)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := event.Decode(nil, value)
		runtime.ReadMemStats(&after)
		if tc.wantErr != "" {
			require.ErrorContains(t, err, tc.wantErr, tc.kind)
		} else {
			require.NoError(t, err, tc.kind)
		}
		allocated := after.TotalAlloc - before.TotalAlloc
		require.Less(t, allocated, uint64(256<<10), "%s: %d bytes allocated to decode a %d-byte record", tc.kind, allocated, len(value))
	}
}

// TestDecodeRefusesRepeatedNames: an object that repeats a member name, at
// any depth, is refused with the name; encoding/json and PostgreSQL's
// jsonb keep the last value and other readers the first, so such a record
// would mean one thing to the read model and another to them (I-JSON, RFC
// 7493, forbids it).
func TestDecodeRefusesRepeatedNames(t *testing.T) {
	t.Parallel()
	many := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"k` + strconv.Itoa(i) + `":0`)
		}
		return b.String()
	}
	for _, tc := range []struct {
		name, value, field, repeated string
	}{
		{"version", `{"job_id":"a","version":1,"version":2,"kind":"snapshot","state":{}}`, "value", "version"},
		{"job_id", `{"job_id":"a","job_id":"b","version":1,"kind":"snapshot","state":{}}`, "value", "job_id"},
		{"job_id, one escaped", `{"job_id":"a","version":1,"kind":"snapshot","state":{},"j\u006fb_id":"b"}`, "value", "job_id"},
		{"kind", `{"job_id":"a","version":1,"kind":"delta","kind":"snapshot","state":{}}`, "value", "kind"},
		{"ops", `{"job_id":"a","version":2,"kind":"delta","ops":[{"op":"remove","path":"/a"}],"ops":[{"op":"remove","path":"/b"}]}`, "value", "ops"},
		{"an unknown member", `{"job_id":"a","version":1,"kind":"snapshot","state":{},"x":1,"x":1}`, "value", "x"},
		{"in an op", `{"job_id":"a","version":2,"kind":"delta","ops":[{"op":"set","path":"/a","value":1,"value":2}]}`, "ops", "value"},
		{"in an op, escaped", `{"job_id":"a","version":2,"kind":"delta","ops":[{"op":"remove","path":"/a","p\u0061th":"/b"}]}`, "ops", "path"},
		{"in an op's value", `{"job_id":"a","version":2,"kind":"delta","ops":[{"op":"set","path":"/a","value":{"b":1,"b":2}}]}`, "ops", "b"},
		{"in the state", `{"job_id":"a","version":1,"kind":"snapshot","state":{"status":"running","status":"failed"}}`, "state", "status"},
		{"deep in the state", `{"job_id":"a","version":1,"kind":"snapshot","state":{"a":[{"b":{"c":1,"d":2,"c":3}}]}}`, "state", "c"},
		{"past sixteen names", `{"job_id":"a","version":1,"kind":"snapshot","state":{` + many(100) + `,"k42":1}}`, "state", "k42"},
		{"an escaped slash", `{"job_id":"a","version":1,"kind":"snapshot","state":{"a/b":1,"a\/b":2}}`, "state", "a/b"},
		{"the empty name", `{"job_id":"a","version":1,"kind":"snapshot","state":{"":1,"":2}}`, "state", ""},
	} {
		_, err := event.Decode(nil, []byte(tc.value))
		var fe *event.FieldError
		require.ErrorAs(t, err, &fe, tc.name)
		require.Equal(t, tc.field, fe.Field, tc.name)
		require.Contains(t, fe.Reason, `repeats the member name "`+tc.repeated+`" (I-JSON, RFC 7493`, tc.name)
	}

	// The same names in different objects, and names that differ only
	// in case or escaping of other characters, are not repeats.
	for _, v := range []string{
		`{"job_id":"a","version":1,"kind":"snapshot","state":{"a":{"a":{"a":1}},"b":[{"a":1},{"a":2}],"A":1,"a\/b":1,"a/":1}}`,
		`{"job_id":"a","version":1,"kind":"snapshot","state":{` + many(1000) + `}}`,
		`{"job_id":"a","version":2,"kind":"delta","ops":[{"op":"remove","path":"/a"},{"op":"remove","path":"/b"}]}`,
	} {
		_, err := event.Decode(nil, []byte(v))
		require.NoError(t, err, v)
	}
}

// TestAnEscapedKindIsTheConstant: a kind spelled with an escape decodes
// to the constant itself, so an event (a held delta cached for long)
// keeps no string of its own for it.
func TestAnEscapedKindIsTheConstant(t *testing.T) {
	ev, err := event.DecodeValue([]byte(`{"job_id":"j","version":2,"kind":"\u0064elta","ops":[{"op":"increment","path":"/n","by":1}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if ev.Kind != event.Delta || unsafe.StringData(string(ev.Kind)) != unsafe.StringData(string(event.Delta)) {
		t.Fatalf("kind %q is not the constant Delta's string", ev.Kind)
	}
}

// TestDecodeRefusesSpaceThatIsNotJSON: around the value, only JSON's own
// white space is taken; a vertical tab, a form feed, U+0085 or U+00A0
// make the value something other than JSON, and it is bad input.
func TestDecodeRefusesSpaceThatIsNotJSON(t *testing.T) {
	const v = `{"job_id":"j","version":1,"kind":"delete"}`
	for pad, name := range map[string]string{"\v": `'\v'`, "\f": `'\f'`, "\u0085": "U+0085", "\u00a0": "U+00A0", "\ufeff": "U+FEFF"} {
		for _, value := range []string{v + pad, pad + v} {
			_, err := event.Decode(nil, []byte(value))
			var fe *event.FieldError
			if !errors.As(err, &fe) || fe.Field != "value" {
				t.Fatalf("Decode(%q) = %v, want a value error", value, err)
			}
			// The reason names the character and what may surround the
			// object.
			for _, want := range []string{name, "only space, tab, line feed and carriage return may surround the object"} {
				if !strings.Contains(fe.Reason, want) {
					t.Errorf("Decode(%q): reason %q does not say %q", value, fe.Reason, want)
				}
			}
		}
	}
	// A character that is not white space is named, not its first byte.
	_, err := event.Decode(nil, []byte(v+"é"))
	if err == nil || !strings.Contains(err.Error(), `'é' (U+00E9)`) {
		t.Errorf("Decode of a value followed by é: %v", err)
	}
	if _, err := event.Decode(nil, []byte(" \t\r\n"+v+"\n")); err != nil {
		t.Errorf("JSON white space around the value: %v", err)
	}
}

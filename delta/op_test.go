package delta_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/delta"
)

func TestParseOpsRejects(t *testing.T) {
	t.Parallel()

	tooMany := "[" + strings.Repeat(`{"op":"remove","path":"/a"},`, delta.MaxOps) + `{"op":"remove","path":"/a"}]`

	tests := []struct {
		name   string
		raw    string
		index  int
		field  string
		reason string
	}{
		{name: "absent", raw: ``, index: -1, field: "ops", reason: "required"},
		{name: "null", raw: `null`, index: -1, field: "ops", reason: "required"},
		{name: "not an array", raw: `{"op":"remove","path":"/a"}`, index: -1, field: "ops", reason: "must be an array"},
		{name: "string", raw: `"ops"`, index: -1, field: "ops", reason: "must be an array"},
		{name: "malformed array", raw: `[{"op":"remove"`, index: -1, field: "ops", reason: "array of op objects"},
		{name: "empty", raw: `[]`, index: -1, field: "ops", reason: "at least 1 op"},
		{name: "over the limit", raw: tooMany, index: -1, field: "ops", reason: "holds 1001 ops, at most 1000"},
		{name: "op not an object", raw: `[1]`, index: 0, field: "op", reason: "must be a JSON object"},
		{name: "op null", raw: `[null]`, index: 0, field: "op", reason: "must be a JSON object"},
		{name: "unknown op", raw: `[{"op":"move","path":"/a"}]`, index: 0, field: "op", reason: `unknown op "move"`},
		{name: "op missing", raw: `[{"path":"/a"}]`, index: 0, field: "op", reason: "required"},
		{name: "op not a string", raw: `[{"op":1,"path":"/a"}]`, index: 0, field: "op", reason: "must be the string"},
		{name: "op in another case", raw: `[{"OP":"remove","path":"/a"}]`, index: 0, field: "op", reason: "required"},
		{name: "path missing", raw: `[{"op":"remove"}]`, index: 0, field: "path", reason: "required"},
		{name: "path null", raw: `[{"op":"remove","path":null}]`, index: 0, field: "path", reason: "required"},
		{name: "path in another case", raw: `[{"op":"remove","PATH":"/a"}]`, index: 0, field: "path", reason: "required"},
		{name: "path not a string", raw: `[{"op":"remove","path":["a"]}]`, index: 0, field: "path", reason: "must be a JSON Pointer string"},
		{name: "bad escape ~2", raw: `[{"op":"remove","path":"/a~2b"}]`, index: 0, field: "path", reason: "bad escape"},
		{name: "trailing ~", raw: `[{"op":"remove","path":"/a~"}]`, index: 0, field: "path", reason: "bad escape"},
		{name: "root pointer", raw: `[{"op":"set","path":"","value":{}}]`, index: 0, field: "path", reason: "root pointer"},
		{name: "no leading slash", raw: `[{"op":"remove","path":"a/b"}]`, index: 0, field: "path", reason: `must start with "/"`},
		{name: "set without value", raw: `[{"op":"set","path":"/a"}]`, index: 0, field: "value", reason: "required for set"},
		{name: "increment without by", raw: `[{"op":"increment","path":"/a"}]`, index: 0, field: "by", reason: "required for increment"},
		{name: "increment by a string", raw: `[{"op":"increment","path":"/a","by":"5"}]`, index: 0, field: "by", reason: `must be a number, got "5"`},
		{name: "increment by null", raw: `[{"op":"increment","path":"/a","by":null}]`, index: 0, field: "by", reason: "must be a number, got null"},
		{name: "increment by a boolean", raw: `[{"op":"increment","path":"/a","by":true}]`, index: 0, field: "by", reason: "must be a number, got true"},
		{name: "increment by an object", raw: `[{"op":"increment","path":"/a","by":{"n":1}}]`, index: 0, field: "by", reason: "must be a number"},
		{name: "second op bad", raw: `[{"op":"remove","path":"/a"},{"op":"set","path":"/b"}]`, index: 1, field: "value", reason: "required for set"},
		// A repeated name is refused wherever it is: readers disagree on
		// which value counts.
		{name: "path twice", raw: `[{"op":"remove","path":"/a","path":"/b"}]`, index: 0, field: "path", reason: `repeats the member name "path" (I-JSON, RFC 7493`},
		{name: "by twice, one escaped", raw: `[{"op":"increment","path":"/n","\u0062y":2,"by":3}]`, index: 0, field: "by", reason: `repeats the member name "by"`},
		{name: "op twice", raw: `[{"op":"set","op":"remove","path":"/a","value":1}]`, index: 0, field: "op", reason: `repeats the member name "op"`},
		{name: "unknown member twice", raw: `[{"op":"remove","path":"/a","x":1,"x":2}]`, index: 0, field: "op", reason: `repeats the member name "x"`},
		{name: "inside a value", raw: `[{"op":"set","path":"/a","value":{"b":[{"c":1,"c":2}]}}]`, index: 0, field: "value", reason: `repeats the member name "c"`},
		{name: "empty name twice", raw: `[{"op":"set","path":"/a","value":{"":1,"":2}}]`, index: 0, field: "value", reason: `repeats the member name ""`},
		{name: "second op", raw: `[{"op":"remove","path":"/a"},{"op":"set","path":"/b","value":{"n":1,"m":2,"n":3}}]`, index: 1, field: "value", reason: `repeats the member name "n"`},
		{name: "past sixteen names", raw: `[{"op":"set","path":"/a","value":{` + manyNames(40) + `,"k7":0}}]`, index: 0, field: "value", reason: `repeats the member name "k7"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			ops, err := delta.ParseOps(json.RawMessage(tt.raw))
			require.Nil(t, ops)
			var opErr *delta.OpError
			require.ErrorAs(t, err, &opErr)
			require.Equal(t, tt.index, opErr.Index)
			require.Equal(t, tt.field, opErr.Field)
			require.Contains(t, opErr.Reason, tt.reason)
			require.Contains(t, err.Error(), tt.field)
		})
	}
}

func TestParseOpsAccepts(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		raw  string
		want []delta.Op
	}{
		{
			name: "each kind",
			raw:  `[{"op":"set","path":"/status","value":"completed"},{"op":"remove","path":"/error"},{"op":"increment","path":"/processed_articles","by":5}]`,
			want: []delta.Op{
				{Kind: delta.Set, Path: "/status", Tokens: []string{"status"}, Value: json.RawMessage(`"completed"`)},
				{Kind: delta.Remove, Path: "/error", Tokens: []string{"error"}},
				{Kind: delta.Increment, Path: "/processed_articles", Tokens: []string{"processed_articles"}, By: "5"},
			},
		},
		{
			name: "set null stores null",
			raw:  `[{"op":"set","path":"/error","value":null}]`,
			want: []delta.Op{{Kind: delta.Set, Path: "/error", Tokens: []string{"error"}, Value: json.RawMessage(`null`)}},
		},
		{
			name: "by keeps the producer's literal",
			raw:  `[{"op":"increment","path":"/n","by":-9007199254740993},{"op":"increment","path":"/f","by":1.5e-3}]`,
			want: []delta.Op{
				{Kind: delta.Increment, Path: "/n", Tokens: []string{"n"}, By: "-9007199254740993"},
				{Kind: delta.Increment, Path: "/f", Tokens: []string{"f"}, By: "1.5e-3"},
			},
		},
		{
			name: "unknown members ignored",
			raw:  `[{"op":"remove","path":"/a","from":"/b","Path":"/c"}]`,
			want: []delta.Op{{Kind: delta.Remove, Path: "/a", Tokens: []string{"a"}}},
		},
		{
			name: "escaped member names and kinds are read as their text",
			raw:  `[{"o\u0070":"s\u0065t","p\u0061th":"/a","\u0076alue":1,"\u0050ATH":"/b"},{"op":"increment","path":"/n","\u0062y":3}]`,
			want: []delta.Op{
				{Kind: delta.Set, Path: "/a", Tokens: []string{"a"}, Value: json.RawMessage(`1`)},
				{Kind: delta.Increment, Path: "/n", Tokens: []string{"n"}, By: "3"},
			},
		},
		{
			name: "many names in a value, none repeated",
			raw:  `[{"op":"set","path":"/a","value":{` + manyNames(40) + `,"":{"":1}}}]`,
			want: []delta.Op{{Kind: delta.Set, Path: "/a", Tokens: []string{"a"}, Value: json.RawMessage(`{` + manyNames(40) + `,"":{"":1}}`)}},
		},
		{
			name: "exactly the limit",
			raw:  "[" + strings.TrimSuffix(strings.Repeat(`{"op":"remove","path":"/a"},`, delta.MaxOps), ",") + "]",
			want: func() []delta.Op {
				ops := make([]delta.Op, delta.MaxOps)
				for i := range ops {
					ops[i] = delta.Op{Kind: delta.Remove, Path: "/a", Tokens: []string{"a"}}
				}
				return ops
			}(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			ops, err := delta.ParseOps(json.RawMessage(tt.raw))
			require.NoError(t, err)
			require.Equal(t, tt.want, ops)
		})
	}
}

func TestParsePointer(t *testing.T) {
	t.Parallel()

	tests := []struct {
		pointer string
		want    []string
		err     string
	}{
		{pointer: "/a", want: []string{"a"}},
		{pointer: "/a/b/c", want: []string{"a", "b", "c"}},
		{pointer: "/a~1b/c~0d", want: []string{"a/b", "c~d"}},
		{pointer: "/~01", want: []string{"~1"}},
		{pointer: "/~10", want: []string{"/0"}},
		{pointer: "/", want: []string{""}},
		{pointer: "/a/", want: []string{"a", ""}},
		{pointer: "/ü", want: []string{"ü"}},
		{pointer: "", err: "root pointer"},
		{pointer: "a", err: `must start with "/"`},
		{pointer: "/a~2", err: "bad escape"},
		{pointer: "/~", err: "bad escape"},
		{pointer: "/a~b", err: "bad escape"},
	}
	for _, tt := range tests {
		t.Run(tt.pointer, func(t *testing.T) {
			t.Parallel()

			got, err := delta.ParsePointer(tt.pointer)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestParsePointerBoundsTheDepth(t *testing.T) {
	t.Parallel()
	_, err := delta.ParsePointer(strings.Repeat("/a", delta.MaxPathDepth))
	require.NoError(t, err)
	_, err = delta.ParsePointer(strings.Repeat("/a", delta.MaxPathDepth+1))
	require.ErrorContains(t, err, "levels deep")
}

func TestIncrementDoesNotDependOnHowAnIntegerWasSpelled(t *testing.T) {
	t.Parallel()
	ops, err := delta.ParseOps(json.RawMessage(`[{"op":"increment","path":"/n","by":1}]`))
	require.NoError(t, err)
	for _, state := range []string{`{"n":1e20}`, `{"n":100000000000000000000}`, `{"n":100000000000000000000.0}`} {
		got, err := delta.ApplyJSON(json.RawMessage(state), ops)
		require.NoError(t, err)
		require.JSONEq(t, `{"n":100000000000000000001}`, string(got), state)
	}
}

func TestIncrementByAHugeExponentFailsFast(t *testing.T) {
	t.Parallel()
	ops, err := delta.ParseOps(json.RawMessage(`[{"op":"increment","path":"/n","by":1e999999999}]`))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := delta.ApplyJSON(json.RawMessage(`{"n":1.5}`), ops)
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorContains(t, err, "beyond the range")
	case <-time.After(5 * time.Second):
		t.Fatal("an increment by 1e999999999 must not try to build a billion-digit integer")
	}
}

// manyNames is n members "k0":0 ... "k<n-1>":0, without braces.
func manyNames(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%d":0`, i)
	}
	return b.String()
}

package delta_test

import (
	"encoding/json"
	"math/big"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/projector/projector/delta"
)

func mustOps(t testing.TB, raw string) []delta.Op {
	t.Helper()
	ops, err := delta.ParseOps(json.RawMessage(raw))
	require.NoError(t, err)
	return ops
}

func mustState(t testing.TB, raw string) map[string]any {
	t.Helper()
	state, err := delta.DecodeState(json.RawMessage(raw))
	require.NoError(t, err)
	return state
}

func TestApply(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name  string
		state string
		ops   string
		want  string
	}{
		{
			name:  "set a member",
			state: `{"status":"running","n":1}`,
			ops:   `[{"op":"set","path":"/status","value":"completed"}]`,
			want:  `{"status":"completed","n":1}`,
		},
		{
			name:  "set creates missing parents",
			state: `{}`,
			ops:   `[{"op":"set","path":"/a/b/c","value":1}]`,
			want:  `{"a":{"b":{"c":1}}}`,
		},
		{
			name:  "set into an existing object keeps its other members",
			state: `{"a":{"x":true}}`,
			ops:   `[{"op":"set","path":"/a/b","value":{"c":[1,2]}}]`,
			want:  `{"a":{"x":true,"b":{"c":[1,2]}}}`,
		},
		{
			name:  "set replaces a whole member of any type",
			state: `{"a":[1,2,3]}`,
			ops:   `[{"op":"set","path":"/a","value":"flat"}]`,
			want:  `{"a":"flat"}`,
		},
		{
			name:  "set null",
			state: `{"error":"boom"}`,
			ops:   `[{"op":"set","path":"/error","value":null}]`,
			want:  `{"error":null}`,
		},
		{
			name:  "set keeps big numbers exact",
			state: `{}`,
			ops:   `[{"op":"set","path":"/n","value":{"big":123456789012345678901234567890}}]`,
			want:  `{"n":{"big":123456789012345678901234567890}}`,
		},
		{
			name:  "set the empty key",
			state: `{}`,
			ops:   `[{"op":"set","path":"/","value":1}]`,
			want:  `{"":1}`,
		},
		{
			name:  "pointer escapes address a/b then c~d",
			state: `{"a":1}`,
			ops:   `[{"op":"set","path":"/a~1b/c~0d","value":2}]`,
			want:  `{"a":1,"a/b":{"c~d":2}}`,
		},
		{
			name:  "remove a member",
			state: `{"status":"failed","error":"boom"}`,
			ops:   `[{"op":"remove","path":"/error"}]`,
			want:  `{"status":"failed"}`,
		},
		{
			name:  "remove a nested member",
			state: `{"a":{"b":1,"c":2}}`,
			ops:   `[{"op":"remove","path":"/a/b"}]`,
			want:  `{"a":{"c":2}}`,
		},
		{
			name:  "remove a missing member is a no-op",
			state: `{"a":1}`,
			ops:   `[{"op":"remove","path":"/b"}]`,
			want:  `{"a":1}`,
		},
		{
			name:  "remove under a missing parent is a no-op",
			state: `{"a":1}`,
			ops:   `[{"op":"remove","path":"/x/y/z"}]`,
			want:  `{"a":1}`,
		},
		{
			name:  "increment a missing member counts from 0",
			state: `{}`,
			ops:   `[{"op":"increment","path":"/processed","by":5}]`,
			want:  `{"processed":5}`,
		},
		{
			name:  "increment creates missing parents",
			state: `{}`,
			ops:   `[{"op":"increment","path":"/stats/articles/done","by":-2}]`,
			want:  `{"stats":{"articles":{"done":-2}}}`,
		},
		{
			name:  "increment an existing integer",
			state: `{"n":40}`,
			ops:   `[{"op":"increment","path":"/n","by":2}]`,
			want:  `{"n":42}`,
		},
		{
			name:  "increment 2^53 by 1 stays exact",
			state: `{"n":9007199254740992}`,
			ops:   `[{"op":"increment","path":"/n","by":1}]`,
			want:  `{"n":9007199254740993}`,
		},
		{
			name:  "increment 2^53+1 by 1 stays exact",
			state: `{"n":9007199254740993}`,
			ops:   `[{"op":"increment","path":"/n","by":1}]`,
			want:  `{"n":9007199254740994}`,
		},
		{
			name:  "increment past int64",
			state: `{"n":9223372036854775807}`,
			ops:   `[{"op":"increment","path":"/n","by":1}]`,
			want:  `{"n":9223372036854775808}`,
		},
		{
			name:  "increment below int64",
			state: `{"n":-9223372036854775808}`,
			ops:   `[{"op":"increment","path":"/n","by":-1}]`,
			want:  `{"n":-9223372036854775809}`,
		},
		{
			name:  "increment beyond any machine word",
			state: `{"n":99999999999999999999999999999}`,
			ops:   `[{"op":"increment","path":"/n","by":1}]`,
			want:  `{"n":100000000000000000000000000000}`,
		},
		{
			name:  "increment by a float",
			state: `{"n":1.5}`,
			ops:   `[{"op":"increment","path":"/n","by":2.25}]`,
			want:  `{"n":3.75}`,
		},
		{
			name:  "float increments round like float64",
			state: `{"n":0.1}`,
			ops:   `[{"op":"increment","path":"/n","by":0.2}]`,
			want:  `{"n":0.30000000000000004}`,
		},
		{
			name:  "integer plus float is a float",
			state: `{"n":1}`,
			ops:   `[{"op":"increment","path":"/n","by":0.5}]`,
			want:  `{"n":1.5}`,
		},
		{
			name:  "an exponent makes a float",
			state: `{"n":1e2}`,
			ops:   `[{"op":"increment","path":"/n","by":1}]`,
			want:  `{"n":101}`,
		},
		{
			name:  "integral values written with an exponent add exactly",
			state: `{"n":1e21}`,
			ops:   `[{"op":"increment","path":"/n","by":1}]`,
			want:  `{"n":1000000000000000000001}`,
		},
		{
			name:  "ops apply in order",
			state: `{"n":1}`,
			ops: `[{"op":"increment","path":"/n","by":1},{"op":"set","path":"/m","value":{"k":10}},` +
				`{"op":"increment","path":"/m/k","by":5},{"op":"remove","path":"/n"},{"op":"increment","path":"/n","by":3}]`,
			want: `{"m":{"k":15},"n":3}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := delta.Apply(mustState(t, tt.state), mustOps(t, tt.ops))
			require.NoError(t, err)
			require.Equal(t, mustState(t, tt.want), got)

			gotJSON, err := delta.ApplyJSON(json.RawMessage(tt.state), mustOps(t, tt.ops))
			require.NoError(t, err)
			require.Equal(t, mustState(t, tt.want), mustState(t, string(gotJSON)))
		})
	}
}

func TestApplyRejects(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name   string
		state  string
		ops    string
		index  int
		path   string
		reason string
	}{
		{
			name:   "increment a string",
			state:  `{"n":"5"}`,
			ops:    `[{"op":"increment","path":"/n","by":1}]`,
			path:   "/n",
			reason: "not a number (it is a string)",
		},
		{
			name:   "increment an object",
			state:  `{"n":{}}`,
			ops:    `[{"op":"increment","path":"/n","by":1}]`,
			path:   "/n",
			reason: "not a number (it is an object)",
		},
		{
			name:   "increment null",
			state:  `{"n":null}`,
			ops:    `[{"op":"increment","path":"/n","by":1}]`,
			path:   "/n",
			reason: "not a number (it is null)",
		},
		{
			name:   "increment a boolean",
			state:  `{"n":true}`,
			ops:    `[{"op":"increment","path":"/n","by":1}]`,
			path:   "/n",
			reason: "not a number (it is a boolean)",
		},
		{
			name:   "increment an array",
			state:  `{"n":[1]}`,
			ops:    `[{"op":"increment","path":"/n","by":1}]`,
			path:   "/n",
			reason: "not a number (it is an array)",
		},
		{
			name:   "set under a string parent",
			state:  `{"a":"text"}`,
			ops:    `[{"op":"set","path":"/a/b","value":1}]`,
			path:   "/a/b",
			reason: `parent "/a" is not an object (it is a string)`,
		},
		{
			name:   "set under an array parent",
			state:  `{"a":[{"b":0}]}`,
			ops:    `[{"op":"set","path":"/a/0/b","value":1}]`,
			path:   "/a/0/b",
			reason: `parent "/a" is not an object (it is an array)`,
		},
		{
			name:   "set under a null parent",
			state:  `{"a":null}`,
			ops:    `[{"op":"set","path":"/a/b","value":1}]`,
			path:   "/a/b",
			reason: `parent "/a" is not an object (it is null)`,
		},
		{
			name:   "increment under a deep number parent",
			state:  `{"a":{"b/c":7}}`,
			ops:    `[{"op":"increment","path":"/a/b~1c/d","by":1}]`,
			path:   "/a/b~1c/d",
			reason: `parent "/a/b~1c" is not an object (it is a number)`,
		},
		{
			name:   "remove under a string parent",
			state:  `{"a":"text"}`,
			ops:    `[{"op":"remove","path":"/a/b"}]`,
			path:   "/a/b",
			reason: `parent "/a" is not an object (it is a string)`,
		},
		{
			name:   "the index names the failing op",
			state:  `{}`,
			ops:    `[{"op":"set","path":"/s","value":"x"},{"op":"increment","path":"/n","by":1},{"op":"increment","path":"/s","by":1}]`,
			index:  2,
			path:   "/s",
			reason: "not a number",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			state := mustState(t, tt.state)
			got, err := delta.Apply(state, mustOps(t, tt.ops))
			require.Nil(t, got)
			var applyErr *delta.ApplyError
			require.ErrorAs(t, err, &applyErr)
			require.Equal(t, tt.index, applyErr.Index)
			require.Equal(t, tt.path, applyErr.Path)
			require.Contains(t, applyErr.Reason, tt.reason)
			require.Contains(t, err.Error(), strconv.Quote(tt.path))
			require.Equal(t, mustState(t, tt.state), state, "a failed apply must leave the input alone")
		})
	}
}

func TestApplyHandBuiltOps(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name   string
		op     delta.Op
		want   string
		reason string
	}{
		{name: "path without tokens", op: delta.Op{Kind: delta.Set, Path: "/a~1b", Value: json.RawMessage(`1`)}, want: `{"a/b":1}`},
		{name: "root path", op: delta.Op{Kind: delta.Remove, Path: ""}, reason: "root pointer"},
		{name: "unknown kind", op: delta.Op{Kind: "move", Path: "/a"}, reason: `unknown op "move"`},
		{name: "invalid value", op: delta.Op{Kind: delta.Set, Path: "/a", Value: json.RawMessage(`{`)}, reason: "value"},
		{name: "trailing value data", op: delta.Op{Kind: delta.Set, Path: "/a", Value: json.RawMessage(`1 2`)}, reason: "after the JSON value"},
		{name: "invalid by", op: delta.Op{Kind: delta.Increment, Path: "/a", By: "x"}, reason: "not an integer"},
		{name: "empty by", op: delta.Op{Kind: delta.Increment, Path: "/a", By: ""}, reason: "not a number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := delta.Apply(nil, []delta.Op{tt.op})
			if tt.reason != "" {
				var applyErr *delta.ApplyError
				require.ErrorAs(t, err, &applyErr)
				require.Contains(t, applyErr.Reason, tt.reason)
				return
			}
			require.NoError(t, err)
			require.Equal(t, mustState(t, tt.want), got)
		})
	}
}

func TestApplyCodeBuiltNumbers(t *testing.T) {
	t.Parallel()

	state := map[string]any{"f": 1.5, "i": 2, "j": int64(3)}
	got, err := delta.Apply(state, mustOps(t, `[{"op":"increment","path":"/f","by":1},{"op":"increment","path":"/i","by":1},{"op":"increment","path":"/j","by":1}]`))
	require.NoError(t, err)
	require.Equal(t, map[string]any{"f": json.Number("2.5"), "i": json.Number("3"), "j": json.Number("4")}, got)
}

func TestApplyDoesNotShareState(t *testing.T) {
	t.Parallel()

	const raw = `{"a":{"b":{"c":1},"list":[{"x":1}]},"s":"keep"}`
	state := mustState(t, raw)
	ops := mustOps(t, `[{"op":"set","path":"/a/b/d","value":{"v":1}},{"op":"increment","path":"/a/b/c","by":1},{"op":"remove","path":"/s"}]`)

	got, err := delta.Apply(state, ops)
	require.NoError(t, err)
	require.Equal(t, mustState(t, raw), state, "Apply modified its input")
	require.Equal(t, mustState(t, `{"a":{"b":{"c":2,"d":{"v":1}},"list":[{"x":1}]}}`), got)

	// Changing the result, down to arrays and values set by ops, must reach
	// neither the input nor a later result of the same ops.
	got["a"].(map[string]any)["list"].([]any)[0].(map[string]any)["x"] = "changed"
	got["a"].(map[string]any)["b"].(map[string]any)["d"].(map[string]any)["v"] = "changed"
	require.Equal(t, mustState(t, raw), state)
	again, err := delta.Apply(state, ops)
	require.NoError(t, err)
	require.Equal(t, mustState(t, `{"a":{"b":{"c":2,"d":{"v":1}},"list":[{"x":1}]}}`), again)
}

func TestApplyNilState(t *testing.T) {
	t.Parallel()

	got, err := delta.Apply(nil, nil)
	require.NoError(t, err)
	require.Equal(t, map[string]any{}, got)
}

func TestDecodeState(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		raw  string
		want map[string]any
		err  string
	}{
		{name: "nil is the empty state", raw: "", want: map[string]any{}},
		{name: "blank is the empty state", raw: " \n", want: map[string]any{}},
		{name: "empty object", raw: `{}`, want: map[string]any{}},
		{
			name: "numbers stay literals",
			raw:  `{"i":9007199254740993,"f":1.50,"e":1E3,"o":{"n":-0}}`,
			want: map[string]any{"i": json.Number("9007199254740993"), "f": json.Number("1.50"), "e": json.Number("1E3"), "o": map[string]any{"n": json.Number("-0")}},
		},
		{name: "null", raw: `null`, err: "must be a JSON object, got null"},
		{name: "array", raw: `[]`, err: "must be a JSON object, got an array"},
		{name: "string", raw: `"s"`, err: "must be a JSON object, got a string"},
		{name: "number", raw: `1`, err: "must be a JSON object, got a number"},
		{name: "malformed", raw: `{"a":`, err: "decode state"},
		{name: "trailing data", raw: `{} {}`, err: "after the JSON value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := delta.DecodeState(json.RawMessage(tt.raw))
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestEncodeState(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name  string
		state map[string]any
		want  string
	}{
		{name: "nil is an empty object", state: nil, want: `{}`},
		{name: "keys sorted, compact", state: map[string]any{"b": true, "a": []any{nil, "x"}}, want: `{"a":[null,"x"],"b":true}`},
		{name: "numbers written as their literals", state: map[string]any{"n": json.Number("9007199254740993"), "f": json.Number("2e+21")}, want: `{"f":2e+21,"n":9007199254740993}`},
		{name: "no HTML escaping", state: map[string]any{"s": "<a&b>"}, want: `{"s":"<a&b>"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := delta.EncodeState(tt.state)
			require.NoError(t, err)
			require.Equal(t, tt.want, string(got))
		})
	}
}

func TestApplyJSONRejectsBadState(t *testing.T) {
	t.Parallel()

	_, err := delta.ApplyJSON(json.RawMessage(`[1]`), mustOps(t, `[{"op":"remove","path":"/a"}]`))
	require.ErrorContains(t, err, "must be a JSON object")
}

// genToken draws from a small key set so random ops collide on the same
// members and parents often, including keys that need escaping.
var genToken = rapid.SampledFrom([]string{"a", "b", "c/d", "e~f", ""})

func genValue(depth int) *rapid.Generator[any] {
	scalars := []*rapid.Generator[any]{
		rapid.Just[any](nil),
		rapid.Map(rapid.Bool(), func(b bool) any { return b }),
		rapid.Map(rapid.StringN(0, 4, -1), func(s string) any { return s }),
		rapid.Map(genNumber(), func(n json.Number) any { return n }),
	}
	if depth <= 0 {
		return rapid.OneOf(scalars...)
	}
	obj := rapid.Map(rapid.MapOfN(genToken, genValue(depth-1), 0, 3), func(m map[string]any) any { return m })
	arr := rapid.Map(rapid.SliceOfN(genValue(depth-1), 0, 2), func(s []any) any { return s })
	return rapid.OneOf(append(scalars, obj, obj, arr)...)
}

// genNumber draws JSON number literals: small and int64 integers, integers
// beyond 2^53 and beyond int64, and floats.
func genNumber() *rapid.Generator[json.Number] {
	return rapid.OneOf(
		rapid.Map(rapid.Int64Range(-10, 10), func(i int64) json.Number { return json.Number(strconv.FormatInt(i, 10)) }),
		rapid.Map(rapid.Int64(), func(i int64) json.Number { return json.Number(strconv.FormatInt(i, 10)) }),
		rapid.SampledFrom([]json.Number{"9007199254740993", "-9223372036854775809", "18446744073709551616"}),
		rapid.Map(rapid.Float64Range(-1e6, 1e6), func(f float64) json.Number { return json.Number(strconv.FormatFloat(f, 'g', -1, 64)) }),
	)
}

func genPointer() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		tokens := rapid.SliceOfN(genToken, 1, 3).Draw(t, "tokens")
		return pointerOf(tokens)
	})
}

func pointerOf(tokens []string) string {
	p := ""
	for _, tok := range tokens {
		esc := ""
		for _, r := range tok {
			switch r {
			case '~':
				esc += "~0"
			case '/':
				esc += "~1"
			default:
				esc += string(r)
			}
		}
		p += "/" + esc
	}
	return p
}

// genOps draws a valid ops array as a producer would send it, so the
// property covers ParseOps too.
func genOps(t *rapid.T, label string) []delta.Op {
	n := rapid.IntRange(0, 12).Draw(t, label+" length")
	wire := make([]map[string]any, n)
	for i := range wire {
		op := map[string]any{"path": genPointer().Draw(t, label+" path")}
		switch rapid.SampledFrom([]delta.Kind{delta.Set, delta.Remove, delta.Increment}).Draw(t, label+" kind") {
		case delta.Set:
			op["op"] = "set"
			op["value"] = genValue(2).Draw(t, label+" value")
		case delta.Remove:
			op["op"] = "remove"
		case delta.Increment:
			op["op"] = "increment"
			op["by"] = genNumber().Draw(t, label+" by")
		}
		wire[i] = op
	}
	if n == 0 {
		return nil
	}
	raw, err := json.Marshal(wire)
	require.NoError(t, err)
	ops, err := delta.ParseOps(raw)
	require.NoError(t, err)
	return ops
}

func genState(t *rapid.T) map[string]any {
	return rapid.MapOfN(genToken, genValue(2), 0, 4).Draw(t, "state")
}

// TestFoldProperty checks the definition Fold documents: applying two
// consecutive deltas one after the other equals applying their fold, with
// the same outcome when either delta fails.
func TestFoldProperty(t *testing.T) {
	t.Parallel()

	rapid.Check(t, func(t *rapid.T) {
		state := genState(t)
		ops := genOps(t, "ops")
		cut := rapid.IntRange(0, len(ops)).Draw(t, "cut")
		a, b := ops[:cut], ops[cut:]

		folded, foldErr := delta.Apply(state, delta.Fold(a, b))

		mid, err := delta.Apply(state, a)
		if err != nil {
			requireSameApplyError(t, err, foldErr, 0)
			return
		}
		stepwise, err := delta.Apply(mid, b)
		if err != nil {
			requireSameApplyError(t, err, foldErr, len(a))
			return
		}
		require.NoError(t, foldErr)
		require.Equal(t, stepwise, folded)
	})
}

func requireSameApplyError(t *rapid.T, stepErr, foldErr error, offset int) {
	var step, fold *delta.ApplyError
	require.ErrorAs(t, stepErr, &step)
	require.ErrorAs(t, foldErr, &fold)
	require.Equal(t, step.Index+offset, fold.Index)
	require.Equal(t, step.Path, fold.Path)
	require.Equal(t, step.Reason, fold.Reason)
}

func TestFoldDoesNotAlias(t *testing.T) {
	t.Parallel()

	a := make([]delta.Op, 1, 4)
	a[0] = delta.Op{Kind: delta.Remove, Path: "/a", Tokens: []string{"a"}}
	b := []delta.Op{{Kind: delta.Remove, Path: "/b", Tokens: []string{"b"}}}
	folded := delta.Fold(a, b)
	folded[0].Path = "/changed"
	require.Equal(t, "/a", a[0].Path)
	require.Len(t, delta.Fold(), 0)
}

// TestIncrementExactProperty checks integer increments against math/big:
// no sum of integers, however large, may be rounded.
func TestIncrementExactProperty(t *testing.T) {
	t.Parallel()

	rapid.Check(t, func(t *rapid.T) {
		start := genInteger().Draw(t, "start")
		bys := rapid.SliceOfN(genInteger(), 1, 20).Draw(t, "bys")

		want, _ := new(big.Int).SetString(start, 10)
		wire := make([]map[string]any, len(bys))
		for i, by := range bys {
			n, _ := new(big.Int).SetString(by, 10)
			want.Add(want, n)
			wire[i] = map[string]any{"op": "increment", "path": "/n", "by": json.Number(by)}
		}
		raw, err := json.Marshal(wire)
		require.NoError(t, err)
		ops, err := delta.ParseOps(raw)
		require.NoError(t, err)

		got, err := delta.Apply(map[string]any{"n": json.Number(start)}, ops)
		require.NoError(t, err)
		require.Equal(t, json.Number(want.String()), got["n"])
	})
}

func genInteger() *rapid.Generator[string] {
	return rapid.OneOf(
		rapid.Map(rapid.Int64(), func(i int64) string { return strconv.FormatInt(i, 10) }),
		rapid.Map(rapid.Int64Range(1<<53-3, 1<<53+3), func(i int64) string { return strconv.FormatInt(i, 10) }),
		rapid.Map(rapid.SampledFrom([]int64{1<<63 - 1, -1 << 63}), func(i int64) string { return strconv.FormatInt(i, 10) }),
		rapid.Map(rapid.Uint64(), func(u uint64) string { return "-1" + strconv.FormatUint(u, 10) + "0000000000" }),
	)
}

func TestPatchUndoesAFailedDelta(t *testing.T) {
	t.Parallel()

	const raw = `{"a":{"n":1},"s":"text","gone":true}`
	state := mustState(t, raw)
	// Every op before the last changes the state (a member set, one
	// incremented, one removed, objects created on the way); the last
	// fails, and all of it must be undone.
	ops := mustOps(t, `[{"op":"set","path":"/a/m","value":{"v":1}},{"op":"increment","path":"/a/n","by":2},
		{"op":"remove","path":"/gone"},{"op":"set","path":"/new/deep/x","value":1},{"op":"set","path":"/s","value":"changed"},
		{"op":"increment","path":"/s","by":1}]`)

	err := delta.Patch(state, ops)
	var applyErr *delta.ApplyError
	require.ErrorAs(t, err, &applyErr)
	require.Equal(t, 5, applyErr.Index)
	require.Equal(t, mustState(t, raw), state)

	require.NoError(t, delta.Patch(state, ops[:5]))
	require.Equal(t, mustState(t, `{"a":{"n":3,"m":{"v":1}},"s":"changed","new":{"deep":{"x":1}}}`), state)
}

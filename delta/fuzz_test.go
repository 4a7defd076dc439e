package delta_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/delta"
)

// FuzzApply feeds arbitrary ops and states through ParseOps, DecodeState,
// Apply and Patch. Nothing may panic; a failure must be a typed error; a success must
// leave the input alone, survive an encode/decode round trip unchanged and
// agree with applying the ops in two runs.
func FuzzApply(f *testing.F) {
	f.Add([]byte(`{}`), []byte(`[{"op":"set","path":"/status","value":"completed"}]`))
	f.Add([]byte(`{"error":"boom"}`), []byte(`[{"op":"remove","path":"/error"},{"op":"remove","path":"/x/y"}]`))
	f.Add([]byte(`{"n":9007199254740993}`), []byte(`[{"op":"increment","path":"/n","by":1}]`))
	f.Add([]byte(`{"n":0.1}`), []byte(`[{"op":"increment","path":"/n","by":0.2},{"op":"increment","path":"/m/k","by":-1e3}]`))
	f.Add([]byte(`{"a":"text"}`), []byte(`[{"op":"set","path":"/a/b","value":1}]`))
	f.Add([]byte(`{"a":[1]}`), []byte(`[{"op":"increment","path":"/a","by":1}]`))
	f.Add([]byte(``), []byte(`[{"op":"set","path":"/a~1b/c~0d","value":{"x":[null,true]}}]`))
	f.Add([]byte(`{"n":1.7e308}`), []byte(`[{"op":"increment","path":"/n","by":1.7e308}]`))

	f.Fuzz(func(t *testing.T, stateRaw, opsRaw []byte) {
		ops, err := delta.ParseOps(opsRaw)
		if json.Valid(opsRaw) {
			validOps, validErr := delta.ParseValidOps(opsRaw)
			require.Equal(t, ops, validOps)
			require.Equal(t, err, validErr)
		}
		if err != nil {
			var opErr *delta.OpError
			require.ErrorAs(t, err, &opErr)
			return
		}
		state, err := delta.DecodeState(stateRaw)
		if err != nil {
			return
		}
		before, err := delta.EncodeState(state)
		require.NoError(t, err)

		got, err := delta.Apply(state, ops)

		after, encErr := delta.EncodeState(state)
		require.NoError(t, encErr)
		require.Equal(t, string(before), string(after), "Apply modified its input")

		// Patch, on a state of its own, ends where Apply does, or fails at
		// the same op and leaves the state as it was.
		own, decErr := delta.DecodeState(stateRaw)
		require.NoError(t, decErr)
		patchErr := delta.Patch(own, ops)
		if err != nil {
			require.Equal(t, err, patchErr)
			require.Equal(t, state, own, "a failed Patch left the state changed")
		} else {
			require.NoError(t, patchErr)
			require.Equal(t, got, own)
		}
		if err != nil {
			var applyErr *delta.ApplyError
			require.ErrorAs(t, err, &applyErr)
			require.GreaterOrEqual(t, applyErr.Index, 0)
			require.Less(t, applyErr.Index, len(ops))
			return
		}

		enc, err := delta.EncodeState(got)
		require.NoError(t, err)
		back, err := delta.DecodeState(enc)
		require.NoError(t, err)
		require.Equal(t, got, back)

		half := len(ops) / 2
		mid, err := delta.Apply(state, ops[:half])
		require.NoError(t, err)
		stepwise, err := delta.Apply(mid, ops[half:])
		require.NoError(t, err)
		require.Equal(t, got, stepwise)

		viaJSON, err := delta.ApplyJSON(json.RawMessage(stateRaw), ops)
		require.NoError(t, err)
		require.Equal(t, string(enc), string(viaJSON))
	})
}

package delta_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/delta"
)

func TestSameState(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		a, b string
		same bool
	}{
		{name: "identical", a: `{"a":1}`, b: `{"a":1}`, same: true},
		{name: "member order", a: `{"a":1,"b":"x"}`, b: `{"b":"x","a":1}`, same: true},
		{name: "nested member order", a: `{"o":{"a":1,"b":[1,2]}}`, b: `{"o":{"b":[1,2],"a":1}}`, same: true},
		{name: "spacing", a: `{"a":1}`, b: " {\n\t\"a\" : 1 } ", same: true},
		{name: "string escapes", a: `{"a":"x"}`, b: `{"a":"\u0078"}`, same: true},
		{name: "empty objects", a: `{}`, b: `{ }`, same: true},
		{name: "1 vs 1.0 is one number", a: `{"n":1}`, b: `{"n":1.0}`, same: true},
		{name: "1 vs 1e0 is one number", a: `{"n":1}`, b: `{"n":1e0}`, same: true},
		{name: "1 vs 1.5", a: `{"n":1}`, b: `{"n":1.5}`, same: false},
		{name: "integers past 2^53 stay exact", a: `{"n":9007199254740993}`, b: `{"n":9007199254740992}`, same: false},
		{name: "different value", a: `{"a":1}`, b: `{"a":2}`, same: false},
		{name: "extra member", a: `{"a":1}`, b: `{"a":1,"b":null}`, same: false},
		{name: "array order", a: `{"a":[1,2]}`, b: `{"a":[2,1]}`, same: false},
		{name: "string vs number", a: `{"a":1}`, b: `{"a":"1"}`, same: false},
		{name: "malformed", a: `{"a":1}`, b: `{"a":`, same: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.same, delta.SameState(json.RawMessage(tt.a), json.RawMessage(tt.b)))
			require.Equal(t, tt.same, delta.SameState(json.RawMessage(tt.b), json.RawMessage(tt.a)), "symmetric")
		})
	}
}

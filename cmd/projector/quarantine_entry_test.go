package main

import (
	"encoding/base64"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/store"
)

// A key or value that is not valid UTF-8 cannot travel in a JSON string
// unchanged: the JSON output carries its exact bytes in base64 beside it,
// so two different binary keys never print alike.
func TestQuarantineEntryKeepsNonUTF8Bytes(t *testing.T) {
	key := []byte{0xff, 'a', 0xfe}
	value := []byte{0x00, 0xc3, 0x28, 0x80}
	b, err := json.Marshal(entryOf(store.QuarantineRecord{ID: 1, Key: key, Value: value}, true))
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(b, &got))
	require.Equal(t, base64.StdEncoding.EncodeToString(key), got["key_base64"], "%s", b)
	require.Equal(t, base64.StdEncoding.EncodeToString(value), got["value_base64"], "%s", b)
	require.IsType(t, "", got["key"], "key stays a string")

	b, err = json.Marshal(entryOf(store.QuarantineRecord{ID: 2, Key: []byte("job-1"), Value: []byte(`{"a":1}`)}, true))
	require.NoError(t, err)
	got = map[string]any{}
	require.NoError(t, json.Unmarshal(b, &got))
	require.Equal(t, "job-1", got["key"])
	require.NotContains(t, got, "key_base64", "valid UTF-8 needs no copy")
	require.NotContains(t, got, "value_base64")
}

package store

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// inChunks hands over every write once, in order, in parts as full as its
// bounds allow: chunkRows writes, or chunkBytes past a part's first write.
func TestInChunksCutsAtItsBoundsAndKeepsEveryWriteInOrder(t *testing.T) {
	t.Parallel()
	small := json.RawMessage(`{"a":1}`)
	huge := json.RawMessage(`"` + strings.Repeat("x", 2<<20) + `"`)
	third := json.RawMessage(`"` + strings.Repeat("x", chunkBytes/3) + `"`)
	for _, c := range []struct {
		name  string
		ws    []Write
		parts []int
	}{
		{"none", nil, nil},
		{"one", writes(1, small), []int{1}},
		{"under the rows", writes(chunkRows-1, small), []int{chunkRows - 1}},
		{"at the rows", writes(chunkRows, small), []int{chunkRows}},
		{"one over", writes(chunkRows+1, small), []int{chunkRows, 1}},
		{"two over", writes(2*chunkRows+1, small), []int{chunkRows, chunkRows, 1}},
		{"a write over the bytes alone", writes(2, huge), []int{1, 1}},
		{"bytes before rows", writes(7, third), []int{2, 2, 2, 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got []int
			next := 0
			err := inChunks(c.ws, func(part []Write) error {
				got = append(got, len(part))
				for i := range part {
					require.Same(t, &c.ws[next], &part[i], "write %d handed over out of order or copied", next)
					next++
				}
				return nil
			})
			require.NoError(t, err)
			require.Equal(t, len(c.ws), next, "every write handed over")
			require.Equal(t, c.parts, got)
		})
	}
}

func writes(n int, state json.RawMessage) []Write {
	ws := make([]Write, n)
	for i := range ws {
		ws[i] = Write{JobID: "j", State: state}
	}
	return ws
}

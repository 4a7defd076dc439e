package sqs

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// The owner tag of a projection whose name is long is cut to SQS's 256
// characters on a character boundary: a cut through a multi-byte
// character is not UTF-8, SQS refuses the tag, and the check is off.
func TestQueueOwnerTagIsCutOnACharacterBoundary(t *testing.T) {
	t.Parallel()
	id := "0190c7c4-5a3b-7e1f-8f00-1c2d3e4f5a6b"
	for _, tc := range []struct {
		name string
		want int // bytes of the tag
	}{
		{name: "short", want: len(id) + 1 + len("short")},
		{name: strings.Repeat("a", 300), want: 256},
		// 37 bytes of ID and space, then two-byte characters: byte 256
		// is the second half of one.
		{name: strings.Repeat("é", 200), want: 255},
		{name: "a" + strings.Repeat("€", 100), want: 254},
		{name: strings.Repeat("a", 218) + "😀😀", want: 255},
	} {
		tag := ownerTag(id, tc.name)
		require.True(t, utf8.ValidString(tag), "%q", tag)
		require.Len(t, tag, tc.want)
		require.True(t, strings.HasPrefix(id+" "+tc.name, tag))
	}
}

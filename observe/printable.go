package observe

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Printable escapes what a terminal would interpret in text that comes
// from records or the database (job ids, keys, errors): control
// characters, invalid UTF-8 and other non-graphic runes are written as Go
// escapes, and so is a backslash, so that an escape cannot be forged; the
// rest is left as is. projector status and the status page (which
// escapes HTML on top) print record text through it.
func Printable(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || r == '\\' || !unicode.IsGraphic(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	q := strconv.QuoteToGraphic(s)
	q = q[1 : len(q)-1]
	return strings.ReplaceAll(q, `\"`, `"`)
}

package observe

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLoopsWedgedPastTimeoutAndFloor(t *testing.T) {
	t.Parallel()
	var l Loops
	_, doneA := l.Loop("a", 0)
	_, doneB := l.Loop("b", time.Hour)
	defer doneB()
	later := time.Now().Add(time.Minute)
	h := Liveness(l.Checks(later, 10*time.Second)...)
	require.False(t, h.OK)
	require.Equal(t, "a", h.Checks[0].Name)
	require.False(t, h.Checks[0].OK, "silent past the stall timeout")
	require.True(t, strings.HasPrefix(h.Checks[0].Detail, "wedged: no sign of life for 1m0s"), h.Checks[0].Detail)
	require.True(t, h.Checks[1].OK, "silent within its floor")
	doneA()
	require.True(t, Liveness(l.Checks(later, 10*time.Second)...).OK, "a loop done is no longer checked")
}

func TestDatabaseCheck(t *testing.T) {
	t.Parallel()
	var d Database
	c := d.Check()
	require.False(t, c.OK)
	require.Equal(t, "PostgreSQL has not answered yet", c.Detail)
	d.Answered()
	require.True(t, d.Check().OK)
	d.Failed(errors.New("refused"))
	require.True(t, d.Check().OK, "a failure after a fresh answer does not make it unready")
	d.at.Store(time.Now().Add(-time.Minute).UnixNano())
	c = d.Check()
	require.False(t, c.OK)
	require.Equal(t, "PostgreSQL has not answered for 1m0s: refused", c.Detail)
}

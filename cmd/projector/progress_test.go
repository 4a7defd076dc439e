package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestProgressLogsWhenNotATerminal: off a terminal, progress is a JSON log
// line with the records read of the target, the rate and the time left,
// durations written as text, at most once per interval, and once more at
// the end.
func TestProgressLogsWhenNotATerminal(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	lf := logFlags{level: "info", format: "json"}
	logger, err := lf.logger(&buf)
	require.NoError(t, err)
	p := newProgress(&buf, logger, "rebuild", 1000)
	require.Nil(t, p.tty, "a buffer is not a terminal")
	p.update(0)
	p.update(100) // within the interval: not shown
	p.update(400)
	p.finish()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2, "%s", buf.String())
	var last map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &last))
	require.Equal(t, "rebuild progress", last["msg"])
	require.EqualValues(t, 400, last["read"])
	require.EqualValues(t, 1000, last["target"])
	require.Contains(t, last, "rate_per_second")
	require.Contains(t, last, "eta")
	elapsed, ok := last["elapsed"].(string)
	require.True(t, ok, "durations are text in JSON logs: %v", last["elapsed"])
	_, err = time.ParseDuration(elapsed)
	require.NoError(t, err)
}

// TestJSONLogDurations: a duration in a JSON log line is "1.5s", not
// nanoseconds.
func TestJSONLogDurations(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	lf := logFlags{level: "info", format: "json"}
	logger, err := lf.logger(&buf)
	require.NoError(t, err)
	logger.Info("x", "retry_in", 1500*time.Millisecond, slog.Group("g", "d", 2*time.Second))
	require.Contains(t, buf.String(), `"retry_in":"1.5s"`)
	require.Contains(t, buf.String(), `"d":"2s"`)
}

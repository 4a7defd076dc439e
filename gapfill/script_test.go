package gapfill_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The golden scripts under testdata/ follow pebble's datadriven layout,
// parsed here in a few lines rather than taken on as a dependency. See
// testdata/advance/README.md for the format.

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of the golden scripts in testdata/")

// scriptCmd is one command of a script: a directive line, its input lines
// and the output it must print.
type scriptCmd struct {
	file  string
	line  int // of the directive, 1-based
	name  string
	args  []scriptArg
	input []string
	want  string
	// outFrom and outTo are the 0-based lines the output occupies
	// (outTo exclusive), for -rewrite.
	outFrom, outTo int
}

type scriptArg struct {
	key, val string
	bare     bool // written as "key" alone
}

func (c *scriptCmd) pos() string { return fmt.Sprintf("%s:%d", c.file, c.line) }

// runScripts runs every *.txt under dir, one subtest per file, calling run
// on a fresh interpreter for each file.
func runScripts(t *testing.T, dir string, newRun func(t *testing.T) func(*scriptCmd) string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no scripts under %s", dir)
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			if !*rewrite {
				t.Parallel()
			}
			runScript(t, file, newRun(t))
		})
	}
}

func runScript(t *testing.T, file string, run func(*scriptCmd) string) {
	t.Helper()
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	cmds := parseScript(t, file, lines)
	var outs []string
	for _, c := range cmds {
		got := strings.TrimRight(run(c), "\n")
		outs = append(outs, got)
		if !*rewrite && got != c.want {
			t.Errorf("%s: %s\nwant:\n%s\ngot:\n%s", c.pos(), c.name, indent(c.want), indent(got))
		}
	}
	if !*rewrite {
		return
	}
	var b strings.Builder
	at := 0
	for i, c := range cmds {
		for _, l := range lines[at:c.outFrom] {
			b.WriteString(l + "\n")
		}
		if outs[i] != "" {
			b.WriteString(outs[i] + "\n")
		}
		at = c.outTo
	}
	for _, l := range lines[at:] {
		b.WriteString(l + "\n")
	}
	require.NoError(t, os.WriteFile(file, []byte(b.String()), 0o644))
}

func indent(s string) string {
	if s == "" {
		return "    (nothing)"
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}

// parseScript splits a script into commands. Blank lines and lines
// starting with # separate commands; a command is a directive line, input
// lines up to "----", and output lines up to the next blank line.
func parseScript(t *testing.T, file string, lines []string) []*scriptCmd {
	t.Helper()
	var cmds []*scriptCmd
	for i := 0; i < len(lines); {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "#") {
			i++
			continue
		}
		c := &scriptCmd{file: filepath.Base(file), line: i + 1}
		name, rest, _ := strings.Cut(l, " ")
		c.name = name
		args, err := parseArgs(rest)
		require.NoError(t, err, "%s", c.pos())
		c.args = args
		i++
		for ; i < len(lines) && lines[i] != "----"; i++ {
			require.NotEmpty(t, strings.TrimSpace(lines[i]), "%s: blank line before ----", c.pos())
			c.input = append(c.input, lines[i])
		}
		require.Less(t, i, len(lines), "%s: no ---- after the command", c.pos())
		i++
		c.outFrom = i
		var out []string
		for ; i < len(lines) && lines[i] != ""; i++ {
			out = append(out, lines[i])
		}
		c.outTo = i
		c.want = strings.Join(out, "\n")
		cmds = append(cmds, c)
	}
	return cmds
}

// parseArgs splits "key=value key2 key3={...}" into arguments. A value
// starting with { or [ runs to its balanced closing bracket, so JSON with
// spaces needs no quoting; a value starting with " is a Go string literal.
func parseArgs(s string) ([]scriptArg, error) {
	var args []scriptArg
	for i := 0; ; {
		for i < len(s) && s[i] == ' ' {
			i++
		}
		if i >= len(s) {
			return args, nil
		}
		start := i
		for i < len(s) && s[i] != '=' && s[i] != ' ' {
			i++
		}
		key := s[start:i]
		if i >= len(s) || s[i] == ' ' {
			args = append(args, scriptArg{key: key, bare: true})
			continue
		}
		i++ // '='
		start = i
		switch {
		case i < len(s) && (s[i] == '{' || s[i] == '['):
			end, err := balanced(s, i)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", key, err)
			}
			i = end
			args = append(args, scriptArg{key: key, val: s[start:i]})
		case i < len(s) && s[i] == '"':
			end, err := quoted(s, i)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", key, err)
			}
			v, err := strconv.Unquote(s[start:end])
			if err != nil {
				return nil, fmt.Errorf("%s: %w", key, err)
			}
			i = end
			args = append(args, scriptArg{key: key, val: v})
		default:
			for i < len(s) && s[i] != ' ' {
				i++
			}
			args = append(args, scriptArg{key: key, val: s[start:i]})
		}
	}
}

// balanced returns the index just past the bracket that closes s[i].
func balanced(s string, i int) (int, error) {
	depth := 0
	for ; i < len(s); i++ {
		switch s[i] {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1, nil
			}
		case '"':
			end, err := quoted(s, i)
			if err != nil {
				return 0, err
			}
			i = end - 1
		}
	}
	return 0, fmt.Errorf("unbalanced brackets in %q", s)
}

// quoted returns the index just past the string literal starting at s[i].
func quoted(s string, i int) (int, error) {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case '"':
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string in %q", s)
}

// args is a command's arguments with typed accessors that fail the test
// on a malformed value. Every argument must be read, so a typo fails.
type args struct {
	t    *testing.T
	pos  string
	list []scriptArg
	used map[string]bool
}

func argsOf(t *testing.T, pos string, list []scriptArg) *args {
	return &args{t: t, pos: pos, list: list, used: map[string]bool{}}
}

func (a *args) get(key string) (string, bool) {
	a.used[key] = true
	for _, arg := range a.list {
		if arg.key == key {
			return arg.val, true
		}
	}
	return "", false
}

func (a *args) has(key string) bool {
	_, ok := a.get(key)
	return ok
}

func (a *args) str(key, def string) string {
	if v, ok := a.get(key); ok {
		return v
	}
	return def
}

func (a *args) int(key string, def int64) int64 {
	v, ok := a.get(key)
	if !ok {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	require.NoError(a.t, err, "%s: %s", a.pos, key)
	return n
}

func (a *args) dur(key string, def time.Duration) time.Duration {
	v, ok := a.get(key)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(strings.TrimPrefix(v, "+"))
	require.NoError(a.t, err, "%s: %s", a.pos, key)
	return d
}

// done fails the test on an argument no accessor asked for.
func (a *args) done() {
	for _, arg := range a.list {
		require.True(a.t, a.used[arg.key], "%s: unknown argument %q", a.pos, arg.key)
	}
}

// rel prints a time as an offset from the script's clock zero.
func rel(t0, t time.Time) string {
	if t.IsZero() {
		return "zero"
	}
	return "+" + t.Sub(t0).String()
}

func TestParseArgs(t *testing.T) {
	t.Parallel()
	got, err := parseArgs(`delta v=3 ops=[{"op":"set","path":"/a b","value":"x ] y"}] err="not found: 404" source=log`)
	require.NoError(t, err)
	require.Equal(t, []scriptArg{
		{key: "delta", bare: true},
		{key: "v", val: "3"},
		{key: "ops", val: `[{"op":"set","path":"/a b","value":"x ] y"}]`},
		{key: "err", val: "not found: 404"},
		{key: "source", val: "log"},
	}, got)
	_, err = parseArgs(`state={"a":1`)
	require.Error(t, err)
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"time"
)

// Exit codes of docs/contract.md section 5.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// usageError is bad usage or configuration: exit 2 with what to fix.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

type command struct {
	name    string
	summary string
	usage   string // the paragraph under "Usage:"
	flags   func(fs *flag.FlagSet) any
	run     func(ctx context.Context, env *cmdEnv, opts any) error
}

type cmdEnv struct {
	stdout, stderr io.Writer
}

var commands = []*command{runCommand, rebuildCommand, statusCommand, demoCommand, benchCommand, versionCommand}

const topUsage = `projector turns a Kafka stream of job events into a correct PostgreSQL read model.

Usage:
  projector <command> [flags]

Commands:
%s
Every flag can also be set by an environment variable, shown in each
command's help (projector <command> --help); a flag on the command line
wins. DATABASE_URL is the PostgreSQL connection string.

Exit codes: 0 success, 1 runtime failure, 2 bad usage or configuration.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		w := stdout
		code := exitOK
		if len(args) == 0 {
			w, code = stderr, exitUsage
		}
		if len(args) > 1 {
			c := find(args[1])
			if c == nil {
				fmt.Fprintf(stderr, "projector: unknown command %q\n\n", args[1])
				fmt.Fprintf(stderr, topUsage, commandList())
				return exitUsage
			}
			fs, _ := c.flagSet(stderr)
			fs.SetOutput(stdout)
			fs.Usage()
			return exitOK
		}
		fmt.Fprintf(w, topUsage, commandList())
		return code
	}
	c := find(args[0])
	if c == nil {
		fmt.Fprintf(stderr, "projector: unknown command %q\n\n", args[0])
		fmt.Fprintf(stderr, topUsage, commandList())
		return exitUsage
	}
	fs, opts := c.flagSet(stderr)
	usage := fs.Usage
	fs.Usage = func() {} // a parse error gets one line, not the whole help
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			usage()
			return exitOK
		}
		fmt.Fprintf(stderr, "projector %s: %v\nRun 'projector %s --help' for the flags.\n", c.name, err, c.name)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "projector %s: unexpected argument %q\nRun 'projector %s --help' for the flags.\n", c.name, fs.Arg(0), c.name)
		return exitUsage
	}
	if err := applyEnv(fs); err != nil {
		fmt.Fprintf(stderr, "projector %s: %v\n", c.name, err)
		return exitUsage
	}
	err := c.run(ctx, &cmdEnv{stdout: stdout, stderr: stderr}, opts)
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "projector %s: %v\nRun 'projector %s --help' for the flags.\n", c.name, err, c.name)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "projector %s: %v\n", c.name, err)
		return exitFailure
	}
}

func find(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

func commandList() string {
	var b strings.Builder
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-9s %s\n", c.name, c.summary)
	}
	return b.String()
}

func (c *command) flagSet(stderr io.Writer) (*flag.FlagSet, any) {
	fs := flag.NewFlagSet("projector "+c.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts := c.flags(fs)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "%s\n\nUsage:\n  projector %s [flags]\n\nFlags (environment variable in brackets):\n", c.usage, c.name)
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		sort.Strings(names)
		for _, n := range names {
			f := fs.Lookup(n)
			kind, usage := flag.UnquoteUsage(f)
			fmt.Fprintf(w, "  --%s %s  [%s]\n", f.Name, kind, envName(f.Name))
			fmt.Fprintf(w, "        %s", strings.ReplaceAll(usage, "\n", "\n        "))
			if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && f.DefValue != "0s" {
				fmt.Fprintf(w, " (default %s)", f.DefValue)
			}
			fmt.Fprintln(w)
		}
	}
	return fs, opts
}

// envName is the environment variable that sets a flag.
func envName(flagName string) string {
	if flagName == "database-url" {
		return "DATABASE_URL"
	}
	return "PROJECTOR_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv sets every flag not given on the command line from its
// environment variable, if that is set.
func applyEnv(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		v, ok := os.LookupEnv(envName(f.Name))
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %v", envName(f.Name), v, err))
		}
	})
	return errors.Join(errs...)
}

// listFlag is a comma-separated list.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	*l = nil
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*l = append(*l, part)
		}
	}
	return nil
}

// logFlags are shared by every command that logs.
type logFlags struct {
	level  string
	format string
}

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&l.format, "log-format", "text", "log format: text or json")
}

func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", l.level)
	}
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: durationsAsText}
	switch l.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usagef("--log-format %q: want text or json", l.format)
}

// durationsAsText prints durations as "1.5s" rather than nanoseconds, in
// JSON as in text.
func durationsAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

func positive(name string, d time.Duration) error {
	if d <= 0 {
		return usagef("--%s %s: must be positive", name, d)
	}
	return nil
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/projector/projector/store"
)

// Exit codes of docs/contract.md section 5.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	// exitDrift: verify found drift that remains.
	exitDrift = 3
)

// codeError ends a command with an exit code of its own; its report is
// already printed, the message only goes to stderr.
type codeError struct {
	code int
	msg  string
}

func (e *codeError) Error() string { return e.msg }

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
	// args names the positional arguments in the usage line ("JOB_ID");
	// empty means the command takes none. Flags may come before or after
	// them; "--" ends the flags.
	args string
	// subs are the subcommands ("quarantine list"); a command with subs
	// has no flags or run of its own.
	subs []*command
}

type cmdEnv struct {
	stdout, stderr io.Writer
	// args are the positional arguments of a command that takes them.
	args []string
}

var commands = []*command{runCommand, migrateCommand, rebuildCommand, statusCommand, resetPositionsCommand, explainCommand, quarantineCommand, verifyCommand, demoCommand, benchCommand, versionCommand}

const topUsage = `projector turns a Kafka stream of job events into a correct PostgreSQL read model.

Usage:
  projector <command> [flags]

Commands:
%s
Every flag can also be set by an environment variable, shown in each
command's help (projector <command> --help); a flag on the command line
wins. DATABASE_URL is the PostgreSQL connection string.

Exit codes: 0 success, 1 runtime failure, 2 bad usage or configuration,
3 drift remains (projector verify).
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
			if len(c.subs) > 0 {
				rest := append(args[2:min(3, len(args))], "--help")
				if c, _, code = c.sub(rest, stdout, stderr); c == nil {
					return code
				}
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
	args = args[1:]
	if len(c.subs) > 0 {
		var code int
		if c, args, code = c.sub(args, stdout, stderr); c == nil {
			return code
		}
	}
	fs, opts := c.flagSet(stderr)
	usage := fs.Usage
	fs.Usage = func() {} // a parse error gets one line, not the whole help
	fs.SetOutput(io.Discard)
	positional, err := parseInterspersed(fs, args, c.args != "")
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			usage()
			return exitOK
		}
		fmt.Fprintf(stderr, "projector %s: %v\nRun 'projector %s --help' for the flags.\n", c.name, flagError(fs, err), c.name)
		return exitUsage
	}
	if c.args == "" && len(positional) > 0 {
		fmt.Fprintf(stderr, "projector %s: unexpected argument %q\nRun 'projector %s --help' for the flags.\n", c.name, positional[0], c.name)
		return exitUsage
	}
	if err := applyEnv(fs); err != nil {
		fmt.Fprintf(stderr, "projector %s: %v\n", c.name, err)
		return exitUsage
	}
	err = c.run(ctx, &cmdEnv{stdout: stdout, stderr: stderr, args: positional}, opts)
	var ue *usageError
	var ce *codeError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "projector %s: %v\nRun 'projector %s --help' for the flags.\n", c.name, err, c.name)
		return exitUsage
	case errors.As(err, &ce):
		fmt.Fprintf(stderr, "projector %s: %v\n", c.name, err)
		return ce.code
	default:
		fmt.Fprintf(stderr, "projector %s: %v\n", c.name, err)
		return exitFailure
	}
}

// sub picks the subcommand named by args[0] and returns it with the rest
// of args; with no subcommand, help, or an unknown one it prints the list
// and returns nil and the exit code.
func (c *command) sub(args []string, stdout, stderr io.Writer) (*command, []string, int) {
	list := func(w io.Writer) {
		fmt.Fprintf(w, "%s\n\nUsage:\n  projector %s <command> [flags]\n\nCommands:\n", c.usage, c.name)
		for _, s := range c.subs {
			fmt.Fprintf(w, "  %-8s %s\n", strings.TrimPrefix(s.name, c.name+" "), s.summary)
		}
		fmt.Fprintf(w, "\nRun 'projector %s <command> --help' for each command's flags.\n", c.name)
	}
	if len(args) == 0 {
		list(stderr)
		return nil, nil, exitUsage
	}
	switch args[0] {
	case "help", "-h", "--help", "-help":
		list(stdout)
		return nil, nil, exitOK
	}
	for _, s := range c.subs {
		if s.name == c.name+" "+args[0] {
			return s, args[1:], exitOK
		}
	}
	fmt.Fprintf(stderr, "projector %s: unknown command %q\n\n", c.name, args[0])
	list(stderr)
	return nil, nil, exitUsage
}

// parseInterspersed parses flags that may come before, between or after
// positional arguments (the flag package stops at the first argument); a
// "--" ends the flags. Without positional it stops where fs.Parse does.
func parseInterspersed(fs *flag.FlagSet, args []string, positional bool) ([]string, error) {
	var out []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if !positional || len(rest) == 0 {
			return append(out, rest...), nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(out, rest...), nil
		}
		out = append(out, rest[0])
		args = rest[1:]
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
		fmt.Fprintf(&b, "  %-11s %s\n", c.name, c.summary)
	}
	return b.String()
}

func (c *command) flagSet(stderr io.Writer) (*flag.FlagSet, any) {
	fs := flag.NewFlagSet("projector "+c.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts := c.flags(fs)
	fs.Usage = func() {
		w := fs.Output()
		line := c.name + " [flags]"
		if c.args != "" {
			line += " " + c.args
		}
		fmt.Fprintf(w, "%s\n\nUsage:\n  projector %s\n\nFlags (environment variable in brackets):\n", c.usage, line)
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
			errs = append(errs, fmt.Errorf("%s=%q (--%s): %s", envName(f.Name), v, f.Name, want(f, err)))
		}
	})
	return errors.Join(errs...)
}

// The flag package's parse errors, which name flags with one dash.
var (
	errInvalidValue = regexp.MustCompile(`^invalid (?:boolean )?value (".*") for (?:flag )?-([^:]+): (.*)$`)
	errFlagName     = regexp.MustCompile(`^(flag provided but not defined|flag needs an argument): -(.+)$`)
)

// flagError rewrites a parse error to name the flag as it is written,
// with two dashes, and to say what value it wants.
func flagError(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if m := errInvalidValue.FindStringSubmatch(msg); m != nil {
		if f := fs.Lookup(m[2]); f != nil {
			return fmt.Errorf("--%s %s: %s", m[2], m[1], want(f, errors.New(m[3])))
		}
	}
	if m := errFlagName.FindStringSubmatch(msg); m != nil {
		if m[1] == "flag needs an argument" {
			if f := fs.Lookup(m[2]); f != nil {
				return fmt.Errorf("--%s needs a value: %s", m[2], want(f, nil))
			}
		}
		return fmt.Errorf("unknown flag --%s", m[2])
	}
	return err
}

// want says what a flag's value must look like, after the reason the
// given one was refused.
func want(f *flag.Flag, err error) string {
	var what string
	if g, ok := f.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case time.Duration:
			what = "want a duration such as 10s, 500ms or 2m"
		case bool:
			what = "want true or false"
		case int, int64, uint, uint64:
			what = "want a whole number"
		case float64:
			what = "want a number"
		}
	}
	switch {
	case err == nil && what == "":
		return "see --help"
	case err == nil:
		return what
	case what == "":
		return err.Error()
	}
	// The flag package's own reasons ("parse error") add nothing to what.
	if r := err.Error(); r != "parse error" && !strings.Contains(r, "invalid syntax") {
		return r + "; " + what
	}
	return what
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

// checkBrokers reports the first entry of --brokers that is not
// host:port with a port from 1 to 65535.
func checkBrokers(brokers []string) error {
	if len(brokers) == 0 {
		return usagef("no Kafka brokers: pass --brokers host:port[,host:port] or set PROJECTOR_BROKERS")
	}
	for _, b := range brokers {
		host, port, err := net.SplitHostPort(b)
		if err != nil || host == "" {
			return usagef("--brokers: %q is not a host:port address, e.g. kafka-1:9092", b)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return usagef("--brokers: %q: the port %q is not a number from 1 to 65535, e.g. kafka-1:9092", b, port)
		}
	}
	return nil
}

// checkHTTPAddr reports an --http-addr that is neither "off" nor a
// [host]:port to listen on (port 0 picks a free one).
func checkHTTPAddr(addr string) error {
	if addr == "" || addr == "off" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("--http-addr %q: want [host]:port such as :8080 or 127.0.0.1:8080, or off", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return usagef("--http-addr %q: the port %q is not a number from 0 to 65535; want [host]:port such as :8080, or off", addr, port)
	}
	return nil
}

// checkStoreNames refuses an empty --schema or --table (a flag or a
// PROJECTOR_ variable set to ""): a templating slip must not quietly
// select public.jobs. The name rules themselves are [store.Config.Validate]'s.
func checkStoreNames(schema, table string) error {
	if schema == "" {
		return usagef("--schema is empty (from the flag or PROJECTOR_SCHEMA): name a schema, e.g. --schema public")
	}
	if table == "" {
		return usagef("--table is empty (from the flag or PROJECTOR_TABLE): name a table, e.g. --table jobs")
	}
	if err := (store.Config{Schema: schema, Table: table}).Validate(); err != nil {
		return usagef("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return nil
}

func positive(name string, d time.Duration) error {
	if d <= 0 {
		return usagef("--%s %s: must be positive, a duration such as 10s, 500ms or 2m", name, d)
	}
	return nil
}

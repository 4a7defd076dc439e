package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"testing"
)

// otherEnvironment are the environment variables read outside the flags.
var otherEnvironment = [][2]string{
	{"DATABASE_URL", "the PostgreSQL connection string of every command that has `--database-url` (the flag wins)"},
	{saslPasswordEnv, "the Kafka SASL password; there is deliberately no flag for it (or use `--kafka-sasl-password-file`)"},
	{"GOMEMLIMIT", "the Go runtime's soft memory limit; set, it wins over `--memory-limit auto`"},
}

// flagReference renders every command's flags, with their environment
// variables and defaults, as the code defines them.
func flagReference() []byte {
	var b bytes.Buffer
	b.WriteString("# Flag reference\n\n")
	b.WriteString("Generated from the code; do not edit by hand. After a flag changes, run\n`go generate ./cmd/projector` and commit the result (a test fails while\nthis file and the code disagree).\n\n")
	b.WriteString("Every flag can also be set by the environment variable beside it; a flag on\nthe command line wins. A default of *none* means empty unless given; where\nthe command works out a default when it starts, its meaning says how.\n\n")
	b.WriteString("Exit codes: 0 success, 1 runtime failure, 2 bad usage or configuration,\n3 drift remains (`projector verify`).\n\n")
	b.WriteString("## Contents\n\n")
	var walk func(prefix string, cs []*command, visit func(name string, c *command))
	walk = func(prefix string, cs []*command, visit func(name string, c *command)) {
		for _, c := range cs {
			name := strings.TrimSpace(prefix + " " + c.name)
			if len(c.subs) > 0 {
				walk("", c.subs, visit)
				continue
			}
			visit(name, c)
		}
	}
	walk("", commands, func(name string, c *command) {
		fmt.Fprintf(&b, "- [`projector %s`](#%s): %s\n", name, anchor("projector "+name), c.summary)
	})
	b.WriteString("- [Other environment variables](#other-environment-variables)\n")
	walk("", commands, func(name string, c *command) {
		fmt.Fprintf(&b, "\n## `projector %s`\n\n", name)
		line := name + " [flags]"
		if c.args != "" {
			line += " " + c.args
		}
		fmt.Fprintf(&b, "```\nprojector %s\n```\n\n%s\n", line, strings.TrimSpace(c.usage))
		fs, _ := c.flagSet(io.Discard)
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		if len(names) == 0 {
			b.WriteString("\nNo flags.\n")
			return
		}
		sort.Strings(names)
		b.WriteString("\n| Flag | Environment | Default | Meaning |\n|---|---|---|---|\n")
		for _, n := range names {
			f := fs.Lookup(n)
			kind, usage := flag.UnquoteUsage(f)
			flagCell := "`--" + n + "`"
			if kind != "" {
				flagCell = "`--" + n + " " + kind + "`"
			}
			def := f.DefValue
			if c := computedDefaults[name+" --"+n]; def == "" && c != "" {
				def = c
			}
			defCell := "`" + def + "`"
			switch {
			case def == "" && kind == "":
				defCell = "`false`"
			case def == "":
				defCell = "*none*"
			}
			fmt.Fprintf(&b, "| %s | `%s` | %s | %s |\n", flagCell, envName(n), defCell, usageCell(usage))
		}
	})
	b.WriteString("\n## Other environment variables\n\n| Variable | Meaning |\n|---|---|\n")
	for _, e := range otherEnvironment {
		fmt.Fprintf(&b, "| `%s` | %s |\n", e[0], e[1])
	}
	return b.Bytes()
}

// usageCell makes a flag's help text one Markdown table cell.
func usageCell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return strings.ReplaceAll(s, "|", `\|`)
}

// anchor is the heading anchor GitHub gives a heading's text.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// TestFlagReference: docs/reference/flags.md is generated from the flag
// sets the commands parse: a flag added, removed, renamed or given a new
// default without regenerating it fails here.
func TestFlagReference(t *testing.T) {
	t.Parallel()
	checkReference(t, "docs/reference/flags.md", string(flagReference()))
}

// The reference must list every flag of every command with the default
// the code gives it: a changed default shows up in its row.
func TestFlagReferenceNamesEveryFlagAndDefault(t *testing.T) {
	t.Parallel()
	ref := string(flagReference())
	for name, fs := range commandFlags() {
		sec := ref[strings.Index(ref, "\n## `projector "+name+"`"):]
		if i := strings.Index(sec[1:], "\n## "); i >= 0 {
			sec = sec[:i+1]
		}
		fs.VisitAll(func(f *flag.Flag) {
			row := "| `--" + f.Name
			i := strings.Index(sec, row)
			if i < 0 {
				t.Errorf("projector %s: --%s missing from the reference", name, f.Name)
				return
			}
			line := sec[i : i+strings.Index(sec[i:], "\n")]
			if f.DefValue != "" && !strings.Contains(line, "| `"+f.DefValue+"` |") {
				t.Errorf("projector %s: --%s row %q lacks default %q", name, f.Name, line, f.DefValue)
			}
			if !strings.Contains(line, "`"+envName(f.Name)+"`") {
				t.Errorf("projector %s: --%s row lacks %s", name, f.Name, envName(f.Name))
			}
		})
	}
}

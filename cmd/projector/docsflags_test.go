package main

import (
	"bufio"
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// commandFlags is every command's flag set by name ("quarantine list" for
// a subcommand).
func commandFlags() map[string]*flag.FlagSet {
	out := map[string]*flag.FlagSet{}
	var walk func(prefix string, cs []*command)
	walk = func(prefix string, cs []*command) {
		for _, c := range cs {
			name := strings.TrimSpace(prefix + " " + c.name)
			if len(c.subs) > 0 {
				walk("", c.subs) // a subcommand's name holds its parent's
				continue
			}
			fs, _ := c.flagSet(io.Discard)
			out[name] = fs
		}
	}
	walk("", commands)
	return out
}

var (
	docHeading = regexp.MustCompile("`projector ([a-z-]+(?: [a-z]+)?)`")
	docFlagRow = regexp.MustCompile("^\\| `(--[a-z0-9-]+)` \\| ([^|]*)\\| ([^|]*)\\|")
	docToken   = regexp.MustCompile("`([^`]*)`")
)

// computedDefaults are the defaults the code computes when the flag is
// left empty, as the docs must give them.
var computedDefaults = map[string]string{
	"run --http-addr":     ":8080",
	"rebuild --http-addr": "off",
}

// sameDefault says whether a default as the docs write it (`2m`, `64MiB`,
// `false`) is the flag's.
func sameDefault(doc, code string) bool {
	if doc == code {
		return true
	}
	dd, err1 := time.ParseDuration(doc)
	cd, err2 := time.ParseDuration(code)
	return err1 == nil && err2 == nil && dd == cd
}

// handWrittenDocs are the docs written by hand: the README, docs/*.md and
// the task guides under docs/guide/. The generated reference under
// docs/reference/ is checked by TestFlagReference instead.
func handWrittenDocs(t *testing.T) []string {
	docs := []string{"../../README.md"}
	for _, pattern := range []string{"../../docs/*.md", "../../docs/guide/*.md"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		if len(m) == 0 {
			t.Fatalf("no docs match %s: the hand-written docs moved; update handWrittenDocs", pattern)
		}
		docs = append(docs, m...)
	}
	return docs
}

// Flag tables in the hand-written docs (the README, docs/*.md, the guides)
// are written by hand: every flag they list under a heading naming a
// command must be one of that command's, named with its environment
// variable, and the default they give must be the code's. The complete
// list of flags is the generated docs/reference/flags.md.
func TestDocsFlagTablesAgreeWithTheCode(t *testing.T) {
	t.Parallel()
	flags := commandFlags()
	for _, doc := range handWrittenDocs(t) {
		f, err := os.Open(doc)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		var cmds []string
		line := 0
		for sc.Scan() {
			line++
			text := sc.Text()
			if strings.HasPrefix(text, "#") {
				cmds = nil
				for _, m := range docHeading.FindAllStringSubmatch(text, -1) {
					if _, ok := flags[m[1]]; ok {
						cmds = append(cmds, m[1])
					}
				}
				continue
			}
			m := docFlagRow.FindStringSubmatch(text)
			if m == nil || len(cmds) == 0 {
				continue
			}
			where := filepath.Base(doc) + ":" + strconv.Itoa(line)
			name := strings.TrimPrefix(m[1], "--")
			env := strings.Trim(strings.TrimSpace(m[2]), "`")
			if want := envName(name); env != want && name != "database-url" {
				t.Errorf("%s: --%s: environment %q, want %q", where, name, env, want)
			}
			cell := strings.TrimSpace(m[3])
			toks := docToken.FindAllStringSubmatch(cell, -1)
			have := 0
			var problems []string
			for _, cmd := range cmds {
				fl := flags[cmd].Lookup(name)
				if fl == nil {
					continue
				}
				have++
				code := fl.DefValue
				if code == "" {
					code = computedDefaults[cmd+" --"+name]
				}
				switch {
				case code == "":
					// Computed when the command runs: the docs say how.
				case len(toks) > 0 && sameDefault(toks[0][1], code):
				case len(toks) == 0 && (code == "0" || code == "false"):
				default:
					problems = append(problems, "`projector "+cmd+"` has "+strconv.Quote(code))
				}
			}
			switch {
			case have == 0:
				t.Errorf("%s: %s has no flag --%s", where, strings.Join(cmds, ", "), name)
			case len(problems) == have:
				t.Errorf("%s: --%s: the docs give the default %s; %s", where, name, cell, strings.Join(problems, ", "))
			}
		}
		f.Close()
	}
}

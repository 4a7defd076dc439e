package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/projector/projector/store"
)

// storeFlags are the shared --database-url, --schema and --table.
type storeFlags struct {
	databaseURL, schema, table string
}

// register adds them with the wording of commands that read an existing
// projection and create nothing.
func (f *storeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.databaseURL, "database-url", "", "PostgreSQL connection string, e.g. postgres://user:pass@host:5432/db (required)")
	fs.StringVar(&f.schema, "schema", "public", "PostgreSQL schema of the read model")
	fs.StringVar(&f.table, "table", "jobs", "read-model table; also names the projection")
}

// config is the store's configuration the flags name.
func (f storeFlags) config() store.Config { return store.Config{Schema: f.schema, Table: f.table} }

// printable escapes what a terminal would interpret in text that comes from
// records or the database (job ids, keys, errors): control characters,
// invalid UTF-8 and other non-graphic runes are written as Go escapes; the
// rest is left as is.
func printable(s string) string {
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

// timeFlag is a point in time given as RFC 3339 (2026-11-30T09:00:00Z), a
// date (2026-11-30, UTC midnight) or a duration before now (24h, 90m).
type timeFlag struct {
	t   time.Time
	set bool
}

func (f *timeFlag) String() string {
	if !f.set {
		return ""
	}
	return f.t.Format(time.RFC3339)
}

func (f *timeFlag) Set(s string) error {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return fmt.Errorf("%q: a duration counts back from now and must not be negative", s)
		}
		f.t, f.set = time.Now().Add(-d), true
		return nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			f.t, f.set = t, true
			return nil
		}
	}
	return fmt.Errorf("%q: want a time such as 2026-11-30T09:00:00Z or 2026-11-30, or a duration back from now such as 24h", s)
}

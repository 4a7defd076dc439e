package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/projector/projector/projection"
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

// printable escapes what a terminal would interpret in text from records
// or the database; the status page escapes the same way.
func printable(s string) string { return projection.Printable(s) }

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

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

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

// openExisting checks the settings (exit 2 when they are wrong), then
// connects to a projection that must already exist: it creates and alters
// nothing, and a missing projection is a runtime failure (exit 1).
func openExisting(ctx context.Context, f storeFlags) (*store.Store, error) {
	if strings.TrimSpace(f.databaseURL) == "" {
		return nil, usagef("DATABASE_URL is not set: set it or pass --database-url, e.g. postgres://user@127.0.0.1:5432/db")
	}
	if _, err := pgxpool.ParseConfig(f.databaseURL); err != nil {
		return nil, usagef("DATABASE_URL is not a valid PostgreSQL connection string (want postgres://user:pass@host:port/db or key=value pairs): %v", err)
	}
	if err := checkStoreNames(f.schema, f.table); err != nil {
		return nil, err
	}
	cfg := store.Config{Schema: f.schema, Table: f.table}
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	st, err := store.Open(cctx, f.databaseURL, cfg)
	if err != nil {
		return nil, err
	}
	if err := st.CheckExists(ctx); err != nil {
		st.Close()
		if errors.Is(err, store.ErrNoProjection) {
			return nil, fmt.Errorf("no projection %s.%s in this database: %w", f.schema, f.table, err)
		}
		return nil, err
	}
	return st, nil
}

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

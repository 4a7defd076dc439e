package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/projector/projector/store"
)

// access is what a command needs of the projection's tables.
type access int

const (
	// migrated creates the projection or migrates it to this version (run,
	// rebuild); a projection already current is only read (DML rights
	// suffice).
	migrated access = iota
	// existing connects to a projection that must already exist, and
	// creates and alters nothing (explain, quarantine, verify).
	existing
	// readOnly is existing in read-only transactions that need no more
	// than SELECT rights (status).
	readOnly
	// unchecked connects and checks nothing of the tables (migrate).
	unchecked
)

// openProjection is every command's way to the store: it checks the
// settings (exit 2 when they are wrong), then connects, and migrates or
// checks that the projection exists as acc says. A projection that must
// exist and does not is a runtime failure (exit 1) that says so.
func openProjection(ctx context.Context, url string, cfg store.Config, acc access) (*store.Store, error) {
	if strings.TrimSpace(url) == "" {
		return nil, usagef("DATABASE_URL is not set: set it or pass --database-url, e.g. postgres://user@127.0.0.1:5432/db")
	}
	var ce *store.ConfigError
	if err := store.CheckURL(url); errors.As(err, &ce) {
		return nil, usagef("DATABASE_URL is not a valid PostgreSQL connection string (want postgres://user:pass@host:port/db or key=value pairs): %v", ce.Err)
	} else if err != nil {
		return nil, err
	}
	if err := checkStoreNames(cfg.Schema, cfg.Table); err != nil {
		return nil, err
	}
	open := store.Open
	if acc == readOnly {
		open = store.OpenReadOnly
	}
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	st, err := open(cctx, url, cfg)
	if err != nil {
		return nil, err
	}
	if acc == migrated {
		if err := st.EnsureCurrent(ctx); err != nil {
			st.Close()
			return nil, err
		}
		return st, nil
	}
	if acc == unchecked {
		return st, nil
	}
	if err := st.CheckExists(ctx); err != nil {
		st.Close()
		if errors.Is(err, store.ErrNoProjection) {
			hint := ""
			if acc == readOnly {
				hint = " (check --schema and --table; nothing was created)"
			}
			return nil, fmt.Errorf("no projection %s.%s in this database%s: %w", cfg.Schema, cfg.Table, hint, err)
		}
		return nil, err
	}
	return st, nil
}

// warnUnverifiedTLS says, once at start, when databaseURL reaches a
// PostgreSQL server on another host without TLS whose certificate is
// verified ([store.TLSRisk]): what the projector writes and its fencing
// could then be read or changed on the way. It reports whether it warned.
func warnUnverifiedTLS(log *slog.Logger, databaseURL string) bool {
	risk := store.TLSRisk(databaseURL)
	if risk == "" {
		return false
	}
	log.Warn("PostgreSQL is reached without verified TLS; set sslmode=verify-full and sslrootcert=<the server's CA file> in DATABASE_URL (see docs/deploy.md)",
		"servers", risk)
	return true
}

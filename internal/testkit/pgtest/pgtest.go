package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector/projector/store"
)

// DefaultURL is the local server every machine of this project runs.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// URL is DATABASE_URL, or [DefaultURL] when it is unset.
func URL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

var (
	poolOnce sync.Once
	pool     *pgxpool.Pool
	poolErr  error
)

const howTo = "PostgreSQL is needed for this test: start the local server " +
	"(pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start) " +
	"or set DATABASE_URL to a server you can create schemas in"

// Pool returns the test binary's shared pool.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	poolOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cfg, err := pgxpool.ParseConfig(URL())
		if err != nil {
			poolErr = err
			return
		}
		cfg.MaxConns = 16
		pool, poolErr = pgxpool.NewWithConfig(ctx, cfg)
		if poolErr == nil {
			poolErr = pool.Ping(ctx)
		}
	})
	if poolErr != nil {
		t.Fatalf("%s: %v", howTo, poolErr)
	}
	return pool
}

// Schema creates a fresh, empty schema and drops it when the test ends.
func Schema(t testing.TB) string {
	t.Helper()
	p := Pool(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	if _, err := p.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create schema: %v", err)
	}
	t.Cleanup(func() {
		if os.Getenv("PGTEST_KEEP") != "" {
			t.Logf("pgtest: kept schema %s", name)
			return
		}
		if _, err := p.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("pgtest: drop schema %s: %v", name, err)
		}
	})
	return name
}

// Store returns a migrated store in a fresh schema, on the shared pool.
func Store(t testing.TB) *store.Store {
	t.Helper()
	s, err := store.New(Pool(t), store.Config{Schema: Schema(t)})
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("pgtest: migrate: %v", err)
	}
	return s
}

package store

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Config names where the read model lives.
type Config struct {
	// Schema holds every table of the projection; created if missing.
	// Default "public".
	Schema string
	// Table is the read-model table. Default "jobs". It also names the
	// projection in the positions, held and quarantine tables, so two
	// projections may share a schema.
	Table string
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// WithDefaults returns c with empty fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Schema == "" {
		c.Schema = "public"
	}
	if c.Table == "" {
		c.Table = "jobs"
	}
	return c
}

// Validate reports a schema or table name that is not a plain identifier.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if !identRE.MatchString(c.Schema) {
		return fmt.Errorf("schema %q: must be a plain identifier (letters, digits, _; at most 63 bytes)", c.Schema)
	}
	if !identRE.MatchString(c.Table) {
		return fmt.Errorf("table %q: must be a plain identifier (letters, digits, _; at most 63 bytes)", c.Table)
	}
	return nil
}

// Store is the projection's PostgreSQL side.
type Store struct {
	pool       *pgxpool.Pool
	ownPool    bool
	schema     string
	projection string
	// quoted, qualified table names
	jobs, partitions, quarantine, held, tombstones string
	// lockClass keys the projection's job lock stripes (see lockJobs).
	lockClass int32
}

// Open connects to databaseURL and returns a Store that closes the pool on
// [Store.Close].
func Open(ctx context.Context, databaseURL string, cfg Config) (*Store, error) {
	pcfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("store: DATABASE_URL is not a valid PostgreSQL connection string: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("store: connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: connect to %s: %w", redact(pcfg.ConnConfig), err)
	}
	s, err := New(pool, cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.ownPool = true
	return s, nil
}

// New wraps an existing pool; [Store.Close] leaves it open.
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	cfg = cfg.WithDefaults()
	q := func(name string) string { return pgx.Identifier{cfg.Schema, name}.Sanitize() }
	return &Store{
		pool:       pool,
		schema:     cfg.Schema,
		projection: cfg.Table,
		jobs:       q(cfg.Table),
		partitions: q("projector_partitions"),
		quarantine: q("projector_quarantine"),
		held:       q("projector_held"),
		tombstones: q("projector_tombstones"),
		lockClass:  lockClassOf(cfg.Schema, cfg.Table),
	}, nil
}

// Close releases the pool if the Store opened it.
func (s *Store) Close() {
	if s.ownPool {
		s.pool.Close()
	}
}

// Pool is the underlying pool, for tools that read the model directly.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Projection is the name positions, held rows and quarantine are kept under.
func (s *Store) Projection() string { return s.projection }

// JobsTable is the quoted, schema-qualified read-model table.
func (s *Store) JobsTable() string { return s.jobs }

// Migrate creates the schema and tables, idempotently. Two instances
// starting at once are serialised by an advisory lock held for the
// migration transaction.
func (s *Store) Migrate(ctx context.Context) error {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('projector.migrate'))`); err != nil {
		return fmt.Errorf("store: migrate: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{s.schema}.Sanitize()); err != nil {
		return fmt.Errorf("store: migrate: create schema %s: %w", s.schema, err)
	}
	mig := pgx.Identifier{s.schema, "projector_migrations"}.Sanitize()
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+mig+` (
		projection text NOT NULL, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (projection, name))`); err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	for _, name := range names {
		var done bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+mig+` WHERE projection = $1 AND name = $2)`,
			s.projection, name).Scan(&done); err != nil {
			return fmt.Errorf("store: migrate %s: %w", name, err)
		}
		if done {
			continue
		}
		body, err := migrations.ReadFile(name)
		if err != nil {
			return err
		}
		sql := strings.NewReplacer(
			"{{schema}}", pgx.Identifier{s.schema}.Sanitize(),
			"{{jobs}}", pgx.Identifier{s.projection}.Sanitize(),
		).Replace(string(body))
		if _, err := tx.Exec(ctx, sql); err != nil {
			return fmt.Errorf("store: migrate %s: %w", name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+mig+` (projection, name) VALUES ($1, $2)`, s.projection, name); err != nil {
			return fmt.Errorf("store: migrate %s: %w", name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("store: migrate: commit: %w", err)
	}
	return nil
}

func redact(c *pgx.ConnConfig) string {
	return fmt.Sprintf("%s@%s:%d/%s", c.User, c.Host, c.Port, c.Database)
}

// IsBadData reports whether PostgreSQL refused a batch for its data (SQLSTATE
// class 22, data exception, or 54, program limit exceeded): retrying the
// same batch would fail the same way, so the caller must find the record
// that carries the data and quarantine it.
func IsBadData(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "54")
	}
	return false
}

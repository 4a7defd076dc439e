package store

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

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
	// Notify announces every write on the projection's [Store.Channel],
	// whether or not a waiter holds a lease (see [Store.HoldWaitLease]).
	// Off, a write is announced only while some process's waiters hold
	// one: NOTIFY serializes committing transactions on a lock of the
	// whole server, so a projection nobody waits on should not pay for
	// it. Turn it on for clients that LISTEN on the channel themselves
	// without holding a lease (a role that may not write
	// projector_wait_leases).
	Notify bool

	// Bounds on the transactions that hold a partition's row lock, so a
	// frozen or cut-off owner cannot hold its partition for ever (see
	// docs/guide/troubleshoot.md, "Bounds on a stuck owner").
	//
	// ClaimLockTimeout bounds one claim's wait for the partition row
	// (lock_timeout); the claim fails with a *[ClaimWaitError] and the
	// caller retries. Default 2s.
	ClaimLockTimeout time.Duration
	// IdleInTransactionTimeout makes PostgreSQL end a batch transaction
	// whose client sent nothing for this long
	// (idle_in_transaction_session_timeout): a frozen owner's locks are
	// released. Default 10s.
	IdleInTransactionTimeout time.Duration
	// StatementTimeout bounds each statement of a batch transaction
	// (statement_timeout). Default 1m.
	StatementTimeout time.Duration
}

// Name rules. Tables and schemas are lower-case identifiers, so the name
// given is the name PostgreSQL shows unquoted. A table is at most
// MaxTableBytes, which leaves room for the names the projector derives from
// it (a rebuild's shadow under [ReservedPrefix]) within PostgreSQL's 63.
const (
	MaxTableBytes  = 40
	MaxSchemaBytes = 63
	// ReservedPrefix starts the projector's own tables (positions, held
	// deltas, quarantine, migrations, rebuild shadows): no read-model table
	// may take it.
	ReservedPrefix = "projector_"
)

var (
	lowerIdentRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
)

// WithDefaults returns c with empty fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Schema == "" {
		c.Schema = "public"
	}
	if c.Table == "" {
		c.Table = "jobs"
	}
	if c.ClaimLockTimeout == 0 {
		c.ClaimLockTimeout = 2 * time.Second
	}
	if c.IdleInTransactionTimeout == 0 {
		c.IdleInTransactionTimeout = 10 * time.Second
	}
	if c.StatementTimeout == 0 {
		c.StatementTimeout = time.Minute
	}
	return c
}

// Validate reports a schema or table name the read model cannot take: not
// a lower-case identifier, too long, or a table in the reserved prefix.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if err := checkName("schema", c.Schema, MaxSchemaBytes); err != nil {
		errs = append(errs, err)
	}
	if err := checkName("table", c.Table, MaxTableBytes); err != nil {
		errs = append(errs, err)
	} else if strings.HasPrefix(c.Table, ReservedPrefix) {
		errs = append(errs, fmt.Errorf("table %q: the prefix %q is reserved for the projector's own tables; choose another name", c.Table, ReservedPrefix))
	}
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"ClaimLockTimeout", c.ClaimLockTimeout}, {"IdleInTransactionTimeout", c.IdleInTransactionTimeout}, {"StatementTimeout", c.StatementTimeout}} {
		if d.d < time.Millisecond {
			errs = append(errs, fmt.Errorf("%s %s: must be at least 1ms", d.name, d.d))
		}
	}
	return errors.Join(errs...)
}

func checkName(what, name string, maxBytes int) error {
	switch {
	case len(name) > maxBytes:
		return fmt.Errorf("%s %q: %d bytes, at most %d allowed", what, name, len(name), maxBytes)
	case !lowerIdentRE.MatchString(name):
		return fmt.Errorf("%s %q: must be a lower-case identifier (a-z, 0-9 and _, not starting with a digit), e.g. %s",
			what, name, map[string]string{"schema": "public", "table": "jobs"}[what])
	}
	return nil
}

// Store is the projection's PostgreSQL side.
type Store struct {
	pool    *pgxpool.Pool
	ownPool bool
	// directQuery: the pool's connections trace their queries or do not
	// prepare and cache statements, so a batch's statements go through
	// tx.Query rather than [queryEncoded].
	directQuery bool
	schema      string
	projection  string
	// quoted, qualified table names
	jobs, partitions, quarantine, held, tombstones, gapLog, identity string
	// lockClass keys the projection's job lock stripes (see lockJobs).
	lockClass int32
	// channel is where every committed batch is announced ([Store.Channel]).
	channel string
	// leases is the table of waiters' leases; notifyAlways announces
	// writes whether or not a lease is live ([Config.Notify]).
	leases       string
	notifyAlways bool
	// bounds of the transactions that lock a partition row
	claimLockTimeout, idleTimeout, statementTimeout time.Duration
}

// Open connects to databaseURL and returns a Store that closes the pool on
// [Store.Close].
func Open(ctx context.Context, databaseURL string, cfg Config) (*Store, error) {
	pool, err := OpenPool(ctx, databaseURL)
	if err != nil {
		return nil, err
	}
	s, err := New(pool, cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.ownPool = true
	return s, nil
}

// DefaultMaxConns is the pool size [OpenPool] uses unless the URL sets
// pool_max_conns. Every partition an instance owns writes its batches on a
// connection of its own, beside the gap attempts and the monitors;
// pgxpool's default (4, or the CPU count) left partition workers waiting
// for a connection while others committed.
const DefaultMaxConns = 16

// ConfigError is a setting the store cannot use, found before anything
// connected: the caller's to fix, not an outage.
type ConfigError struct {
	// Setting names what is wrong, e.g. "DATABASE_URL".
	Setting string
	// Problem says what is wrong with it.
	Problem string
	Err     error
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("store: %s %s: %v", e.Setting, e.Problem, e.Err)
}

func (e *ConfigError) Unwrap() error { return e.Err }

// CheckURL reports, as a *[ConfigError], a databaseURL that is not a
// PostgreSQL connection string; it connects to nothing. An empty one is
// valid (libpq's defaults and PG* variables apply).
func CheckURL(databaseURL string) error {
	_, err := parseURL(databaseURL)
	return err
}

func parseURL(databaseURL string) (*pgxpool.Config, error) {
	pcfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, &ConfigError{Setting: "DATABASE_URL", Problem: "is not a valid PostgreSQL connection string", Err: err}
	}
	return pcfg, nil
}

// OpenPool connects to databaseURL with the projector's pool settings.
func OpenPool(ctx context.Context, databaseURL string) (*pgxpool.Pool, error) {
	pcfg, err := parseURL(databaseURL)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(databaseURL, "pool_max_conns") {
		pcfg.MaxConns = max(pcfg.MaxConns, DefaultMaxConns)
	}
	return connect(ctx, pcfg)
}

// OpenPoolOf connects to databaseURL with a pool of at most maxConns
// connections, whatever the URL says: for readers apart from the
// projector's batches (the waiters of /wait), whose queries can then
// never take a connection a batch needs.
func OpenPoolOf(ctx context.Context, databaseURL string, maxConns int32) (*pgxpool.Pool, error) {
	pcfg, err := parseURL(databaseURL)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns, pcfg.MinConns = maxConns, 0
	return connect(ctx, pcfg)
}

func connect(ctx context.Context, pcfg *pgxpool.Config) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("store: connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: connect to %s: %w", redact(pcfg.ConnConfig), err)
	}
	return pool, nil
}

// New wraps an existing pool; [Store.Close] leaves it open.
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return newStore(pool, cfg.WithDefaults()), nil
}

// newStore builds a Store for cfg without the user-facing checks of
// [Config.Validate]: the rebuild's shadow lives under the reserved
// projector_ prefix that users may not name.
func newStore(pool *pgxpool.Pool, cfg Config) *Store {
	cfg = cfg.WithDefaults()
	q := func(name string) string { return pgx.Identifier{cfg.Schema, name}.Sanitize() }
	direct := false
	if pool != nil { // nil: a store only described, never run (the references)
		cc := pool.Config().ConnConfig
		direct = cc.Tracer != nil || cc.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement
	}
	return &Store{
		directQuery:      direct,
		claimLockTimeout: cfg.ClaimLockTimeout,
		idleTimeout:      cfg.IdleInTransactionTimeout,
		statementTimeout: cfg.StatementTimeout,
		pool:             pool,
		schema:           cfg.Schema,
		projection:       cfg.Table,
		jobs:             q(cfg.Table),
		partitions:       q("projector_partitions"),
		quarantine:       q("projector_quarantine"),
		held:             q("projector_held"),
		tombstones:       q("projector_tombstones"),
		lockClass:        lockClassOf(cfg.Schema, cfg.Table),
		channel:          channelOf(cfg.Schema, cfg.Table),
		gapLog:           q("projector_gap_log"),
		identity:         q("projector_identity"),
		leases:           q("projector_wait_leases"),
		notifyAlways:     cfg.Notify,
	}
}

// Close releases the pool if the Store opened it.
func (s *Store) Close() {
	if s.ownPool {
		s.pool.Close()
	}
}

// Pool is the underlying pool, for tools that read the model directly.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// StatementTimeout bounds each statement of a batch transaction (see
// [Config]); a caller bounding the whole transaction leaves room for it.
func (s *Store) StatementTimeout() time.Duration { return s.statementTimeout }

// Projection is the name positions, held rows and quarantine are kept under.
func (s *Store) Projection() string { return s.projection }

// JobsTable is the quoted, schema-qualified read-model table.
func (s *Store) JobsTable() string { return s.jobs }

// migrateLock serialises what changes a schema's tables (migrations, a
// rebuild's reset and swap) among the instances that share the schema.
// It is keyed by the schema, so a long swap in one schema never holds up
// an instance of another schema starting (its migration waited on one
// database-wide key before).
const migrateLock = `SELECT pg_advisory_xact_lock(hashtextextended('projector.migrate:' || $1, 0))`

// Migrate creates the schema and tables, idempotently. Two instances
// starting at once are serialised by an advisory lock held for the
// migration transaction.
func (s *Store) Migrate(ctx context.Context) error {
	tx, err := s.pool.BeginTx(ctx, readCommitted)
	if err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, migrateLock, s.schema); err != nil {
		return fmt.Errorf("store: migrate: lock: %w", err)
	}
	if err := migrateIn(ctx, tx, s.schema, s.projection); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("store: migrate: commit: %w", err)
	}
	return nil
}

// Pending returns the migrations this version has that the projection has
// not had yet, in order; all of them for a projection that does not
// exist. It reads and changes nothing else, and needs no more than
// SELECT on projector_migrations.
func (s *Store) Pending(ctx context.Context) ([]string, error) {
	names, err := migrationNames()
	if err != nil {
		return nil, err
	}
	mig := pgx.Identifier{s.schema, "projector_migrations"}.Sanitize()
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, mig).Scan(&exists); err != nil {
		return nil, fmt.Errorf("store: pending migrations: %w", err)
	}
	if !exists {
		return names, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT name FROM `+mig+` WHERE projection = $1`, s.projection)
	if err != nil {
		return nil, fmt.Errorf("store: pending migrations: %w", err)
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: pending migrations: %w", err)
	}
	var pending []string
	for _, n := range names {
		if !slices.Contains(done, n) {
			pending = append(pending, n)
		}
	}
	return pending, nil
}

// BehindError is a projection whose schema is behind this version, that
// this connection may not migrate: the owner must run the migrations.
type BehindError struct {
	Schema, Table string
	// Pending names the migrations not yet run; New says they are all
	// of them: the projection does not exist.
	Pending []string
	New     bool
	Err     error
}

func (e *BehindError) Error() string {
	if e.New {
		return fmt.Sprintf("there is no projection %s.%s yet, and this role may not create it (%v): check --schema and --table; to create it, run `projector migrate --schema %s --table %s` as the role that will own the tables",
			e.Schema, e.Table, e.Err, e.Schema, e.Table)
	}
	names := make([]string, len(e.Pending))
	for i, p := range e.Pending {
		names[i] = MigrationName(p)
	}
	return fmt.Sprintf("the tables of %s.%s are behind this version (migrations not run: %s) and this role may not migrate them (%v): run `projector migrate --schema %s --table %s` as the tables' owner, then start again",
		e.Schema, e.Table, strings.Join(names, ", "), e.Err, e.Schema, e.Table)
}

// MigrationName is a migration as people name it: 009_log_identity.
func MigrationName(path string) string {
	return strings.TrimSuffix(strings.TrimPrefix(path, "migrations/"), ".sql")
}

func (e *BehindError) Unwrap() error { return e.Err }

// EnsureCurrent makes the projection's tables current: nothing at all when
// every migration has run (a role with DML rights alone suffices), else it
// migrates; a role that may not is a *[BehindError] naming what to run.
func (s *Store) EnsureCurrent(ctx context.Context) error {
	pending, err := s.Pending(ctx)
	if err != nil {
		return err
	}
	if len(pending) == 0 {
		return s.checkPrivileges(ctx)
	}
	err = s.Migrate(ctx)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		names, _ := migrationNames()
		return &BehindError{Schema: s.schema, Table: s.projection, Pending: pending, New: len(pending) == len(names), Err: err}
	}
	return err
}

// PrivilegeError is a role that lacks rights a projector needs on the
// projection's tables: it would fail at its first write of that kind.
type PrivilegeError struct {
	Schema, Table string
	// Missing names each table or sequence and what is missing on it.
	Missing []string
	// Grants are the statements that give them.
	Grants []string
}

func (e *PrivilegeError) Error() string {
	return fmt.Sprintf("this role lacks rights on the tables of %s.%s (%s); as their owner, run: %s",
		e.Schema, e.Table, strings.Join(e.Missing, "; "), strings.Join(e.Grants, " "))
}

// checkPrivileges says which of the rights a projector needs the role
// lacks: SELECT, INSERT, UPDATE and DELETE on the read model and the
// projector's tables, USAGE on their sequences. Without it a missing
// grant (a table a later migration added, without default privileges)
// showed as a database outage retried for ever.
func (s *Store) checkPrivileges(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `SELECT c.relname::text, c.relkind::text,
			has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'INSERT'),
			has_table_privilege(c.oid, 'UPDATE'), has_table_privilege(c.oid, 'DELETE'),
			c.relkind = 'S' AND has_sequence_privilege(c.oid, 'USAGE')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'S')
			AND (c.relname = $2 OR (c.relname LIKE 'projector\_%'
				AND c.relname NOT LIKE 'projector\_rebuild\_%' AND c.relname NOT LIKE 'projector\_old\_%'))
		ORDER BY 1`, s.schema, s.projection)
	if err != nil {
		return fmt.Errorf("store: check privileges: %w", err)
	}
	var e PrivilegeError
	var name, kind string
	var sel, ins, upd, del, usage bool
	if _, err := pgx.ForEachRow(rows, []any{&name, &kind, &sel, &ins, &upd, &del, &usage}, func() error {
		q := pgx.Identifier{s.schema, name}.Sanitize()
		if kind == "S" {
			if !usage {
				e.Missing = append(e.Missing, name+": USAGE")
				e.Grants = append(e.Grants, "GRANT USAGE, SELECT ON SEQUENCE "+q+" TO current_role_name;")
			}
			return nil
		}
		var lack []string
		for _, p := range []struct {
			ok   bool
			name string
		}{{sel, "SELECT"}, {ins, "INSERT"}, {upd, "UPDATE"}, {del, "DELETE"}} {
			if !p.ok {
				lack = append(lack, p.name)
			}
		}
		if len(lack) > 0 {
			e.Missing = append(e.Missing, name+": "+strings.Join(lack, ", "))
			e.Grants = append(e.Grants, "GRANT SELECT, INSERT, UPDATE, DELETE ON "+q+" TO current_role_name;")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("store: check privileges: %w", err)
	}
	if len(e.Missing) == 0 {
		return nil
	}
	var role string
	if err := s.pool.QueryRow(ctx, `SELECT current_user`).Scan(&role); err == nil {
		for i := range e.Grants {
			e.Grants[i] = strings.Replace(e.Grants[i], "current_role_name", pgx.Identifier{role}.Sanitize(), 1)
		}
	}
	e.Schema, e.Table = s.schema, s.projection
	return &e
}

func migrationNames() ([]string, error) {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	return names, nil
}

// migrateIn applies the migrations not yet applied to projection in
// schema, inside tx.
func migrateIn(ctx context.Context, tx pgx.Tx, schema, projection string) error {
	names, err := migrationNames()
	if err != nil {
		return err
	}
	// CREATE SCHEMA IF NOT EXISTS needs the right to create schemas even
	// when the schema exists: a tables' owner may not have it.
	var schemaExists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&schemaExists); err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	if !schemaExists {
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{schema}.Sanitize()); err != nil {
			return fmt.Errorf("store: migrate: create schema %s: %w", schema, err)
		}
	}
	mig := pgx.Identifier{schema, "projector_migrations"}.Sanitize()
	var migExists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, mig).Scan(&migExists); err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	if migExists {
		// Another instance may have migrated while this one waited for
		// the lock: with nothing left, no DDL at all (a role with DML
		// rights only gets here when it started during a migration).
		var left int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM unnest($2::text[]) AS n(name)
			WHERE NOT EXISTS (SELECT 1 FROM `+mig+` AS m WHERE m.projection = $1 AND m.name = n.name)`,
			projection, names).Scan(&left); err != nil {
			return fmt.Errorf("store: migrate: %w", err)
		}
		if left == 0 {
			return nil
		}
	} else if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+mig+` (
		projection text NOT NULL, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (projection, name))`); err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	for _, name := range names {
		var done bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+mig+` WHERE projection = $1 AND name = $2)`,
			projection, name).Scan(&done); err != nil {
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
			"{{schema}}", pgx.Identifier{schema}.Sanitize(),
			"{{jobs}}", pgx.Identifier{projection}.Sanitize(),
		).Replace(string(body))
		if _, err := tx.Exec(ctx, sql); err != nil {
			return fmt.Errorf("store: migrate %s: %w", name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+mig+` (projection, name) VALUES ($1, $2)`, projection, name); err != nil {
			return fmt.Errorf("store: migrate %s: %w", name, err)
		}
	}
	return nil
}

func redact(c *pgx.ConnConfig) string {
	return fmt.Sprintf("%s@%s:%d/%s", c.User, c.Host, c.Port, c.Database)
}

// IsBadData reports whether PostgreSQL refused a batch for its data: SQLSTATE
// class 22 (data exception), 54 (program limit exceeded), or 23 (integrity
// constraint violation) raised by a constraint a user put on the read model,
// such as a CHECK added to the jobs table. Retrying the same batch would
// fail the same way, so the caller must find the record that carries the
// data and quarantine it. A class 23 error from the projector's own tables
// (projector_*) is not the record's fault: it is retried like any failure;
// a rebuild's shadow (projector_rebuild_*) is a read model, carrying the
// checks users put on the live one.
func IsBadData(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code[:min(2, len(pgErr.Code))] {
	case "22", "54":
		return true
	case "23":
		return !strings.HasPrefix(pgErr.TableName, "projector_") || strings.HasPrefix(pgErr.TableName, ShadowPrefix)
	}
	return false
}

// IsStatementTimeout reports whether PostgreSQL cancelled a statement for
// running past the statement timeout (SQLSTATE 57014, as the server words
// it): not an outage, and a retry of the same batch may meet it again.
func IsStatementTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014" && strings.Contains(pgErr.Message, "statement timeout")
}

// Refusal is the quarantine reason of a record PostgreSQL refused: the
// server's own message and SQLSTATE, without the operation that carried it,
// so the same refusal always reads the same, live or on replay.
func Refusal(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Sprintf("refused by PostgreSQL: %s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
	}
	return "refused by PostgreSQL: " + err.Error()
}

// readCommitted is the isolation every write transaction sets, whatever
// the server's default_transaction_isolation: the fence and the version
// conditions are argued under it (docs/design.md).
var readCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// IsUnreachable reports whether err is the server not answering (refused,
// cut, timed out) rather than an answer that refuses this projector (wrong
// password, missing database, no privilege): the first is worth waiting
// out, the second is a configuration to fix.
func IsUnreachable(err error) bool {
	var priv *PrivilegeError
	if errors.As(err, &priv) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// An answer from the server: only "starting up" or "too many
		// connections" pass with time.
		return pgErr.Code == "57P03" || pgErr.Code == "53300"
	}
	return true
}

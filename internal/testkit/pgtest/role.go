package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
)

// DMLRole creates a login role with SELECT, INSERT, UPDATE and DELETE on
// schema's tables and USAGE on its sequences, nothing more (what
// docs/deploy.md grants `run`), and returns its name and a connection
// string for it. The role is dropped when the test ends.
func DMLRole(t testing.TB, schema string) (role, databaseURL string) {
	t.Helper()
	ctx := context.Background()
	var b [4]byte
	_, _ = rand.Read(b[:])
	role = "dml_" + hex.EncodeToString(b[:])
	pool := Pool(t)
	s, r := pgx.Identifier{schema}.Sanitize(), pgx.Identifier{role}.Sanitize()
	for _, sql := range []string{
		`CREATE ROLE ` + r + ` LOGIN`,
		`GRANT USAGE ON SCHEMA ` + s + ` TO ` + r,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ` + s + ` TO ` + r,
		`GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA ` + s + ` TO ` + r,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("pgtest: %s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		for _, sql := range []string{`DROP OWNED BY ` + r, `DROP ROLE ` + r} {
			if _, err := pool.Exec(context.WithoutCancel(ctx), sql); err != nil {
				t.Errorf("pgtest: %s: %v", sql, err)
			}
		}
	})
	u, err := url.Parse(URL())
	if err != nil {
		t.Fatalf("pgtest: DATABASE_URL: %v", err)
	}
	u.User = url.User(role)
	return role, u.String()
}

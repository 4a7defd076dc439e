package faulttest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// auditTable keeps every change of the read model and of the tombstones,
// in the order PostgreSQL made them: a job's changes are ordered by its row
// lock, so their sequence numbers follow their commits.
const auditSQL = `
CREATE TABLE IF NOT EXISTS {{schema}}.faulttest_audit (
    seq         bigserial   PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    xid         bigint      NOT NULL DEFAULT txid_current(),
    tbl         text        NOT NULL,
    op          text        NOT NULL,
    job_id      text        NOT NULL,
    old_version bigint,
    new_version bigint,
    new_state   jsonb
);
CREATE OR REPLACE FUNCTION {{schema}}.faulttest_audit() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END;
    n jsonb := CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END;
BEGIN
    INSERT INTO {{schema}}.faulttest_audit (tbl, op, job_id, old_version, new_version, new_state)
    VALUES (TG_TABLE_NAME, TG_OP, coalesce(n->>'job_id', o->>'job_id'),
            (o->>'version')::bigint, (n->>'version')::bigint, n->'state');
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS faulttest_audit ON {{schema}}.{{jobs}};
CREATE TRIGGER faulttest_audit AFTER INSERT OR UPDATE OR DELETE ON {{schema}}.{{jobs}}
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.faulttest_audit();
DROP TRIGGER IF EXISTS faulttest_audit ON {{schema}}.projector_tombstones;
CREATE TRIGGER faulttest_audit AFTER INSERT OR UPDATE OR DELETE ON {{schema}}.projector_tombstones
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.faulttest_audit();
`

// installAudit puts the audit trigger on the read model and the tombstones
// of schema; the tables must exist (migrate first).
func installAudit(ctx context.Context, pool *pgxpool.Pool, schema, table string) error {
	sql := strings.NewReplacer(
		"{{schema}}", pgx.Identifier{schema}.Sanitize(),
		"{{jobs}}", pgx.Identifier{table}.Sanitize(),
	).Replace(auditSQL)
	if _, err := pool.Exec(ctx, sql); err != nil {
		return fmt.Errorf("faulttest: install audit in %s: %w", schema, err)
	}
	return nil
}

// change is one audited change.
type change struct {
	seq        int64
	table      string // the read model, or projector_tombstones
	op         string // INSERT, UPDATE, DELETE
	job        string
	oldVersion *int64
	newVersion *int64
	state      json.RawMessage
}

func (c change) tombstone() bool { return c.table == "projector_tombstones" }

func readAudit(ctx context.Context, pool *pgxpool.Pool, schema string) ([]change, error) {
	rows, err := pool.Query(ctx, `SELECT seq, tbl, op, job_id, old_version, new_version, new_state
		FROM `+pgx.Identifier{schema, "faulttest_audit"}.Sanitize()+` ORDER BY seq`)
	if err != nil {
		return nil, fmt.Errorf("faulttest: read audit: %w", err)
	}
	var out []change
	for rows.Next() {
		var c change
		if err := rows.Scan(&c.seq, &c.table, &c.op, &c.job, &c.oldVersion, &c.newVersion, &c.state); err != nil {
			return nil, fmt.Errorf("faulttest: read audit: %w", err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

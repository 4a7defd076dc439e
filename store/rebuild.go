package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// ShadowPrefix names a projection's rebuild table: jobs →
// projector_rebuild_jobs. It lies inside the projector_ prefix that users
// may not name a table with, so a rebuild never touches another projection.
const ShadowPrefix = "projector_rebuild_"

// ShadowName is the name of the rebuild table of the projection table.
func ShadowName(table string) string { return ShadowPrefix + table }

// Shadow returns the store of s's rebuild table in the same schema, on the
// same pool.
func (s *Store) Shadow() (*Store, error) {
	name := ShadowName(s.projection)
	if len(name) > maxIdent {
		return nil, fmt.Errorf("store: table %q is too long for its rebuild table %q (PostgreSQL names have at most %d bytes)", s.projection, name, maxIdent)
	}
	return newStore(s.pool, Config{Schema: s.schema, Table: name}), nil
}

// maxIdent is PostgreSQL's longest identifier, in bytes.
const maxIdent = 63

// Reset drops the projection's table and forgets its positions, held
// deltas, quarantine and migrations: a rebuild starts from nothing.
func (s *Store) Reset(ctx context.Context) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('projector.migrate'))`); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.partitions).Scan(&exists); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DROP TABLE IF EXISTS `+s.jobs); err != nil {
			return fmt.Errorf("store: reset %s: %w", s.projection, err)
		}
		if !exists {
			return nil
		}
		for _, t := range []string{s.partitions, s.held, s.quarantine, pgx.Identifier{s.schema, "projector_migrations"}.Sanitize()} {
			if _, err := tx.Exec(ctx, `DELETE FROM `+t+` WHERE projection = $1`, s.projection); err != nil {
				return fmt.Errorf("store: reset %s: %w", s.projection, err)
			}
		}
		return nil
	})
}

// SwapResult says what a swap did.
type SwapResult struct {
	// OldTable is where the previous read model went, when kept.
	OldTable string
}

// Swap makes the shadow the live projection in one transaction: the
// shadow table takes the live table's name, its positions, held deltas and
// quarantine take the live projection's, and every partition's epoch moves
// past both, which fences any instance still running on the old read model
// (it claims again and continues from the shadow's positions). Readers see
// the old model or the new one, never a mix.
func (s *Store) Swap(ctx context.Context, shadow *Store, keepOld bool) (SwapResult, error) {
	var res SwapResult
	live, sh := s.projection, shadow.projection
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		exec := func(sql string, args ...any) error {
			if _, err := tx.Exec(ctx, sql, args...); err != nil {
				return fmt.Errorf("store: swap %s into %s: %w", sh, live, err)
			}
			return nil
		}
		// The primary keys' names as PostgreSQL chose them (it truncates
		// long ones), so the rebuilt table can take over the live one's.
		pkey := func(table string) (string, error) {
			var name string
			err := tx.QueryRow(ctx, `SELECT conname FROM pg_constraint WHERE conrelid = to_regclass($1) AND contype = 'p'`, table).Scan(&name)
			if err != nil {
				return "", fmt.Errorf("store: swap: primary key of %s: %w", table, err)
			}
			return name, nil
		}
		if err := exec(`SELECT pg_advisory_xact_lock(hashtext('projector.migrate'))`); err != nil {
			return err
		}
		// Positions first, in the order a batch takes its locks (position,
		// then rows): this waits for batches and claims in flight, so the
		// epochs read below are final, and never deadlocks with them.
		if err := exec(`SELECT 1 FROM `+s.partitions+` WHERE projection IN ($1, $2) ORDER BY projection, topic, partition FOR UPDATE`, live, sh); err != nil {
			return err
		}
		if err := exec(`LOCK TABLE ` + s.jobs + `, ` + shadow.jobs + ` IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		livePK, err := pkey(s.jobs)
		if err != nil {
			return err
		}
		shadowPK, err := pkey(shadow.jobs)
		if err != nil {
			return err
		}
		if keepOld {
			suffix := "_before_" + strconv.FormatInt(time.Now().UnixNano(), 36)
			kept := live[:min(len(live), 63-len(suffix))] + suffix
			keptPK := kept[:min(len(kept), 63-len("_pkey"))] + "_pkey"
			res.OldTable = s.schema + "." + kept
			if err := exec(`ALTER TABLE ` + s.jobs + ` RENAME TO ` + pgx.Identifier{kept}.Sanitize()); err != nil {
				return err
			}
			if err := exec(`ALTER TABLE ` + pgx.Identifier{s.schema, kept}.Sanitize() + ` RENAME CONSTRAINT ` +
				pgx.Identifier{livePK}.Sanitize() + ` TO ` + pgx.Identifier{keptPK}.Sanitize()); err != nil {
				return err
			}
		} else if err := exec(`DROP TABLE ` + s.jobs); err != nil {
			return err
		}
		for _, st := range []struct {
			sql  string
			args []any
		}{
			{`ALTER TABLE ` + shadow.jobs + ` RENAME TO ` + pgx.Identifier{live}.Sanitize(), nil},
			{`ALTER TABLE ` + s.jobs + ` RENAME CONSTRAINT ` + pgx.Identifier{shadowPK}.Sanitize() + ` TO ` + pgx.Identifier{livePK}.Sanitize(), nil},
			// Epochs move past both the live and the shadow owners'.
			{`UPDATE ` + s.partitions + ` AS p SET epoch = greatest(p.epoch, coalesce((SELECT max(o.epoch) FROM ` + s.partitions + ` o
				WHERE o.projection = $1 AND o.topic = p.topic AND o.partition = p.partition), 0)) + 1,
				owner = 'rebuild', updated_at = now() WHERE p.projection = $2`, []any{live, sh}},
			{`DELETE FROM ` + s.partitions + ` WHERE projection = $1`, []any{live}},
			{`UPDATE ` + s.partitions + ` SET projection = $1 WHERE projection = $2`, []any{live, sh}},
			{`DELETE FROM ` + s.held + ` WHERE projection = $1`, []any{live}},
			{`UPDATE ` + s.held + ` SET projection = $1 WHERE projection = $2`, []any{live, sh}},
			{`DELETE FROM ` + s.quarantine + ` WHERE projection = $1`, []any{live}},
			{`UPDATE ` + s.quarantine + ` SET projection = $1 WHERE projection = $2`, []any{live, sh}},
			{`DELETE FROM ` + pgx.Identifier{s.schema, "projector_migrations"}.Sanitize() + ` WHERE projection = $1`, []any{sh}},
		} {
			if err := exec(st.sql, st.args...); err != nil {
				return err
			}
		}
		return nil
	})
	return res, err
}

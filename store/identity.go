package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Identity is who a projection is, wherever its instances meet others
// outside PostgreSQL: every instance of one projection (one database, schema
// and table) reads the same ID, and no other projection has it.
type Identity struct {
	// ID is the projection's, made when it first recorded where it reads.
	ID string
	// Name is how people name it: database, schema and table.
	Name string
}

// ConsumerSource says which of a projection's recorded consumers is meant.
type ConsumerSource int

// The sources a projection records its consumer for.
const (
	// KafkaGroup is the Kafka consumer group its instances join.
	KafkaGroup ConsumerSource = iota
	// SQSQueue is the SQS queue its instances receive from.
	SQSQueue
)

func (c ConsumerSource) column() string {
	if c == SQSQueue {
		return "sqs_queue"
	}
	return "kafka_group"
}

// Consumer is what [Store.RecordConsumer] decided.
type Consumer struct {
	// Name is the consumer group (or queue) the instance uses.
	Name string
	// Previous is the one recorded before, when Name replaced it.
	Previous string
	// Legacy says Name was taken from before consumers were recorded (the
	// projection has positions but recorded none).
	Legacy   bool
	Identity Identity
}

// RecordConsumer resolves and records the consumer group or queue of the
// projection. explicit, when not empty, is what the operator asked for and
// wins (Previous then names a different one it replaced). Otherwise the
// recorded one is kept; a projection that has positions but recorded none
// ran before consumers were recorded, in legacy (the old default), and
// keeps it, so an upgrade never starts a second group beside the first;
// a new projection records fresh. Instances starting at once agree: the
// row is taken with a lock.
func (s *Store) RecordConsumer(ctx context.Context, src ConsumerSource, explicit, fresh, legacy string) (Consumer, error) {
	var c Consumer
	col := src.column()
	err := pgx.BeginTxFunc(ctx, s.pool, readCommitted, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.identity+` (projection) VALUES ($1) ON CONFLICT DO NOTHING`, s.projection); err != nil {
			return err
		}
		var recorded *string
		var db string
		if err := tx.QueryRow(ctx, `SELECT id::text, `+col+`, current_database() FROM `+s.identity+` WHERE projection = $1 FOR UPDATE`,
			s.projection).Scan(&c.Identity.ID, &recorded, &db); err != nil {
			return err
		}
		c.Identity.Name = fmt.Sprintf("%s/%s.%s", db, s.schema, s.projection)
		switch {
		case explicit != "":
			c.Name = explicit
			if recorded != nil && *recorded != explicit {
				c.Previous = *recorded
			}
		case recorded != nil:
			c.Name = *recorded
		default:
			c.Name = fresh
			if src == KafkaGroup && legacy != "" {
				// It ran before groups were recorded: it has positions, and
				// migrations older than the one that records groups ran
				// before it (a projection made since runs them all at
				// once, in one transaction).
				var ran bool
				mig := pgx.Identifier{s.schema, "projector_migrations"}.Sanitize()
				if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.partitions+` WHERE projection = $1)
					AND EXISTS (SELECT 1 FROM `+mig+` AS a JOIN `+mig+` AS b ON a.projection = b.projection
						WHERE a.projection = $1 AND b.name = $2 AND a.name < b.name AND a.applied_at < b.applied_at)`,
					s.projection, identityMigration).Scan(&ran); err != nil {
					return err
				}
				if ran {
					c.Name, c.Legacy = legacy, true
				}
			}
		}
		// Another projection of this schema that recorded the same
		// consumer would split it with this one.
		var other string
		err := tx.QueryRow(ctx, `SELECT projection FROM `+s.identity+` WHERE `+col+` = $1 AND projection <> $2 ORDER BY projection LIMIT 1`,
			c.Name, s.projection).Scan(&other)
		if err == nil {
			return &ConsumerTakenError{Consumer: c.Name, Projection: fmt.Sprintf("%s/%s.%s", db, s.schema, other)}
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if recorded != nil && *recorded == c.Name {
			return nil
		}
		_, err = tx.Exec(ctx, `UPDATE `+s.identity+` SET `+col+` = $2, updated_at = now() WHERE projection = $1`, s.projection, c.Name)
		return err
	})
	var taken *ConsumerTakenError
	if errors.As(err, &taken) {
		taken.Identity = c.Identity
		return c, taken
	}
	if err != nil {
		return Consumer{}, fmt.Errorf("store: record the consumer of %s.%s: %w", s.schema, s.projection, err)
	}
	return c, nil
}

// identityMigration is the migration that made projections record their
// consumers.
const identityMigration = "migrations/008_identity.sql"

// ConsumerTakenError is a consumer group or queue that another projection
// of the schema recorded as its own.
type ConsumerTakenError struct {
	Consumer string
	// Projection is the other one; Identity this one.
	Projection string
	Identity   Identity
}

func (e *ConsumerTakenError) Error() string {
	return fmt.Sprintf("%s is the recorded consumer of another projection, %s", e.Consumer, e.Projection)
}

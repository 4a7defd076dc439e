package projection

import (
	"context"
	"errors"
	"strings"

	"github.com/cenkalti/backoff/v4"

	"github.com/projector/projector/source"
	"github.com/projector/projector/source/kafka/kafkacfg"
	"github.com/projector/projector/source/sqs/sqscfg"
	"github.com/projector/projector/store"
)

// LegacyGroup is the consumer group every projection joined by default
// before each recorded its own ([kafkacfg.LegacyGroup]).
const LegacyGroup = kafkacfg.LegacyGroup

// DefaultGroup is the consumer group a new projection records when none
// is given: one per projection ([kafkacfg.DefaultGroup]).
func DefaultGroup(schema, table string) string { return kafkacfg.DefaultGroup(schema, table) }

// QueueOwnerTag is the SQS queue tag that names the projection whose
// instances receive from the queue (its [store.Identity] ID and name).
const QueueOwnerTag = sqscfg.OwnerTag

// GroupConflictError is a consumer group, or an SQS queue, that another
// projection's instances already work ([source.ConflictError]).
type GroupConflictError = source.ConflictError

// retryDatabase runs op until it succeeds or ctx ends, reporting each
// failure as the database's, as a worker does.
func (p *Projector) retryDatabase(ctx context.Context, op func() error) error {
	bo := retryPolicy()
	for {
		err := op()
		if err == nil {
			p.databaseAnswered()
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var perm *backoff.PermanentError
		if errors.As(err, &perm) {
			return perm.Err
		}
		d := bo.NextBackOff()
		p.databaseFailed(err, d)
		p.dbOutage.Wait(ctx, d)
	}
}

// ownGroup is a consumer group of this projection's own, to suggest: a
// rebuild's shadow names the rebuild's group.
func (p *Projector) ownGroup() string {
	st := p.cfg.Store
	if table, ok := strings.CutPrefix(st.Projection(), store.ShadowPrefix); ok {
		return "projector-rebuild-" + st.Schema() + "-" + table
	}
	return DefaultGroup(st.Schema(), st.Projection())
}

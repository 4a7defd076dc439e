package store_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// A projection keeps the consumer group it recorded; one that ran before
// groups were recorded (its migrations before the one that records them
// ran earlier, and it has positions) keeps the old default; a new one, or
// one whose first positions came from a rebuild, records its own.
func TestRecordConsumer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	record := func(s *store.Store, explicit string) (store.Consumer, error) {
		return s.RecordConsumer(ctx, store.KafkaGroup, explicit, "fresh-"+s.Projection(), "legacy")
	}

	fresh := pgtest.Store(t)
	c, err := record(fresh, "")
	require.NoError(t, err)
	require.Equal(t, "fresh-jobs", c.Name)
	require.False(t, c.Legacy)
	require.NotEmpty(t, c.Identity.ID)
	again, err := record(fresh, "")
	require.NoError(t, err)
	require.Equal(t, c, again, "the recorded group and id stay")
	moved, err := record(fresh, "other")
	require.NoError(t, err)
	require.Equal(t, "other", moved.Name)
	require.Equal(t, "fresh-jobs", moved.Previous)

	// Positions from a rebuild's swap before the first run: not legacy.
	rebuilt := pgtest.Store(t)
	_, err = rebuilt.Claim(ctx, "t", 0, "rebuild")
	require.NoError(t, err)
	c, err = record(rebuilt, "")
	require.NoError(t, err)
	require.Equal(t, "fresh-jobs", c.Name)

	old := pgtest.Store(t)
	_, err = old.Pool().Exec(ctx, `UPDATE `+old.Schema()+`.projector_migrations SET applied_at = applied_at - interval '1 day' WHERE name < 'migrations/008'`)
	require.NoError(t, err)
	_, err = old.Claim(ctx, "t", 0, "earlier")
	require.NoError(t, err)
	c, err = record(old, "")
	require.NoError(t, err)
	require.Equal(t, "legacy", c.Name)
	require.True(t, c.Legacy)

	// A second legacy projection of the schema would share that group:
	// refused, naming the first.
	second, err := store.New(old.Pool(), store.Config{Schema: old.Schema(), Table: "jobs_b"})
	require.NoError(t, err)
	require.NoError(t, second.Migrate(ctx))
	_, err = old.Pool().Exec(ctx, `UPDATE `+old.Schema()+`.projector_migrations SET applied_at = applied_at - interval '1 day' WHERE name < 'migrations/008' AND projection = 'jobs_b'`)
	require.NoError(t, err)
	_, err = second.Claim(ctx, "t", 0, "earlier")
	require.NoError(t, err)
	_, err = record(second, "")
	var taken *store.ConsumerTakenError
	require.ErrorAs(t, err, &taken)
	require.Equal(t, "legacy", taken.Consumer)
	require.Contains(t, taken.Projection, old.Schema()+".jobs")
	require.Contains(t, taken.Identity.Name, old.Schema()+".jobs_b")
	_, err = record(second, "legacy")
	require.ErrorAs(t, err, &taken, "given explicitly too")
}

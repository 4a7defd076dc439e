package projection

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// secondTable is another projection (table) in the rig's schema.
func (r *rig) secondTable(table string) *store.Store {
	r.t.Helper()
	s, err := store.New(pgtest.Pool(r.t), store.Config{Schema: r.store.Schema(), Table: table})
	require.NoError(r.t, err)
	require.NoError(r.t, s.Migrate(context.Background()))
	return s
}

func countRows(t *testing.T, s *store.Store) int {
	t.Helper()
	var n int
	require.NoError(t, s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM `+s.JobsTable()).Scan(&n))
	return n
}

func (r *rig) produceJobs(prefix string, n int) {
	r.t.Helper()
	recs := make([]rec, n)
	for i := range recs {
		recs[i] = rec{partition: i % r.parts, key: fmt.Sprint(prefix, i), value: snap(fmt.Sprint(prefix, i), 1, `{}`)}
	}
	r.produce(recs...)
}

// waitRun waits for an engine's Run to return by itself and returns its
// error.
func waitRun(t *testing.T, run *running, within time.Duration) error {
	t.Helper()
	select {
	case err := <-run.done:
		run.done <- nil // halt at cleanup finds it returned
		return err
	case <-time.After(within):
		t.Fatalf("Run did not return within %s", within)
		return nil
	}
}

// Two projections (two tables) given one consumer group used to split the
// topic's partitions between them: each model got half the jobs, and
// both instances said they were ready. The newcomer is refused, naming
// both projections, and the projection that held the group goes on. The
// two are in different schemas here (as they could be in different
// databases): only the group's members tell them apart.
func TestAProjectionJoiningAnotherProjectionsGroupIsRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	other := pgtest.Store(t)
	r.produceJobs("a", 40)
	shared := func(c *Config) { c.Group = r.topic + "-shared" }
	first := r.start(r.config(shared))
	r.caughtUp(30*time.Second, first)

	second := startEngine(t, r.config(shared, func(c *Config) { c.Store = other }))
	err := waitRun(t, second, 30*time.Second)
	var gc *GroupConflictError
	require.ErrorAs(t, err, &gc)
	require.Equal(t, r.topic+"-shared", gc.Group)
	require.Contains(t, gc.Ours, other.Schema()+".jobs")
	require.Contains(t, gc.Theirs, r.store.Schema()+".jobs")
	require.Zero(t, countRows(t, other), "the refused projection wrote nothing")

	// The incumbent keeps every partition and every job.
	r.produceJobs("b", 40)
	r.caughtUp(30*time.Second, first)
	require.Equal(t, 80, countRows(t, r.store))
	require.True(t, first.p.Readiness().OK)
}

// Started at the same moment, before either holds the group: one is
// refused, the other projects every job; never two half-filled models.
func TestTwoProjectionsStartingTogetherInOneGroupOneIsRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	other := r.secondTable("jobs_b")
	r.produceJobs("a", 40)
	shared := func(c *Config) { c.Group = r.topic + "-shared" }
	a := r.start(r.config(shared))
	b := startEngine(t, r.config(shared, func(c *Config) { c.Store = other }))
	var refused, kept *store.Store
	var keptRun *running
	select {
	case err := <-a.done:
		a.done <- nil
		var gc *GroupConflictError
		require.ErrorAs(t, err, &gc)
		refused, kept, keptRun = r.store, other, b
	case err := <-b.done:
		b.done <- nil
		var gc *GroupConflictError
		require.ErrorAs(t, err, &gc)
		refused, kept, keptRun = other, r.store, a
	case <-time.After(45 * time.Second):
		t.Fatal("neither projection was refused")
	}
	r.eventually(30*time.Second, "the kept projection has every job", func() (bool, string) {
		n := countRows(t, kept)
		return n == 40, fmt.Sprintf("%d of 40", n)
	})
	r.eventually(10*time.Second, "the kept projection is ready", func() (bool, string) {
		rd := keptRun.p.Readiness()
		return rd.OK, fmt.Sprint(rd)
	})
	// The refused one may have applied a batch before it was refused; it
	// holds no partition now, and what it wrote is a prefix, never more.
	require.LessOrEqual(t, countRows(t, refused), 40)
}

// With no group given, each projection records a group of its own: two
// tables projected from one topic both get every job.
func TestDefaultGroupsAreOnePerProjection(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	other := r.secondTable("jobs_b")
	r.produceJobs("a", 40)
	noGroup := func(c *Config) { c.Group = "" }
	a := r.start(r.config(noGroup))
	b := startEngine(t, r.config(noGroup, func(c *Config) { c.Store = other }))
	r.eventually(45*time.Second, "both models have every job", func() (bool, string) {
		na, nb := countRows(t, r.store), countRows(t, other)
		return na == 40 && nb == 40, fmt.Sprintf("%d and %d of 40", na, nb)
	})
	require.Equal(t, DefaultGroup(r.store.Schema(), "jobs"), a.p.Status().Group)
	require.Equal(t, DefaultGroup(r.store.Schema(), "jobs_b"), b.p.Status().Group)
}

// A projection that ran before groups were recorded (positions, no
// recorded group) keeps the group every projection joined by default
// then, so a rolling upgrade does not start a second group beside the
// first: an instance of the earlier version (a kafka-go group member with
// kafka-go's default balancers and no metadata of its own, as the earlier
// versions joined) and an upgraded one share the partitions.
func TestAnUpgradedInstanceJoinsTheGroupItsProjectionRanIn(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	ctx := context.Background()
	// The earlier version migrated the tables it knew of and stored
	// positions; this one's migrations came later.
	_, err := r.store.Pool().Exec(ctx, `UPDATE `+r.store.Schema()+`.projector_migrations SET applied_at = applied_at - interval '1 day'
		WHERE name < 'migrations/008'`)
	require.NoError(t, err)
	_, err = r.store.Claim(ctx, r.topic, 0, "earlier")
	require.NoError(t, err)
	// And its instances still run in the legacy group. kafkatest's group
	// config keeps kafka-go's default balancers.
	cfg := r.kafka.GroupConfig(LegacyGroup, r.topic)
	old, err := kafka.NewConsumerGroup(cfg)
	require.NoError(t, err)
	defer old.Close()
	gctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	gen, err := old.Next(gctx)
	require.NoError(t, err)
	require.Len(t, gen.Assignments[r.topic], 4, "the earlier instance holds every partition")
	gen.Start(func(ctx context.Context) { <-ctx.Done() })

	up := r.start(r.config(func(c *Config) { c.Group = "" }))
	r.eventually(45*time.Second, "the upgraded instance works some of the partitions", func() (bool, string) {
		return len(up.p.Status().Partitions) > 0, "no partition yet"
	})
	require.Equal(t, LegacyGroup, up.p.Status().Group)
	next, err := old.Next(gctx)
	require.NoError(t, err)
	require.Less(t, len(next.Assignments[r.topic]), 4, "the earlier instance shares the partitions with the upgraded one")
	select {
	case err := <-up.done:
		t.Fatalf("the upgraded instance stopped: %v", err)
	default:
	}
}

package projection

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// Two projections receiving from one queue split its messages between
// them, as two in one consumer group split partitions: the queue is
// tagged as the first one's, and the second is refused, naming both. A
// second instance of the first projection is welcome.
func TestASecondProjectionOnOneQueueIsRefused(t *testing.T) {
	t.Parallel()
	r := newSQSRig(t, 2*time.Second)
	first := r.start(r.config())
	sendSQS(t, r.emu, r.queue, "a", qsnap("a", 1, `{"n":1}`))
	r.drained(20 * time.Second)

	same := r.start(r.config())
	other, err := store.New(pgtest.Pool(t), store.Config{Schema: r.store.Schema(), Table: "jobs_b"})
	require.NoError(t, err)
	require.NoError(t, other.Migrate(context.Background()))
	second := startEngine(t, r.config(func(c *Config) { c.Store = other }))
	err = waitRun(t, second, 30*time.Second)
	var gc *GroupConflictError
	require.ErrorAs(t, err, &gc)
	require.True(t, gc.Queue)
	require.Contains(t, gc.Theirs, r.store.Schema()+".jobs")
	require.Contains(t, gc.Ours, r.store.Schema()+".jobs_b")

	sendSQS(t, r.emu, r.queue, "b", qsnap("b", 1, `{"n":2}`))
	r.drained(20 * time.Second)
	require.Equal(t, 2, countRows(t, r.store))
	require.Zero(t, countRows(t, other))
	for _, run := range []*running{first, same} {
		select {
		case err := <-run.done:
			t.Fatalf("an instance of the queue's projection stopped: %v", err)
		default:
		}
	}
}

package projection

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A row's state is read from the store without a check that it is a JSON
// object ([storedJob]): a delta that meets a stored state it cannot apply
// to (here an array, which only a hand edit of the table can make) is
// quarantined with the reason, the row stays where it was, and the stream
// moves on.
func TestADeltaOnAStoredStateThatIsNoObjectIsQuarantined(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	ctx := context.Background()
	r.produce(rec{0, "j", snap("j", 1, `{"n":1}`)})
	run := r.start(r.config())
	r.caughtUp(30*time.Second, run)
	run.halt(t)

	_, err := r.store.Pool().Exec(ctx, `UPDATE `+r.store.JobsTable()+` SET state = '[1]'::jsonb WHERE job_id = 'j'`)
	require.NoError(t, err)
	offs := r.produce(
		rec{0, "j", dlt("j", 2, `[{"op":"increment","path":"/n","by":1}]`)},
		rec{0, "after", snap("after", 1, `{"ok":true}`)},
	)
	run = r.start(r.config()) // a new engine: its cache is empty, the row is read
	r.caughtUp(30*time.Second, run)

	q, total, err := r.store.Quarantine(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 1, total, "%+v", q)
	require.Equal(t, offs[0], q[0].Offset)
	require.Contains(t, q[0].Error, "the state it follows")
	require.Contains(t, q[0].Error, "must be a JSON object")
	rows := r.rows()
	require.Equal(t, int64(1), rows["j"].Version, "the row stays where it was")
	require.JSONEq(t, `[1]`, string(rows["j"].State))
	require.Equal(t, int64(1), rows["after"].Version, "the stream moves on")
}

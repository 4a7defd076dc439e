package projection

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

// groupOffsets reads the offsets the consumer group has committed for the
// rig's topic; a partition without one is missing from the map.
func (r *rig) groupOffsets(group string) map[int]int64 {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	parts := make([]int, r.parts)
	for i := range parts {
		parts[i] = i
	}
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	cl := &kafka.Client{Addr: kafka.TCP(r.kafka.Addrs()...), Transport: tr}
	resp, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{r.topic: parts}})
	require.NoError(r.t, err)
	require.NoError(r.t, resp.Error)
	out := map[int]int64{}
	for _, p := range resp.Topics[r.topic] {
		require.NoError(r.t, p.Error)
		if p.CommittedOffset >= 0 {
			out[p.Partition] = p.CommittedOffset
		}
	}
	return out
}

// A batch still in flight when the engine is stopped is committed within
// the shutdown grace; its position reaches the Kafka group too, so lag
// tools see what PostgreSQL stores, not the position before the last batch.
func TestStopCommitsTheLastBatchPositionToTheGroup(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2)
	var recs []rec
	for p := range 2 {
		for i := range 30 {
			job := fmt.Sprintf("stop-%d-%02d", p, i)
			recs = append(recs, rec{p, job, snap(job, 1, `{"n":1}`)})
		}
	}
	r.produce(recs...)

	var calls atomic.Int32
	var heldPartition atomic.Int32
	held := make(chan struct{})
	mayApply := newGate(t)
	hook := applyHook(func(partition int) {
		if calls.Add(1) == 1 {
			heldPartition.Store(int32(partition))
			close(held)
			<-mayApply.ch
		}
	})
	cfg := r.config(hook)
	run := r.start(cfg)
	t.Cleanup(mayApply.open)
	waitClosed(t, held, 20*time.Second, "a batch reaches its commit")

	// Stop while the batch waits; let it commit once the engine has left
	// its generation, inside the shutdown grace.
	run.stop()
	r.eventually(10*time.Second, "the engine stops being ready", func() (bool, string) {
		return !run.p.Ready(), "still ready"
	})
	mayApply.open()
	select {
	case err := <-run.done:
		require.NoError(t, err)
		run.done <- nil
	case <-time.After(30 * time.Second):
		t.Fatal("the engine did not stop within 30s")
	}

	// A partition whose worker had not reached a batch when it was
	// stopped stores nothing (-1), and the group has no offset for it.
	stored := map[int]int64{}
	for p, pos := range r.positions() {
		if pos.NextOffset >= 0 {
			stored[p] = pos.NextOffset
		}
	}
	hp := int(heldPartition.Load())
	require.Equal(t, r.highWatermarks()[hp], stored[hp], "the batch held at the stop was committed in the shutdown grace")
	require.Equal(t, stored, r.groupOffsets(cfg.Group), "the group's committed offsets are the positions stored in PostgreSQL")
}

// --start latest is resolved once, when a partition is first claimed, and
// stored at once: an engine that stops (or crashes) before its first batch
// leaves that position behind, so records produced before the next start
// are projected, not skipped by resolving "latest" again.
func TestStartLatestIsStoredAtClaim(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	var old []rec
	for i := range 5 {
		job := fmt.Sprintf("before-%d", i)
		old = append(old, rec{0, job, snap(job, 1, `{"n":1}`)})
	}
	r.produce(old...)

	cfg := r.config(func(c *Config) { c.Start = "latest" })
	first := r.start(cfg)
	r.eventually(20*time.Second, "the partition is claimed", func() (bool, string) {
		return len(first.p.Status().Partitions) == 1, "not claimed"
	})
	first.halt(t)
	require.Equal(t, int64(5), r.positions()[0].NextOffset, "the end of the partition at the claim is stored")

	var late []rec
	for i := range 3 {
		job := fmt.Sprintf("after-%d", i)
		late = append(late, rec{0, job, snap(job, 1, `{"n":2}`)})
	}
	r.produce(late...)
	second := r.start(cfg)
	r.caughtUp(20*time.Second, second)
	rows := r.rows()
	for _, x := range late {
		require.Contains(t, rows, x.key, "produced after the first claim, so projected")
	}
	for _, x := range old {
		require.NotContains(t, rows, x.key, "produced before the first claim, so skipped by --start latest")
	}
	require.Equal(t, int64(3), second.p.Status().Counters.Consumed)
}

// Under --start latest no committed state of a partition's row is claimed
// (epoch above 0) with no position stored (-1): the claim stores the end
// in the statement that takes the partition, so a crash at any moment
// after a claim restarts from that end. An audit trigger records every
// committed version of the row; a claim then a separate write of the
// position would leave one (epoch 1, next_offset -1) behind.
func TestStartLatestClaimStoresThePositionInTheSameTransaction(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2)
	var old []rec
	for p := range 2 {
		for i := range 3 {
			job := fmt.Sprintf("old-%d-%d", p, i)
			old = append(old, rec{p, job, snap(job, 1, `{"n":1}`)})
		}
	}
	r.produce(old...)

	ctx := context.Background()
	pool := r.store.Pool()
	schema := pgx.Identifier{r.store.Schema()}.Sanitize()
	_, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.claim_audit (partition int, epoch bigint, next_offset bigint);
		CREATE FUNCTION `+schema+`.claim_audit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO `+schema+`.claim_audit VALUES (NEW.partition, NEW.epoch, NEW.next_offset);
			RETURN NEW;
		END $$;
		CREATE TRIGGER claim_audit AFTER INSERT OR UPDATE ON `+schema+`.projector_partitions
			FOR EACH ROW EXECUTE FUNCTION `+schema+`.claim_audit();`)
	require.NoError(t, err)

	cfg := r.config(func(c *Config) { c.Start = "latest" })
	first := r.start(cfg)
	r.eventually(20*time.Second, "both partitions are claimed", func() (bool, string) {
		return len(first.p.Status().Partitions) == 2, fmt.Sprintf("%+v", first.p.Status().Partitions)
	})
	first.halt(t)

	rows, err := pool.Query(ctx, `SELECT partition, epoch, next_offset FROM `+schema+`.claim_audit ORDER BY epoch`)
	require.NoError(t, err)
	type version struct{ partition, epoch, next int64 }
	var seen []version
	for rows.Next() {
		var v version
		require.NoError(t, rows.Scan(&v.partition, &v.epoch, &v.next))
		seen = append(seen, v)
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, seen)
	for _, v := range seen {
		require.GreaterOrEqual(t, v.next, int64(3), "partition %d committed claimed at epoch %d without its start: %+v", v.partition, v.epoch, seen)
	}

	// Records produced after the claims are projected by the next start;
	// those before are not.
	r.produce(rec{0, "new-0", snap("new-0", 1, `{"n":2}`)}, rec{1, "new-1", snap("new-1", 1, `{"n":2}`)})
	second := r.start(cfg)
	r.caughtUp(20*time.Second, second)
	got := r.rows()
	require.Contains(t, got, "new-0")
	require.Contains(t, got, "new-1")
	for _, x := range old {
		require.NotContains(t, got, x.key)
	}
}

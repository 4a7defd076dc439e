package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/app/jobgen"
	"github.com/projector/projector/internal/buildhook/failpoint"
	"github.com/projector/projector/internal/testkit/faulttest"
	"github.com/projector/projector/internal/testkit/kafkatest"
	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// TestKafkaPartitionReadByTwoWithoutFence is the Kafka half of the proof
// that correctness needs no exclusive delivery: one partition read by two
// engines at once, as a share group (KIP-932) would hand it out. Two
// instances of the failpoints build, in two consumer groups so that each
// is assigned the partition, run with the fence switched off
// (no-fence=1): both read every record and commit their batches into one
// read model, unfenced. The audit trigger then shows no version that went
// down, every version written equal to the reference state of that
// version, and every job exact.
func TestKafkaPartitionReadByTwoWithoutFence(t *testing.T) {
	t.Parallel()
	exe := failpointBin(t)
	c := kafkatest.New(t)
	topic := kafkatest.Topic(t, c, 1)
	schema := pgtest.Schema(t)
	st, err := store.New(pgtest.Pool(t), store.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, st.Migrate(context.Background()))
	stream := jobgen.Generate(jobgen.Config{
		Seed: 41, Jobs: 100, EventsPerJob: 12, Partitions: 1,
		LateRate: 0.2, DuplicateRate: 0.2, MissingRate: 0.05, BadRate: 0.05, DeleteRate: 0.1,
	})
	auth := httptest.NewServer(jobgen.NewAuthority(stream.Truth))
	t.Cleanup(auth.Close)
	// No group offsets to sample: positions are not stored unfenced.
	hist := faulttest.Watch(t, faulttest.Target{Pool: pgtest.Pool(t), Schema: schema})
	t.Logf("%d jobs, %d records on one partition, faults %+v", len(stream.Truth), len(stream.Records), stream.Faults)

	args := func(owner string) []string {
		return []string{"run",
			"--brokers", strings.Join(c.Addrs(), ","), "--topic", topic, "--group", "g-" + owner, "--schema", schema,
			"--http-addr", "127.0.0.1:0", "--owner", owner, "--log-format", "json",
			"--batch-size", "20", "--batch-linger", "10ms", "--snapshot-url", auth.URL, "--gap-wait", "0",
			"--group-heartbeat-interval", "100ms", "--group-session-timeout", "2s",
			"--group-rebalance-timeout", "2s", "--group-join-backoff", "100ms",
		}
	}
	env := dbEnv(failpoint.Env + "=" + failpoint.NoFence + "=1")
	a := startExe(t, exe, "run a (no fence)", env, args("inst-a")...)
	b := startExe(t, exe, "run b (no fence)", env, args("inst-b")...)
	addrA, addrB := a.httpAddr(15*time.Second), b.httpAddr(15*time.Second)

	// Produced in chunks while both read, so their batches interleave.
	recs := make([]kafkatest.Record, len(stream.Records))
	for i, r := range stream.Records {
		recs[i] = kafkatest.Record{Partition: r.Partition, Key: r.Key, Value: r.Value}
	}
	for len(recs) > 0 {
		n := min(len(recs), 50)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := c.Produce(ctx, topic, recs[:n]...)
		cancel()
		require.NoError(t, err)
		recs = recs[n:]
		time.Sleep(10 * time.Millisecond) // pacing the producer, not synchronising
	}

	total := int64(len(stream.Records))
	var sa, sb *liveStatus
	eventually(t, 90*time.Second, "both instances consumed every record and nothing is held", func() (bool, string) {
		a.requireAlive()
		b.requireAlive()
		var err error
		if sa, err = fetchStatus(addrA); err != nil {
			return false, err.Error()
		}
		if sb, err = fetchStatus(addrB); err != nil {
			return false, err.Error()
		}
		var held int
		if err := pgtest.Pool(t).QueryRow(context.Background(), `SELECT count(*) FROM `+
			pgx.Identifier{schema, "projector_held"}.Sanitize()).Scan(&held); err != nil {
			return false, err.Error()
		}
		return sa.Counters.Consumed >= total && sb.Counters.Consumed >= total && held == 0,
			fmt.Sprintf("a consumed %d, b consumed %d of %d; %d held", sa.Counters.Consumed, sb.Counters.Consumed, total, held)
	})
	t.Logf("a: %+v", sa.Counters)
	t.Logf("b: %+v", sb.Counters)
	require.Zero(t, sa.Counters.Fenced+sb.Counters.Fenced, "the fence was off")
	dropped := sa.Counters.Duplicates + sb.Counters.Duplicates + sa.Counters.Stale + sb.Counters.Stale
	require.Positive(t, dropped, "no record was found already applied by the other: they did not share the partition")
	a.stop(stopWithin)
	b.stop(stopWithin)

	rep := hist.Check(faulttest.ReferenceOf(stream), faulttest.Options{})
	require.Empty(t, rep.Violations)
	require.Positive(t, rep.Checked)
}

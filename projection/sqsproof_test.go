package projection

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/app/jobgen"
	"github.com/projector/projector/internal/testkit/faulttest"
	"github.com/projector/projector/internal/testkit/pgtest"
	sqssrc "github.com/projector/projector/source/sqs"
	"github.com/projector/projector/store"
)

// TestSQSTwoConsumersWithoutExclusiveDelivery is the proof that the
// database, not ownership, keeps the read model exact: two engines receive
// from one queue at once, with a visibility timeout (1 s) shorter than a
// batch (each lingers 1.2 s before it commits) and the visibility keeper
// off, so a message comes back, to the other engine or the same one, while
// the first still works on it. Both commit unfenced. The audit trigger
// then shows that no job's version ever went down, that every version
// written has exactly the reference state of that version (an increment
// applied twice or skipped would show), and that every job ends exact.
func TestSQSTwoConsumersWithoutExclusiveDelivery(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end with deliberately slow batches: about 15 s")
	}
	r := newSQSRig(t, time.Second)
	schema := pgtest.Schema(t)
	st, err := store.New(pgtest.Pool(t), store.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, st.Migrate(t.Context()))
	r.store = st
	hist := faulttest.Watch(t, faulttest.Target{Pool: pgtest.Pool(t), Schema: schema})

	stream := jobgen.Generate(jobgen.Config{
		Seed: 13, Jobs: 20, EventsPerJob: 5, Partitions: 1,
		LateRate: 0.2, DuplicateRate: 0.3, MissingRate: 0.1, BadRate: 0.05, DeleteRate: 0.1,
	})
	auth := httptest.NewServer(jobgen.NewAuthority(stream.Truth))
	t.Cleanup(auth.Close)
	t.Logf("%d jobs, %d records, faults %+v", len(stream.Truth), len(stream.Records), stream.Faults)

	engine := func(name string) *running {
		cfg := r.config(func(c *Config) {
			c.Owner = name
			c.SQS = emulatorSQS(r.emu, r.queue, time.Second)
			c.BatchLinger = 1200 * time.Millisecond
			c.GapWait, c.GapWaitOff = 200*time.Millisecond, false
			c.SnapshotURL = auth.URL
			c.SnapshotTimeout = 2 * time.Second
			c.SnapshotMaxElapsed = 3 * time.Second
		})
		p, err := New(cfg)
		require.NoError(t, err)
		p.src.(*sqssrc.Queue).Reader().Keep = 0
		ctx, cancel := context.WithCancel(context.Background())
		run := &running{p: p, stop: cancel, done: make(chan error, 1)}
		go func() { run.done <- p.Run(ctx) }()
		t.Cleanup(func() { run.halt(t) })
		return run
	}
	a, b := engine("engine-a"), engine("engine-b")

	// Each record with its job as its group, and a deduplication id of its
	// own (the stream's duplicates are meant to arrive).
	c := r.emu.Client()
	for i := 0; i < len(stream.Records); i += 10 {
		var entries []types.SendMessageBatchRequestEntry
		for k, rec := range stream.Records[i:min(i+10, len(stream.Records))] {
			entries = append(entries, types.SendMessageBatchRequestEntry{
				Id: aws.String(fmt.Sprint(k)), MessageBody: aws.String(string(rec.Value)),
				MessageGroupId: aws.String(string(rec.Key)), MessageDeduplicationId: aws.String(fmt.Sprint(i + k)),
			})
		}
		out, err := c.SendMessageBatch(t.Context(), &sqs.SendMessageBatchInput{QueueUrl: aws.String(r.queue), Entries: entries})
		require.NoError(t, err)
		require.Empty(t, out.Failed)
	}
	r.drained(90 * time.Second)

	sa, sb := a.p.Status(), b.p.Status()
	received := sa.SQS.Counters.Received + sb.SQS.Counters.Received
	redelivered := sa.SQS.Counters.Redelivered + sb.SQS.Counters.Redelivered
	consumed := sa.Counters.Consumed + sb.Counters.Consumed
	dropped := sa.Counters.Duplicates + sb.Counters.Duplicates + sa.Counters.Stale + sb.Counters.Stale
	t.Logf("sent %d; received %d (a %d, b %d), of which redelivered %d; consumed %d; applied a %d b %d; duplicates and stale dropped %d; delete failures %d",
		len(stream.Records), received, sa.SQS.Counters.Received, sb.SQS.Counters.Received, redelivered, consumed,
		sa.Counters.Applied, sb.Counters.Applied, dropped, sa.SQS.Counters.DeleteFailed+sb.SQS.Counters.DeleteFailed)
	require.Positive(t, redelivered, "no message came back while its batch was in flight: the test proves nothing")
	require.Positive(t, sa.SQS.Counters.Received, "engine a received nothing")
	require.Positive(t, sb.SQS.Counters.Received, "engine b received nothing")
	require.Greater(t, consumed, int64(len(stream.Records)), "no message was worked on twice")

	rep := hist.Check(faulttest.ReferenceOf(stream), faulttest.Options{})
	require.Empty(t, rep.Violations)
	require.Positive(t, rep.Checked)
}

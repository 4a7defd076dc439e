package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// statusJSON is `projector status --json`, as docs/guide/status.md lists it.
type statusJSON struct {
	Projection string `json:"projection"`
	Schema     string `json:"schema"`
	Partitions []struct {
		Topic         string `json:"topic"`
		Partition     int    `json:"partition"`
		NextOffset    *int64 `json:"next_offset"`
		Epoch         int64  `json:"epoch"`
		Owner         string `json:"owner"`
		HighWatermark *int64 `json:"high_watermark"`
		Lag           *int64 `json:"lag"`
	} `json:"partitions"`
	Lag              *int64            `json:"lag"`
	HeldJobs         *int              `json:"held_jobs"`
	Held             []json.RawMessage `json:"held"`
	Quarantined      *int              `json:"quarantined"`
	RecentQuarantine []struct {
		Topic     string `json:"topic"`
		Partition int    `json:"partition"`
		Offset    int64  `json:"offset"`
		Key       string `json:"key"`
		Error     string `json:"error"`
	} `json:"recent_quarantine"`
	Jobs        *int64 `json:"jobs"`
	DeletedJobs *int64 `json:"deleted_jobs"`
}

func parseStatus(t *testing.T, r result) statusJSON {
	t.Helper()
	require.Equal(t, 0, r.code, "%s", r)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), "%s", r)
	return st
}

// TestStatus reads a finished run's projection with `projector status`:
// the text tables, --json without and with --brokers, and --limit.
func TestStatus(t *testing.T) {
	t.Parallel()
	s := newStory(t, 3)
	s.fullStory()
	s.runToEnd("g-status")
	hw := s.highWatermarks()

	text := runBin(t, 30*time.Second, dbEnv(), "status", "--schema", s.schema)
	require.Equal(t, 0, text.code, "%s", text)
	for _, want := range []string{
		"projection " + s.schema + ".jobs: 61 jobs, 3 deleted (tombstones)",
		"NEXT OFFSET",
		"EPOCH",
		"held jobs: 0",
		fmt.Sprintf("quarantined records: %d", s.quarantined),
		"value: not a JSON object", // the recent quarantine, with errors
	} {
		require.Contains(t, text.stdout, want, "%s", text)
	}
	for p := range 3 {
		require.Regexp(t, fmt.Sprintf(`(?m)^%s\s+%d\s+%d\s`, regexp.QuoteMeta(s.topic), p, hw[p]), text.stdout, "partition %d's line", p)
	}

	st := parseStatus(t, runBin(t, 30*time.Second, dbEnv(), "status", "--schema", s.schema, "--json"))
	require.Equal(t, "jobs", st.Projection)
	require.Equal(t, s.schema, st.Schema)
	require.Len(t, st.Partitions, 3)
	for _, p := range st.Partitions {
		require.Equal(t, s.topic, p.Topic)
		require.NotNil(t, p.NextOffset, "partition %d has next_offset", p.Partition)
		require.Equal(t, hw[p.Partition], *p.NextOffset, "partition %d", p.Partition)
		require.Positive(t, p.Epoch)
		require.Equal(t, "inst-g-status", p.Owner)
		require.Nil(t, p.Lag, "no lag without --brokers")
	}
	require.Nil(t, st.Lag, "no lag without --brokers")
	require.NotNil(t, st.Quarantined)
	require.Equal(t, int(s.quarantined), *st.Quarantined)
	require.Len(t, st.RecentQuarantine, int(s.quarantined))
	for _, q := range st.RecentQuarantine {
		require.Equal(t, s.topic, q.Topic)
		require.NotEmpty(t, q.Error)
	}
	require.NotNil(t, st.HeldJobs)
	require.Zero(t, *st.HeldJobs)
	require.NotNil(t, st.Held, "held is [] rather than null")
	require.NotNil(t, st.Jobs)
	require.Equal(t, int64(len(s.want)), *st.Jobs)
	require.NotNil(t, st.DeletedJobs)
	require.Equal(t, s.deleted, *st.DeletedJobs, "every deleted job has its tombstone")

	// With the brokers the lag is known: zero after the catch-up.
	st = parseStatus(t, runBin(t, 30*time.Second, dbEnv(),
		"status", "--schema", s.schema, "--json", "--brokers", s.brokers(), "--topic", s.topic))
	require.NotNil(t, st.Lag)
	require.Zero(t, *st.Lag)
	require.Len(t, st.Partitions, 3)
	for _, p := range st.Partitions {
		require.NotNil(t, p.HighWatermark, "partition %d", p.Partition)
		require.NotNil(t, p.Lag, "partition %d", p.Partition)
		require.Equal(t, hw[p.Partition], *p.HighWatermark, "partition %d", p.Partition)
		require.Zero(t, *p.Lag, "partition %d", p.Partition)
	}

	// New records are lag until projected; the environment works like
	// the flags.
	s.produce(rec(1, "late-job", snapshotValue("late-job", 1, map[string]any{"status": "queued"})),
		rec(1, "late-job", snapshotValue("late-job", 2, map[string]any{"status": "running"})))
	withLag := runBin(t, 30*time.Second, dbEnv("PROJECTOR_SCHEMA="+s.schema, "PROJECTOR_BROKERS="+s.brokers(), "PROJECTOR_TOPIC="+s.topic), "status")
	require.Equal(t, 0, withLag.code, "%s", withLag)
	require.Contains(t, withLag.stdout, "total lag: 2", "%s", withLag)

	// --limit bounds the lists, not the counts.
	st = parseStatus(t, runBin(t, 30*time.Second, dbEnv(), "status", "--schema", s.schema, "--json", "--limit", "1"))
	require.Len(t, st.RecentQuarantine, 1)
	require.Equal(t, int(s.quarantined), *st.Quarantined)
}

// TestStatusFreshSchema: status on a projection whose tables exist but
// that nothing has projected into reports it empty; with brokers,
// unprojected partitions lag by their whole length. (Status on a schema
// without the tables is an error: TestStatusReadOnly.)
func TestStatusFreshSchema(t *testing.T) {
	t.Parallel()
	s := newStory(t, 2)
	require.NoError(t, s.st.Migrate(context.Background()))
	s.produce(rec(0, "a", snapshotValue("a", 1, map[string]any{})), rec(1, "b", snapshotValue("b", 1, map[string]any{})),
		rec(1, "b", snapshotValue("b", 2, map[string]any{})))

	text := runBin(t, 30*time.Second, dbEnv(), "status", "--schema", s.schema)
	require.Equal(t, 0, text.code, "%s", text)
	require.Contains(t, text.stdout, "no partition has been claimed yet")
	require.Contains(t, text.stdout, "quarantined records: 0")

	st := parseStatus(t, runBin(t, 30*time.Second, dbEnv(), "status", "--schema", s.schema, "--json", "--brokers", s.brokers(), "--topic", s.topic))
	require.NotNil(t, st.Lag)
	require.Equal(t, int64(3), *st.Lag)
	require.Len(t, st.Partitions, 2)
	for _, p := range st.Partitions {
		require.Equal(t, int64(-1), *p.NextOffset, "never projected")
	}
	require.Equal(t, int64(0), *st.Jobs)
}

// TestStatusWithAnOpenTransaction: with --kafka-isolation read_committed
// (the default) status measures the lag to the last stable offset and says
// which partition waits on a transaction still open; with
// read_uncommitted the records after it are lag, measured to the high
// watermark.
func TestStatusWithAnOpenTransaction(t *testing.T) {
	t.Parallel()
	s := newStory(t, 1)
	s.produce(rec(0, "before", snapshotValue("before", 1, map[string]any{"status": "queued"})))
	p := startBin(t, "run", dbEnv(), s.runArgs("g-open", "inst-open", "--http-addr", "off")...)
	s.caughtUp(joinWithin, p)
	p.stop(stopWithin)
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.kafka.Addrs()...), kgo.TransactionalID(s.topic+"-txn"), kgo.DefaultProduceTopic(s.topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.BeginTransaction())
	require.NoError(t, cl.ProduceSync(t.Context(), &kgo.Record{Partition: 0, Key: []byte("open"), Value: []byte(`{}`)}).FirstErr())
	defer cl.EndTransaction(context.WithoutCancel(t.Context()), kgo.TryAbort)

	args := []string{"status", "--schema", s.schema, "--brokers", s.brokers(), "--topic", s.topic}
	var st struct {
		statusJSON
		Isolation     string `json:"isolation"`
		LagMeasuredTo string `json:"lag_measured_to"`
		Partitions    []struct {
			HighWatermark   int64  `json:"high_watermark"`
			LastStable      int64  `json:"last_stable_offset"`
			Lag             int64  `json:"lag"`
			OpenTransaction *int64 `json:"open_transaction"`
		} `json:"partitions"`
	}
	r := runBin(t, 30*time.Second, dbEnv(), append(args, "--json")...)
	require.Equal(t, 0, r.code, "%s", r)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), "%s", r)
	require.Equal(t, "read_committed", st.Isolation)
	require.Equal(t, "last_stable_offset", st.LagMeasuredTo)
	require.Zero(t, *st.Lag, "waiting on an open transaction is not lag")
	require.Len(t, st.Partitions, 1)
	part := st.Partitions[0]
	require.Equal(t, int64(2), part.HighWatermark)
	require.Equal(t, int64(1), part.LastStable)
	require.NotNil(t, part.OpenTransaction)
	require.Equal(t, int64(1), *part.OpenTransaction)

	text := runBin(t, 30*time.Second, dbEnv(), args...)
	require.Equal(t, 0, text.code, "%s", text)
	require.Contains(t, text.stdout, "LAST STABLE")
	require.Contains(t, text.stdout, "partition 0 waits on a transaction still open at offset 1")
	require.Contains(t, text.stdout, "total lag: 0 (to the last stable offset: --kafka-isolation read_committed)")

	r = runBin(t, 30*time.Second, dbEnv(), append(args, "--json", "--kafka-isolation", "read_uncommitted")...)
	require.Equal(t, 0, r.code, "%s", r)
	st.Partitions = nil
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), "%s", r)
	require.Equal(t, "high_watermark", st.LagMeasuredTo)
	require.Equal(t, int64(1), *st.Lag)
	require.Nil(t, st.Partitions[0].OpenTransaction)
}

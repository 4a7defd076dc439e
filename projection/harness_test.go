package projection

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/kafkatest"
	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// rig is one test's broker, topic and store.
type rig struct {
	t     *testing.T
	kafka *kafkatest.Cluster
	topic string
	store *store.Store
	parts int
}

func newRig(t *testing.T, partitions int) *rig {
	t.Helper()
	c := kafkatest.New(t)
	return &rig{t: t, kafka: c, topic: kafkatest.Topic(t, c, partitions), store: pgtest.Store(t), parts: partitions}
}

// newRigTopicConfig is [newRig] with topic configs, for example a
// max.message.bytes above the broker's default.
func newRigTopicConfig(t *testing.T, partitions int, configs ...kafka.ConfigEntry) *rig {
	t.Helper()
	c := kafkatest.New(t)
	topic := "projection-test"
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, c.CreateTopic(ctx, topic, partitions, configs...))
	return &rig{t: t, kafka: c, topic: topic, store: pgtest.Store(t), parts: partitions}
}

// config is a fast-reacting engine configuration for tests.
func (r *rig) config(mod ...func(*Config)) Config {
	cfg := Config{
		Brokers:   r.kafka.Addrs(),
		Topic:     r.topic,
		Group:     r.topic + "-group",
		Store:     r.store,
		Logger:    slog.New(slog.NewTextHandler(testWriter{r.t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		BatchSize: 500,
		// BatchLinger is left at its default (none), as `projector run` has it.
		MaxWait:                200 * time.Millisecond,
		HeartbeatInterval:      kafkatest.GroupHeartbeatInterval,
		SessionTimeout:         kafkatest.GroupSessionTimeout,
		RebalanceTimeout:       kafkatest.GroupRebalanceTimeout,
		JoinGroupBackoff:       kafkatest.GroupJoinBackoff,
		PartitionWatchInterval: kafkatest.GroupPartitionWatchInterval,
		GapWaitOff:             true,
		GapRetryMin:            50 * time.Millisecond,
		GapRetryMax:            500 * time.Millisecond,
		RereadMaxTime:          5 * time.Second,
	}
	for _, m := range mod {
		m(&cfg)
	}
	return cfg
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}

// running is a projector running in the background.
type running struct {
	p    *Projector
	stop context.CancelFunc
	done chan error
}

func (r *rig) start(cfg Config) *running {
	r.t.Helper()
	return startEngine(r.t, cfg)
}

// startEngine runs an engine with cfg until the test ends (or it is
// halted), whatever its source.
func startEngine(t *testing.T, cfg Config) *running {
	t.Helper()
	p, err := New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{p: p, stop: cancel, done: make(chan error, 1)}
	go func() { run.done <- p.Run(ctx) }()
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { run.halt(t) }) })
	return run
}

// halt stops the projector and waits for Run to return.
func (run *running) halt(t *testing.T) {
	run.stop()
	select {
	case err := <-run.done:
		require.NoError(t, err)
		run.done <- nil
	case <-time.After(30 * time.Second):
		t.Fatal("projector did not stop within 30s")
	}
}

// rec is one record to produce.
type rec struct {
	partition int
	key       string
	value     any // string, []byte or a map marshalled to JSON
}

func (r *rig) produce(recs ...rec) []int64 {
	r.t.Helper()
	out := make([]kafkatest.Record, len(recs))
	for i, x := range recs {
		var v []byte
		switch val := x.value.(type) {
		case string:
			v = []byte(val)
		case []byte:
			v = val
		case nil:
		default:
			b, err := json.Marshal(val)
			require.NoError(r.t, err)
			v = b
		}
		var k []byte
		if x.key != "" {
			k = []byte(x.key)
		}
		out[i] = kafkatest.Record{Partition: x.partition, Key: k, Value: v}
	}
	offs, err := r.kafka.Produce(context.Background(), r.topic, out...)
	require.NoError(r.t, err)
	return offs
}

func snap(job string, v int64, state string) string {
	return fmt.Sprintf(`{"job_id":%q,"version":%d,"kind":"snapshot","state":%s,"event_id":"evt-%s-%d"}`, job, v, state, job, v)
}

func dlt(job string, v int64, ops string) string {
	return fmt.Sprintf(`{"job_id":%q,"version":%d,"kind":"delta","ops":%s,"event_id":"evt-%s-%d"}`, job, v, ops, job, v)
}

// caughtUp waits until every partition's stored position reaches its high
// watermark and, when engines are given, until one of them reports that
// position too. A worker settles its counters after the batch transaction
// commits and publishes its position after that, so counters read after
// caughtUp with the running engines given are final; with none given they
// may still lack the last batch.
func (r *rig) caughtUp(within time.Duration, engines ...*running) {
	r.t.Helper()
	r.eventually(within, "stored positions reach the high watermarks", func() (bool, string) {
		ctx := context.Background()
		hwm, err := r.kafka.HighWatermarks(ctx, r.topic)
		if err != nil {
			return false, err.Error()
		}
		pos, err := r.store.Positions(ctx)
		if err != nil {
			return false, err.Error()
		}
		have := map[int]int64{}
		for _, p := range pos {
			if p.Topic == r.topic {
				have[p.Partition] = p.NextOffset
			}
		}
		for p, h := range hwm {
			if h > 0 && have[p] != h {
				return false, fmt.Sprintf("partition %d at %d of %d", p, have[p], h)
			}
		}
		if len(engines) == 0 {
			return true, ""
		}
		published := map[int]int64{}
		for _, e := range engines {
			for _, ps := range e.p.Status().Partitions {
				published[ps.Partition] = max(published[ps.Partition], ps.Position)
			}
		}
		for p, h := range hwm {
			if h > 0 && published[p] != h {
				return false, fmt.Sprintf("partition %d stored at %d, engines report %d", p, h, published[p])
			}
		}
		return true, ""
	})
}

func (r *rig) eventually(within time.Duration, what string, cond func() (bool, string)) {
	r.t.Helper()
	deadline := time.Now().Add(within)
	last := ""
	for {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out after %s waiting until %s: %s", within, what, last)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
}

// positions returns the stored position of each partition of the rig's topic.
func (r *rig) positions() map[int]store.Position {
	r.t.Helper()
	pos, err := r.store.Positions(context.Background())
	require.NoError(r.t, err)
	out := map[int]store.Position{}
	for _, p := range pos {
		if p.Topic == r.topic {
			out[p.Partition] = p
		}
	}
	return out
}

// highWatermarks returns each partition's high watermark.
func (r *rig) highWatermarks() map[int]int64 {
	r.t.Helper()
	hwm, err := r.kafka.HighWatermarks(context.Background(), r.topic)
	require.NoError(r.t, err)
	return hwm
}

// requirePositionsAtEnd asserts that every partition's stored position is
// its high watermark: every record was read, and nothing past the end.
func (r *rig) requirePositionsAtEnd() {
	r.t.Helper()
	hwm := r.highWatermarks()
	pos := r.positions()
	for p, h := range hwm {
		if h == 0 {
			if at, ok := pos[p]; ok {
				require.Equal(r.t, int64(-1), at.NextOffset, "empty partition %d: nothing read", p)
			}
			continue
		}
		require.Contains(r.t, pos, p, "partition %d has no stored position", p)
		require.Equal(r.t, h, pos[p].NextOffset, "partition %d: stored position vs high watermark", p)
	}
}

// waitClosed waits until ch is closed or fails the test after within.
func waitClosed(t *testing.T, ch <-chan struct{}, within time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(within):
		t.Fatalf("timed out after %s waiting until %s", within, what)
	}
}

func (r *rig) rows() map[string]store.Job {
	r.t.Helper()
	jobs, err := r.store.Jobs(context.Background())
	require.NoError(r.t, err)
	return jobs
}

// stream builds job event records, routed to partitions by a hash of the
// job id (so a job's records share one partition), and keeps the read model
// they must leave: every job at its highest version with exactly that
// version's state.
//
// Snapshot jobs may arrive in any order; counter jobs are runs of increment
// deltas, which must arrive in version order (a scramble keeps it), and
// whose final count shows that no delta was applied twice or skipped.
type stream struct {
	parts    int
	pending  []rec
	produced int
	want     map[string]int64
	counter  map[string]bool
	// seq orders a counter job's pending records by version.
	seq map[string][]int64
}

func newStream(parts int) *stream {
	return &stream{parts: parts, want: map[string]int64{}, counter: map[string]bool{}, seq: map[string][]int64{}}
}

func partitionOf(job string, parts int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(job))
	return int(h.Sum32() % uint32(parts))
}

// stateOf is version v's state of a snapshot job: distinct per version, so
// a row at the right version with another version's state is caught.
func stateOf(job string, v int64) string {
	statuses := []string{"queued", "running", "paused", "completed", "failed"}
	return fmt.Sprintf(`{"job":%q,"status":%q,"progress":%d,"attempt":{"n":%d}}`, job, statuses[v%5], v*7%100, v)
}

// counterStateOf is a counter job's state after v deltas.
func counterStateOf(v int64) string {
	return fmt.Sprintf(`{"count":%d,"last":%d}`, v*(v+1)/2, v)
}

// snapshots queues one snapshot of job per version given.
func (s *stream) snapshots(job string, versions ...int64) {
	for _, v := range versions {
		s.pending = append(s.pending, rec{partitionOf(job, s.parts), job, snap(job, v, stateOf(job, v))})
		s.want[job] = max(s.want[job], v)
	}
}

// increments queues the next n deltas of counter job: delta v adds v to
// /count, so a delta applied twice or skipped shows in the sum.
func (s *stream) increments(job string, n int) {
	s.counter[job] = true
	for range n {
		v := s.want[job] + 1
		s.pending = append(s.pending, rec{partitionOf(job, s.parts), job,
			dlt(job, v, fmt.Sprintf(`[{"op":"increment","path":"/count","by":%d},{"op":"set","path":"/last","value":%d}]`, v, v))})
		s.seq[job] = append(s.seq[job], v)
		s.want[job] = v
	}
}

// scramble shuffles the queued records: snapshot versions of one job
// arrive out of order and jobs interleave; a counter job's deltas keep
// their order.
func (s *stream) scramble(rng *rand.Rand) {
	rng.Shuffle(len(s.pending), func(i, j int) { s.pending[i], s.pending[j] = s.pending[j], s.pending[i] })
	byJob := map[string][]int{}
	for i, x := range s.pending {
		if s.counter[x.key] {
			byJob[x.key] = append(byJob[x.key], i)
		}
	}
	for job, idx := range byJob {
		for k, i := range idx {
			v := s.seq[job][k]
			s.pending[i].value = dlt(job, v, fmt.Sprintf(`[{"op":"increment","path":"/count","by":%d},{"op":"set","path":"/last","value":%d}]`, v, v))
		}
	}
}

// flush produces the queued records and returns how many.
func (s *stream) flush(r *rig) int {
	r.t.Helper()
	n := len(s.pending)
	r.produce(s.pending...)
	s.pending = nil
	s.seq = map[string][]int64{}
	s.produced += n
	return n
}

// requireModel asserts that the read model holds exactly the stream's jobs,
// each at its highest version with that version's state and event id.
func (r *rig) requireModel(s *stream) {
	r.t.Helper()
	rows := r.rows()
	require.Len(r.t, rows, len(s.want), "rows in the read model")
	for job, v := range s.want {
		row, ok := rows[job]
		require.True(r.t, ok, "job %s has no row", job)
		require.Equal(r.t, v, row.Version, "job %s version", job)
		want := stateOf(job, v)
		if s.counter[job] {
			want = counterStateOf(v)
		}
		require.JSONEq(r.t, want, string(row.State), "job %s state", job)
		require.Equal(r.t, fmt.Sprintf("evt-%s-%d", job, v), row.EventID, "job %s event id", job)
	}
}

// jobIDs returns n job ids with a prefix.
func jobIDs(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return out
}

// versions returns lo..hi.
func versions(lo, hi int64) []int64 {
	var out []int64
	for v := lo; v <= hi; v++ {
		out = append(out, v)
	}
	return out
}

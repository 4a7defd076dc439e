package projection

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/kafkatest"
	"github.com/projector/projector/internal/pgtest"
	"github.com/projector/projector/store"
)

// rig is one test's broker, topic and store.
type rig struct {
	t       *testing.T
	kafka   *kafkatest.Cluster
	topic   string
	store   *store.Store
	parts   int
	nextKey int
}

func newRig(t *testing.T, partitions int) *rig {
	t.Helper()
	c := kafkatest.New(t)
	return &rig{t: t, kafka: c, topic: kafkatest.Topic(t, c, partitions), store: pgtest.Store(t), parts: partitions}
}

// config is a fast-reacting engine configuration for tests.
func (r *rig) config(mod ...func(*Config)) Config {
	cfg := Config{
		Brokers:                r.kafka.Addrs(),
		Topic:                  r.topic,
		Group:                  r.topic + "-group",
		Store:                  r.store,
		Logger:                 slog.New(slog.NewTextHandler(testWriter{r.t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		BatchSize:              500,
		BatchLinger:            20 * time.Millisecond,
		MaxWait:                200 * time.Millisecond,
		HeartbeatInterval:      kafkatest.GroupHeartbeatInterval,
		SessionTimeout:         kafkatest.GroupSessionTimeout,
		RebalanceTimeout:       kafkatest.GroupRebalanceTimeout,
		JoinGroupBackoff:       kafkatest.GroupJoinBackoff,
		PartitionWatchInterval: kafkatest.GroupPartitionWatchInterval,
		GapWait:                NoGapWait,
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
	p, err := New(cfg)
	require.NoError(r.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{p: p, stop: cancel, done: make(chan error, 1)}
	go func() { run.done <- p.Run(ctx) }()
	var once sync.Once
	r.t.Cleanup(func() { once.Do(func() { run.halt(r.t) }) })
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
// watermark.
func (r *rig) caughtUp(within time.Duration) {
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

func (r *rig) rows() map[string]store.Job {
	r.t.Helper()
	jobs, err := r.store.Jobs(context.Background())
	require.NoError(r.t, err)
	return jobs
}

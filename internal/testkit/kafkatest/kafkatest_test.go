package kafkatest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/projector/projector/internal/testkit/kafkatest"
)

// Every broker, connection pool, reader, writer and consumer group a test
// starts is closed by the time it returns, so no goroutine is exempt.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// readPartition reads n records from one partition with a plain (groupless)
// kafka-go Reader, starting at offset from.
func readPartition(ctx context.Context, t *testing.T, c *kafkatest.Cluster, topic string, p int, from int64, n int) []kafka.Message {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:   c.Addrs(),
		Topic:     topic,
		Partition: p,
		MinBytes:  1,
		MaxBytes:  10 << 20, // required once MinBytes is set: NewReader panics on max 0
		// Close waits for the fetch in flight, which the broker holds
		// for up to MaxWait when the partition has nothing new.
		MaxWait: 100 * time.Millisecond,
	})
	defer func() { require.NoError(t, r.Close()) }()
	require.NoError(t, r.SetOffset(from))
	out := make([]kafka.Message, 0, n)
	for len(out) < n {
		m, err := r.ReadMessage(ctx)
		require.NoError(t, err, "p%d after %d records", p, len(out))
		out = append(out, m)
	}
	return out
}

func TestProduceAtExplicitPartitions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	c := kafkatest.New(t)
	topic := kafkatest.Topic(t, c, 3)

	// Interleave partitions so order within each must survive the grouping,
	// and write enough that a partition takes several batches.
	const perPartition = 6000
	var recs []kafkatest.Record
	for i := range 3 * perPartition {
		recs = append(recs, kafkatest.Record{
			Partition: i % 3,
			Key:       fmt.Appendf(nil, "job-%d", i%17),
			Value:     fmt.Appendf(nil, "v%d", i),
		})
	}
	recs[4].Value = nil // tombstone: p1, offset 1
	recs[5].Headers = []kafka.Header{{Key: "h", Value: []byte("x")}}

	offsets, err := c.Produce(ctx, topic, recs...)
	require.NoError(t, err)
	require.Len(t, offsets, len(recs))
	for i, off := range offsets {
		require.Equal(t, int64(i/3), off, "record %d", i)
	}

	// A second call continues where the first ended.
	more, err := c.Produce(ctx, topic,
		kafkatest.Record{Partition: 2, Value: []byte("late-a")},
		kafkatest.Record{Partition: 2, Value: []byte("late-b")},
	)
	require.NoError(t, err)
	require.Equal(t, []int64{perPartition, perPartition + 1}, more)

	hw, err := c.HighWatermarks(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, map[int]int64{0: perPartition, 1: perPartition, 2: perPartition + 2}, hw)

	for p := range 3 {
		got := readPartition(ctx, t, c, topic, p, 0, perPartition)
		for j, m := range got {
			i := j*3 + p // index into recs
			require.Equal(t, p, m.Partition)
			require.Equal(t, offsets[i], m.Offset)
			require.Equal(t, recs[i].Key, m.Key)
			if recs[i].Value == nil {
				require.Nil(t, m.Value, "tombstone at p%d@%d", p, m.Offset)
			} else {
				require.Equal(t, recs[i].Value, m.Value, "p%d@%d", p, m.Offset)
			}
			if i == 5 {
				require.Equal(t, recs[5].Headers, m.Headers)
			}
		}
	}
	late := readPartition(ctx, t, c, topic, 2, perPartition, 2)
	require.Equal(t, []byte("late-a"), late[0].Value)
	require.Equal(t, []byte("late-b"), late[1].Value)
}

func TestProduceKeyedRoutesLikeJava(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	c := kafkatest.New(t)
	const partitions = 4
	topic := kafkatest.Topic(t, c, partitions)

	const keys, versions = 50, 20
	var msgs []kafka.Message
	for v := range versions {
		for k := range keys {
			msgs = append(msgs, kafka.Message{Key: fmt.Appendf(nil, "job-%d", k), Value: fmt.Appendf(nil, "%d", v)})
		}
	}
	require.NoError(t, c.ProduceKeyed(ctx, topic, msgs...))

	hw, err := c.HighWatermarks(ctx, topic)
	require.NoError(t, err)
	var total int64
	for _, n := range hw {
		total += n
	}
	require.Equal(t, int64(keys*versions), total)

	ids := []int{0, 1, 2, 3}
	next := map[string]int{} // key -> next version expected
	for p := range partitions {
		for _, m := range readPartition(ctx, t, c, topic, p, 0, int(hw[p])) {
			require.Equal(t, p, kafka.Murmur2Balancer{}.Balance(m, ids...), "key %s", m.Key)
			require.Equal(t, fmt.Sprint(next[string(m.Key)]), string(m.Value), "key %s out of order", m.Key)
			next[string(m.Key)]++
		}
	}
	require.Len(t, next, keys)
}

// generation is what a member saw of one consumer-group generation.
type generation struct {
	member     string
	id         int32
	partitions []int
	offsets    map[int]int64 // committed offset per partition at the start (kafka.FirstOffset: none)
	committed  bool          // this member's commit in this generation went through
}

// runMember drives one kafka-go ConsumerGroup the way the projector does:
// Next, a worker per generation started with gen.Start, a commit bound to the
// generation, and back to Next when the generation ends. It reports every
// generation on out and returns when the group is closed.
func runMember(ctx context.Context, name, topic string, g *kafka.ConsumerGroup, out chan<- generation) {
	for {
		gen, err := g.Next(ctx)
		switch {
		case errors.Is(err, kafka.ErrGroupClosed), ctx.Err() != nil:
			return
		case err != nil:
			// Transient (REBALANCE_IN_PROGRESS from a join or sync that
			// raced a membership change): the group retries by itself.
			continue
		}
		seen := generation{member: name, id: gen.ID, offsets: map[int]int64{}}
		commit := map[int]int64{}
		for _, a := range gen.Assignments[topic] {
			seen.partitions = append(seen.partitions, a.ID)
			seen.offsets[a.ID] = a.Offset
			commit[a.ID] = 1
		}
		slices.Sort(seen.partitions)
		gen.Start(func(gctx context.Context) {
			seen.committed = commitInGeneration(gctx, gen, map[string]map[int]int64{topic: commit})
			select {
			case out <- seen:
			case <-gctx.Done():
				return
			}
			<-gctx.Done() // a partition worker runs until its generation ends
		})
	}
}

// commitInGeneration commits offsets, retrying while the broker answers
// REBALANCE_IN_PROGRESS: a member has its assignment as soon as its own
// SyncGroup returns, but the group is stable (and accepts commits) only when
// every member has synced. It gives up when the generation ends.
func commitInGeneration(gctx context.Context, gen *kafka.Generation, offsets map[string]map[int]int64) bool {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := gen.CommitOffsets(offsets)
		if err == nil {
			return true
		}
		if !errors.Is(err, kafka.RebalanceInProgress) {
			return false
		}
		select {
		case <-gctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// await reads generations until accept returns true for one, or fails t at
// the deadline.
func await(t *testing.T, gens <-chan generation, within time.Duration, what string, accept func(generation) bool) generation {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		select {
		case g := <-gens:
			t.Logf("%s: generation %d partitions %v offsets %v committed %v", g.member, g.id, g.partitions, g.offsets, g.committed)
			if accept(g) {
				return g
			}
		case <-deadline.C:
			t.Fatalf("no generation where %s within %v", what, within)
		}
	}
}

func TestConsumerGroupSplitsAndRebalances(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	c := kafkatest.New(t)
	topic := kafkatest.Topic(t, c, 6)
	cfg := c.GroupConfig(topic+"-group", topic)

	gens := make(chan generation, 64)
	var wg sync.WaitGroup
	var groups []*kafka.ConsumerGroup
	for _, name := range []string{"a", "b"} {
		g, err := kafka.NewConsumerGroup(cfg)
		require.NoError(t, err)
		groups = append(groups, g)
		wg.Go(func() { runMember(ctx, name, topic, g, gens) })
	}
	defer func() {
		for _, g := range groups {
			require.NoError(t, g.Close())
		}
		wg.Wait()
	}()

	// Two members join one after the other, so the first may own all six
	// for a generation before the second's join triggers a rebalance.
	start := time.Now()
	latest := map[string]generation{}
	split := await(t, gens, 10*time.Second, "a and b split six partitions", func(g generation) bool {
		latest[g.member] = g
		a, b := latest["a"], latest["b"]
		if a.id != b.id || a.id == 0 || !a.committed || !b.committed {
			return false
		}
		require.Len(t, a.partitions, 3, "range balancer gives each of two members three")
		require.Len(t, b.partitions, 3)
		require.ElementsMatch(t, []int{0, 1, 2, 3, 4, 5}, append(slices.Clone(a.partitions), b.partitions...))
		return true
	})
	t.Logf("split after %v", time.Since(start))

	// a leaves (ConsumerGroup.Close sends LeaveGroup): b's next heartbeat
	// sees the rebalance, and its next generation has all six, starting at
	// the offsets both members committed in the split generation.
	start = time.Now()
	require.NoError(t, groups[0].Close())
	all := await(t, gens, 10*time.Second, "b owns all six", func(g generation) bool {
		return g.member == "b" && g.id > split.id && len(g.partitions) == 6
	})
	t.Logf("b took over after %v", time.Since(start))
	for p := range 6 {
		require.Equal(t, int64(1), all.offsets[p], "p%d committed offset", p)
	}
}

func TestAddPartitions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	c := kafkatest.New(t)
	topic := kafkatest.Topic(t, c, 2)

	gens := make(chan generation, 64)
	g, err := kafka.NewConsumerGroup(c.GroupConfig(topic+"-group", topic))
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() { runMember(ctx, "a", topic, g, gens) })
	defer func() {
		require.NoError(t, g.Close())
		wg.Wait()
	}()
	first := await(t, gens, 10*time.Second, "a owns both partitions", func(g generation) bool {
		return len(g.partitions) == 2
	})

	require.NoError(t, c.AddPartitions(ctx, topic, 5))
	n, err := c.Partitions(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, 5, n)

	// A client with its own fresh transport sees five.
	client := &kafka.Client{Addr: kafka.TCP(c.Addrs()...), Transport: &kafka.Transport{}}
	defer client.Transport.(*kafka.Transport).CloseIdleConnections()
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	require.NoError(t, err)
	require.Len(t, md.Topics, 1)
	require.Len(t, md.Topics[0].Partitions, 5)

	// The cluster's own transport was refreshed: a new partition takes
	// records and lists its watermark at once.
	offs, err := c.Produce(ctx, topic, kafkatest.Record{Partition: 4, Value: []byte("x")})
	require.NoError(t, err)
	require.Equal(t, []int64{0}, offs)
	hw, err := c.HighWatermarks(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, map[int]int64{0: 0, 1: 0, 2: 0, 3: 0, 4: 1}, hw)

	// The group's partition watcher notices and rebalances.
	await(t, gens, 10*time.Second, "a owns five partitions", func(g generation) bool {
		return g.id > first.id && len(g.partitions) == 5
	})

	// Kafka never shrinks a topic.
	require.Error(t, c.AddPartitions(ctx, topic, 3))
}

func TestCreateTopic(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c := kafkatest.New(t, kafkatest.WithDefaultPartitions(3))

	require.NoError(t, c.CreateTopic(ctx, "defaults", 0))
	n, err := c.Partitions(ctx, "defaults")
	require.NoError(t, err)
	require.Equal(t, 3, n)

	require.Error(t, c.CreateTopic(ctx, "defaults", 2), "a topic that exists")

	// Automatic creation is off: producing to or asking for a topic that
	// was never created fails instead of making one.
	_, err = c.Produce(ctx, "never-created", kafkatest.Record{Partition: 0, Value: []byte("x")})
	require.Error(t, err)
	_, err = c.Partitions(ctx, "never-created")
	require.ErrorIs(t, err, kafka.UnknownTopicOrPartition)
}

func TestMultipleBrokers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c := kafkatest.New(t, kafkatest.WithBrokers(3))
	require.Len(t, c.Addrs(), 3)
	topic := kafkatest.Topic(t, c, 6)

	var recs []kafkatest.Record
	for p := range 6 {
		for range p + 1 {
			recs = append(recs, kafkatest.Record{Partition: p, Value: []byte("x")})
		}
	}
	_, err := c.Produce(ctx, topic, recs...)
	require.NoError(t, err)
	hw, err := c.HighWatermarks(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, map[int]int64{0: 1, 1: 2, 2: 3, 3: 4, 4: 5, 5: 6}, hw)
}

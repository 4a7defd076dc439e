package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/kafkatest"
)

// bareMember is a plain kafka-go group member in this process. kill makes
// it vanish as a SIGKILLed process does: its connections are closed under
// it and it can dial no more, so it sends no LeaveGroup.
type bareMember struct {
	name  string
	dead  atomic.Bool
	mu    sync.Mutex
	conns []net.Conn
	group *kafka.ConsumerGroup
	gen   atomic.Pointer[bareGen]
	done  chan struct{}
}

type bareGen struct {
	id    int32
	parts []int
	ended atomic.Bool
}

func startBareMember(name string, cfg kafka.ConsumerGroupConfig, logf func(string, ...any)) *bareMember {
	m := &bareMember{name: name, done: make(chan struct{})}
	cfg.Dialer = &kafka.Dialer{Timeout: 5 * time.Second, DialFunc: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if m.dead.Load() {
			return nil, errors.New("killed")
		}
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			m.mu.Lock()
			m.conns = append(m.conns, c)
			m.mu.Unlock()
		}
		return c, err
	}}
	g, err := kafka.NewConsumerGroup(cfg)
	if err != nil {
		panic(err) // the config is bareConfig's, checked by the test first
	}
	m.group = g
	go func() {
		defer close(m.done)
		for {
			gen, err := g.Next(context.Background())
			if errors.Is(err, kafka.ErrGroupClosed) {
				return
			}
			if err != nil {
				if !m.dead.Load() {
					logf("%s: next: %v", name, err)
				}
				continue
			}
			bg := &bareGen{id: gen.ID}
			for _, a := range gen.Assignments[cfg.Topics[0]] {
				bg.parts = append(bg.parts, a.ID)
			}
			sort.Ints(bg.parts)
			m.gen.Store(bg)
			logf("%s: generation %d partitions %v member %s", name, gen.ID, bg.parts, gen.MemberID[len(gen.MemberID)-6:])
			gen.Start(func(ctx context.Context) {
				<-ctx.Done()
				bg.ended.Store(true)
			})
		}
	}()
	return m
}

func (m *bareMember) kill() {
	m.dead.Store(true)
	m.mu.Lock()
	for _, c := range m.conns {
		c.Close()
	}
	m.mu.Unlock()
	m.group.Close()
	<-m.done
}

// TestGroupChurnBareKafkaGoSoak is the churn of TestFaultGroupChurn with
// plain kafka-go group members and no projector code: three members, one
// vanishing (connections cut, no LeaveGroup, as under SIGKILL) and replaced
// every 1-3 s for 15 s, four runs at once, each on its own kfake. It
// measures how long after the churn stops the three members hold every
// partition in one generation, and reports it; it asserts only that the
// members never hold a partition twice. It is kfake's share of the
// projector's convergence time (docs/reliability.md), a measurement run
// on request: -run Soak or PROJECTOR_SOAK=1.
func TestGroupChurnBareKafkaGoSoak(t *testing.T) {
	if os.Getenv("PROJECTOR_SOAK") == "" && !strings.Contains(strings.Join(os.Args, " "), "Soak") {
		t.Skip("soak: run with -run Soak (or PROJECTOR_SOAK=1 for every long variant)")
	}
	bareChurnSoak(t, func(t *testing.T) *kafkatest.Cluster { return kafkatest.New(t) })
}

// TestGroupChurnBareKafkaGoFixedSoak is TestGroupChurnBareKafkaGoSoak on
// the corrected kfake of TestFaultGroupChurn ([kfakeGroupFixes]), each
// run on a broker process of its own: how plain kafka-go members fare
// when the coordinator does what Kafka's does in those two places. It
// reports the times and asserts only that the members never hold a
// partition twice. Run on request: -run Soak or PROJECTOR_SOAK=1.
func TestGroupChurnBareKafkaGoFixedSoak(t *testing.T) {
	if os.Getenv("PROJECTOR_SOAK") == "" && !strings.Contains(strings.Join(os.Args, " "), "Soak") {
		t.Skip("soak: run with -run Soak (or PROJECTOR_SOAK=1 for every long variant)")
	}
	bareChurnSoak(t, fixedBroker)
}

// bareChurnSoak runs four bare churns at once, each on its own broker from
// newBroker, and logs how long each took to settle.
func bareChurnSoak(t *testing.T, newBroker func(*testing.T) *kafkatest.Cluster) {
	cfg := bareConfig("g", []string{"127.0.0.1:9092"}, "t")
	require.NoError(t, cfg.Validate())
	const runs = 4
	window := 3 * time.Minute
	results := make([]string, runs)
	var wg sync.WaitGroup
	for r := range runs {
		// The broker and topic are made here: they fail the test with
		// t.Fatal, which only the test's goroutine may call.
		c := newBroker(t)
		topic := kafkatest.Topic(t, c, 6)
		wg.Go(func() { results[r] = bareChurn(t, c, topic, uint64(r), window) })
	}
	wg.Wait()
	for r, res := range results {
		t.Logf("MEASURED run %d: %s", r, res)
	}
}

// bareConfig is a bare member's group config, with the churn tests'
// timings and kafka-go's other defaults.
func bareConfig(group string, brokers []string, topic string) kafka.ConsumerGroupConfig {
	return kafka.ConsumerGroupConfig{
		ID: group, Brokers: brokers, Topics: []string{topic},
		HeartbeatInterval: churnHeartbeat, SessionTimeout: churnSession, RebalanceTimeout: churnRebalance,
		JoinGroupBackoff: churnBackoff,
	}
}

// bareChurn runs one churn and says how long the group took to settle.
func bareChurn(t *testing.T, c *kafkatest.Cluster, topic string, seed uint64, window time.Duration) string {
	group := "g-" + topic
	start := time.Now()
	var logMu sync.Mutex
	logf := func(format string, args ...any) {
		logMu.Lock()
		defer logMu.Unlock()
		t.Logf("run %d %6.1fs %s", seed, time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	cfg := bareConfig(group, c.Addrs(), topic)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), seed))
	members := make([]*bareMember, 3)
	n := 0
	for i := range members {
		members[i] = startBareMember(fmt.Sprintf("m%d", n), cfg, logf)
		n++
	}
	defer func() {
		for _, m := range members {
			m.kill()
		}
	}()
	time.Sleep(5 * time.Second) // the group forms; the churn starts from a stable group or not, either is a churn
	until := time.Now().Add(churnFor)
	for time.Now().Before(until) {
		time.Sleep(time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))) // the churn's pace
		i := rng.IntN(3)
		logf("kill %s", members[i].name)
		members[i].kill()
		members[i] = startBareMember(fmt.Sprintf("m%d", n), cfg, logf)
		n++
	}
	stopped := time.Now()
	logf("churn stopped")
	w := &groupWatch{t: t, start: start, group: group, cl: &kafka.Client{Addr: kafka.TCP(c.Addrs()...)}}
	for time.Since(stopped) < window {
		w.poll()
		var ids []int32
		var parts []int
		for _, m := range members {
			if g := m.gen.Load(); g != nil && !g.ended.Load() {
				ids = append(ids, g.id)
				parts = append(parts, g.parts...)
			}
		}
		sort.Ints(parts)
		if len(ids) == 3 && ids[0] == ids[1] && ids[1] == ids[2] {
			if len(slices.Compact(slices.Clone(parts))) != len(parts) {
				// Errorf, not a require: this runs on the run's own goroutine.
				t.Errorf("run %d: a partition held twice in generation %d: %v", seed, ids[0], parts)
				return "a partition held twice"
			}
			if len(parts) == 6 {
				took := time.Since(stopped)
				verdict := "within"
				if took > churnBound {
					verdict = "OVER"
				}
				return fmt.Sprintf("settled %.1fs after the churn stopped (%s the bound %s)", took.Seconds(), verdict, churnBound)
			}
		}
		time.Sleep(100 * time.Millisecond) // polling, with the window above
	}
	return fmt.Sprintf("NOT settled %s after the churn stopped (%s)", window, w.last)
}

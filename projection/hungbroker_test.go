package projection

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector/projector/internal/testkit/faulttest"
	"github.com/projector/projector/internal/testkit/kafkatest"
	"github.com/projector/projector/internal/testkit/pgtest"
)

// One broker of three accepts connections and never answers, first in
// --brokers, while it leads no partition. Before, the leader lookup spent
// its whole budget on it and gave up without asking the others, and
// kafka-go's consumer group joined through it for ever once the
// coordinator moved. The projection keeps up, /readyz stays ready, and
// the log names the broker once.
func TestAHungBrokerIsWorkedAround(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// moved: the group's coordinator is on the broker when it hangs,
		// and moves off it.
		moved bool
	}{{"coordinator on a live broker", false}, {"coordinator moved off the hung broker", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			gates := map[string]*faulttest.Gate{}
			listen := func(network, address string) (net.Listener, error) {
				g := faulttest.NewGate()
				ln, err := g.Listener()(network, address)
				if err == nil {
					mu.Lock()
					gates[ln.Addr().String()] = g
					mu.Unlock()
				}
				return ln, err
			}
			c := kafkatest.New(t, kafkatest.WithBrokers(3), kafkatest.WithKfakeOptions(kfake.ListenFn(listen)))
			kf := c.Kfake()
			r := &rig{t: t, kafka: c, topic: kafkatest.Topic(t, c, 4), store: pgtest.Store(t), parts: 4}
			hung := c.Addrs()[0]
			gate := gates[hung]
			require.NotNil(t, gate)
			t.Cleanup(gate.Restore)
			for p := range int32(4) {
				if kf.LeaderFor(r.topic, p) == 0 {
					require.NoError(t, kf.MoveTopicPartition(r.topic, p, 1+p%2))
				}
			}
			group := r.topic + "-group"
			onHung := func() bool { return kf.CoordinatorFor(group) == 0 }
			for i := 0; onHung() != tc.moved; i++ {
				require.Less(t, i, 1000, "no coordinator placement found")
				kf.RehashCoordinators()
			}

			var logs lockedBuffer
			cfg := r.config(func(c *Config) {
				c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
			})
			if !tc.moved {
				gate.Stall()
			}
			run := r.start(cfg)
			// The test's own clients know only the live brokers.
			cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()[1:]...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
			require.NoError(t, err)
			defer cl.Close()
			produced := map[int]int64{}
			produce := func(round int) {
				var recs []*kgo.Record
				for i := range 20 {
					job := fmt.Sprintf("j-%d-%d", round, i)
					recs = append(recs, &kgo.Record{Topic: r.topic, Partition: int32(i % 4), Key: []byte(job), Value: []byte(snap(job, 1, `{}`))})
					produced[i%4]++
				}
				require.NoError(t, cl.ProduceSync(t.Context(), recs...).FirstErr())
			}
			caughtUp := func() {
				r.eventually(60*time.Second, "every record produced is projected", func() (bool, string) {
					pos := r.positions()
					for p, n := range produced {
						if pos[p].NextOffset != n {
							return false, fmt.Sprintf("partition %d at %d of %d", p, pos[p].NextOffset, n)
						}
					}
					return true, ""
				})
			}
			produce(0)
			caughtUp()
			if tc.moved {
				gate.Stall()
				for i := 0; onHung(); i++ {
					require.Less(t, i, 1000)
					kf.RehashCoordinators()
				}
			}
			// Records keep coming while the broker hangs; readiness is
			// watched all along once the engine is in a generation again.
			deadline := time.Now().Add(8 * time.Second)
			for round := 1; time.Now().Before(deadline); round++ {
				produce(round)
				time.Sleep(300 * time.Millisecond) // pacing the producer, not synchronising
			}
			caughtUp()
			notReady := 0
			for range 20 {
				if !run.p.Readiness().OK {
					notReady++
				}
				time.Sleep(50 * time.Millisecond) // sampling readiness
			}
			require.Zero(t, notReady, "ready while the hung broker leads nothing: %+v", run.p.Readiness())
			out := logs.String()
			require.Equal(t, 1, strings.Count(out, "Kafka broker does not answer"), out)
			require.Contains(t, out, hung)
		})
	}
}

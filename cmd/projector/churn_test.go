package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/projector/projector/internal/testkit/faulttest"
	"github.com/projector/projector/internal/testkit/kafkatest"
)

// Group timings of the churn tests: short, so a test is quick, with the
// rebalance timeout above the session timeout as in the defaults.
const (
	churnSession   = 6 * time.Second
	churnRebalance = 10 * time.Second
	churnHeartbeat = time.Second
	churnBackoff   = 2 * time.Second
	// churnFor is how long one instance is killed and replaced every 1-3 s.
	churnFor = 15 * time.Second
	// churnWindow is how long the survivors are watched after the
	// churn: four times the bound, and more than a survivor's cycle of
	// failed joins (kafka-go's 5 s network timeout + the rebalance timeout
	// + the join backoff), so a loop of them shows.
	churnWindow = 4 * churnBound
)

// churnBound is the documented bound on convergence after churn stops: the
// session timeout (the killed members expire), the rebalance timeout (the
// coordinator's last wait for a join), and a few seconds.
const churnBound = churnSession + churnRebalance + 5*time.Second

// groupWatch logs how the broker sees the group, each change once.
type groupWatch struct {
	t     *testing.T
	start time.Time
	group string
	cl    *kafka.Client
	last  string
}

func (w *groupWatch) poll() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := w.cl.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{w.group}})
	if err != nil || len(resp.Groups) != 1 {
		return
	}
	var ms []string
	for _, m := range resp.Groups[0].Members {
		ms = append(ms, m.MemberID[max(0, len(m.MemberID)-6):])
	}
	sort.Strings(ms)
	s := fmt.Sprintf("broker: group %s, %d members %v", resp.Groups[0].GroupState, len(ms), ms)
	if s != w.last {
		w.t.Logf("%6.1fs %s", time.Since(w.start).Seconds(), s)
		w.last = s
	}
}

// Three instances; one is killed (SIGKILL) and replaced every 1-3 s for
// 15 s, then the churn stops. The survivors must work every partition,
// each once, in one generation, within the documented bound (session
// timeout + rebalance timeout + 5 s) of the churn's end, and the stream
// must be projected with every invariant kept (nothing lost, nothing
// applied twice, no version going back).
//
// The broker is kfake with the two edits of [kfakeGroupFixes], in its own
// process: as go.mod has it, kfake's classic group coordinator gives no
// session to a member that died while its JoinGroup was parked (once the
// group is stable, it stays a member until some other change rebalances
// the group) and expires members waiting in JoinGroup, which a Kafka
// broker does not do, and
// then misses the bound with bare kafka-go members too
// (TestFaultGroupChurnStockSoak, TestGroupChurnBareKafkaGoSoak,
// docs/reliability.md). That broker is built before the test goes parallel,
// so its compile (about 8 s) does not compete with timing-sensitive tests.
//
// Measured on the corrected broker: 4.3 to 10.6 s over 11 runs (3.5 and
// 6.0 s in two later runs). The worst case expected is about 18 s: a
// rebalance that waits its full 10 s timer for a join that never comes,
// then the 6 s session of a member that died just after that join was
// answered, then a rejoin of the survivors; under the 21 s bound.
func TestFaultGroupChurn(t *testing.T) {
	fixedBrokerBin(t)
	t.Parallel()
	took, settled := groupChurn(t, fixedBroker(t))
	require.True(t, settled, "the survivors did not work every partition within %s of the churn's end", churnWindow)
	require.LessOrEqual(t, took, churnBound, "the survivors took %.1fs after the churn stopped to work every partition; the bound is %s (session %s + rebalance %s + 5s)",
		took.Seconds(), churnBound, churnSession, churnRebalance)
}

// TestFaultGroupChurnStockSoak is the churn of TestFaultGroupChurn on kfake
// as go.mod has it, in this process. It measures how long the survivors
// take and reports it; it asserts the invariants only, as that kfake does
// not reliably meet the bound (docs/reliability.md). Run on request: -run
// Soak or PROJECTOR_SOAK=1.
func TestFaultGroupChurnStockSoak(t *testing.T) {
	if os.Getenv("PROJECTOR_SOAK") == "" && !strings.Contains(strings.Join(os.Args, " "), "Soak") {
		t.Skip("soak: run with -run Soak (or PROJECTOR_SOAK=1 for every long variant)")
	}
	t.Parallel()
	groupChurn(t, kafkatest.New(t))
}

// groupChurn churns three instances on the broker c, and says how long
// after the churn stopped the survivors worked every partition (settled),
// logging it against the bound. When the window passes without that, two
// survivors are stopped (SIGTERM), which ends the loop of rejoins stock
// kfake can fall into, and the last one must then work every partition
// alone. Either way the stream must be projected with every invariant kept.
func groupChurn(t *testing.T, c *kafkatest.Cluster) (took time.Duration, settled bool) {
	s := newFaultStoryOn(t, c, 800, 400, 6)
	wait := s.flow(10, 100*time.Millisecond)
	args := func(owner string) []string {
		return s.args(owner,
			"--group-session-timeout", churnSession.String(), "--group-rebalance-timeout", churnRebalance.String(),
			"--group-heartbeat-interval", churnHeartbeat.String(), "--group-join-backoff", churnBackoff.String())
	}
	start := time.Now()
	w := &groupWatch{t: t, start: start, group: s.group, cl: &kafka.Client{Addr: kafka.TCP(s.kafka.Addrs()...)}}
	n := 0
	launch := func() (*proc, string) {
		p := startBin(t, fmt.Sprintf("run %d", n), dbEnv(), args(fmt.Sprintf("inst-%d", n))...)
		n++
		return p, p.httpAddr(15 * time.Second)
	}
	procs, addrs := make([]*proc, 3), make([]string, 3)
	for i := range procs {
		procs[i], addrs[i] = launch()
	}
	// working says whether procs, in one generation, work every
	// partition once.
	working := func() (bool, string) {
		var all []int
		var gens []int32
		for i, addr := range addrs {
			procs[i].requireAlive()
			st, err := fetchStatus(addr)
			if err != nil {
				return false, err.Error()
			}
			all = append(all, st.owned()...)
			gens = append(gens, st.Generation)
		}
		sort.Ints(all)
		ok := slices.Equal(all, []int{0, 1, 2, 3, 4, 5}) && !slices.ContainsFunc(gens, func(g int32) bool { return g != gens[0] })
		return ok, fmt.Sprintf("generations %v, partitions %v", gens, all)
	}
	eventually(t, 2*churnBound, "the three instances share the partitions", working)

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 800))
	until := time.Now().Add(churnFor)
	// stopped is when the last replacement started, taken before the
	// poll of the broker (up to 2 s) so that poll is not counted as the
	// survivors' time.
	var stopped time.Time
	for time.Now().Before(until) {
		time.Sleep(time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))) // the churn's pace, not a synchronisation
		i := rng.IntN(len(procs))
		require.NoError(t, procs[i].cmd.Process.Kill())
		<-procs[i].done
		t.Logf("%6.1fs killed %s", time.Since(start).Seconds(), procs[i].name)
		procs[i], addrs[i] = launch()
		stopped = time.Now()
		w.poll()
	}
	t.Logf("%6.1fs churn stopped; survivors %s, %s, %s", stopped.Sub(start).Seconds(), procs[0].name, procs[1].name, procs[2].name)

	var last string
	for time.Since(stopped) < churnWindow {
		w.poll()
		ok, msg := working()
		if ok {
			took = time.Since(stopped)
			verdict := "within"
			if took > churnBound {
				verdict = "OVER"
			}
			t.Logf("MEASURED: the survivors work every partition %.1fs after the churn stopped (%s the bound %s = session %s + rebalance %s + 5s)",
				took.Seconds(), verdict, churnBound, churnSession, churnRebalance)
			settled = true
			break
		}
		if msg != last {
			t.Logf("%6.1fs survivors: %s", time.Since(start).Seconds(), msg)
			last = msg
		}
		time.Sleep(200 * time.Millisecond) // polling the status, within the window above
	}
	if !settled {
		t.Logf("MEASURED: NOT settled %s after the churn stopped (%s); stopping two survivors", churnWindow, w.last)
		procs[1].stop(stopWithin)
		procs[2].stop(stopWithin)
		procs, addrs = procs[:1], addrs[:1]
		eventually(t, churnWindow, procs[0].name+" works every partition", working)
	}

	wait()
	s.hist.Settled(2*time.Minute, alive(procs...)...)
	for _, p := range procs {
		p.stop(stopWithin)
	}
	s.hist.Check(s.ref, faulttest.Options{})
	return took, settled
}

// An instance waits for its JoinGroup longer than a coordinator may hold
// it: answered only after the rebalance timeout + 2 s (Kafka holds a join
// at most the rebalance timeout), the join is taken, not abandoned and
// sent again as a new member (which on kfake restarts the rebalance's
// wait; see TestFaultGroupChurn). kafka-go gives a JoinGroup the
// rebalance timeout + 5 s; the projector must not shorten that.
func TestGroupJoinOutwaitsRebalanceTimeout(t *testing.T) {
	t.Parallel()
	const rebalance = 4 * time.Second
	s := newFaultStory(t, 810, 20, 2)
	s.produceAll()
	kf := s.kafka.Kfake()
	var joins atomic.Int32
	var held atomic.Bool
	kf.ControlKey(kmsg.JoinGroup.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		if req.(*kmsg.JoinGroupRequest).Group != s.group {
			return nil, nil, false
		}
		joins.Add(1)
		if held.CompareAndSwap(false, true) {
			kf.SleepControl(func() { time.Sleep(rebalance + 2*time.Second) }) // the coordinator's delay under test
		}
		return nil, nil, false
	})
	a := startBin(t, "run a", dbEnv(), s.args("inst-a", "--group-rebalance-timeout", rebalance.String())...)
	s.hist.Settled(90*time.Second, alive(a)...)
	a.stop(stopWithin)
	require.True(t, held.Load(), "the first JoinGroup was held")
	require.Equal(t, int32(1), joins.Load(), "JoinGroup requests: the held one must be waited for\n%s", a.logs.String())
	require.NotContains(t, a.logs.String(), "i/o timeout")
	s.hist.Check(s.ref, faulttest.Options{})
}

package main

// The fault suite against the built binary: faults where a process must
// die, stop or be replaced. Each test produces a generated stream with a
// fixed seed, injects the fault, lets the projection heal, and checks the
// invariants of internal/testkit/faulttest over the whole history. The kill points
// inside the engine are failpoints, compiled only into a second build of
// the binary made with -tags failpoints (internal/buildhook/failpoint).
//
// PROJECTOR_SOAK=1 (or -run Soak) runs the long variants: more seeds and a
// longer rebalance storm.

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/app/jobgen"
	"github.com/projector/projector/internal/buildhook/failpoint"
	"github.com/projector/projector/internal/testkit/faulttest"
	"github.com/projector/projector/internal/testkit/kafkatest"
	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

var (
	fpOnce sync.Once
	fpBin  string
	fpErr  error
)

// failpointBin is the binary built with -tags failpoints, once per test
// binary, beside the product build.
func failpointBin(t *testing.T) string {
	t.Helper()
	fpOnce.Do(func() {
		fpBin = filepath.Join(filepath.Dir(bin), "projector-failpoints")
		build := exec.Command("go", "build", "-tags", "failpoints", "-o", fpBin, ".")
		out, err := build.CombinedOutput()
		if err != nil {
			fpErr = fmt.Errorf("go build -tags failpoints: %v\n%s", err, out)
		}
	})
	require.NoError(t, fpErr)
	return fpBin
}

// soak reports whether the long variants run.
func soak(t *testing.T) bool {
	return os.Getenv("PROJECTOR_SOAK") != "" || strings.Contains(t.Name(), "Soak")
}

// seeds are the default seeds, or more of them in a soak.
func seeds(t *testing.T, base uint64, n, soakN int) []uint64 {
	if soak(t) {
		n = soakN
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i)
	}
	return out
}

// faultStory is a generated stream on a topic, a migrated schema whose
// history is watched, and a truthful authority.
type faultStory struct {
	t      *testing.T
	kafka  *kafkatest.Cluster
	topic  string
	group  string
	schema string
	stream *jobgen.Stream
	ref    *faulttest.Reference
	hist   *faulttest.History
	auth   string
}

func newFaultStory(t *testing.T, seed uint64, jobs, partitions int) *faultStory {
	t.Helper()
	return newFaultStoryOn(t, kafkatest.New(t), seed, jobs, partitions)
}

// newFaultStoryOn is [newFaultStory] on the broker c.
func newFaultStoryOn(t *testing.T, c *kafkatest.Cluster, seed uint64, jobs, partitions int) *faultStory {
	t.Helper()
	topic := kafkatest.Topic(t, c, partitions)
	schema := pgtest.Schema(t)
	st, err := store.New(pgtest.Pool(t), store.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, st.Migrate(context.Background()))
	stream := jobgen.Generate(jobgen.Config{
		Seed: seed, Jobs: jobs, EventsPerJob: 12, Partitions: partitions,
		LateRate: 0.2, DuplicateRate: 0.2, MissingRate: 0.05, MisrouteRate: 0.05, BadRate: 0.05, DeleteRate: 0.1,
	})
	auth := httptest.NewServer(jobgen.NewAuthority(stream.Truth))
	t.Cleanup(auth.Close)
	s := &faultStory{t: t, kafka: c, topic: topic, group: "g-" + topic, schema: schema, stream: stream,
		ref: faulttest.ReferenceOf(stream), auth: auth.URL}
	s.hist = faulttest.Watch(t, faulttest.Target{Pool: pgtest.Pool(t), Schema: schema, Kafka: c, Topic: topic, Group: s.group})
	t.Logf("seed %d: %d jobs, %d records on %d partitions, faults %+v", seed, jobs, len(stream.Records), partitions, stream.Faults)
	return s
}

// args are a run's arguments: small batches, short group timings, the
// authority on, gaps sent to re-read and the authority at once.
func (s *faultStory) args(owner string, extra ...string) []string {
	return append([]string{"run",
		"--brokers", strings.Join(s.kafka.Addrs(), ","), "--topic", s.topic, "--group", s.group, "--schema", s.schema,
		"--http-addr", "127.0.0.1:0", "--owner", owner, "--log-format", "json",
		"--batch-size", "20", "--batch-linger", "10ms", "--snapshot-url", s.auth, "--gap-wait", "0",
		"--group-heartbeat-interval", "100ms", "--group-session-timeout", "2s",
		"--group-rebalance-timeout", "2s", "--group-join-backoff", "100ms",
	}, extra...)
}

// produce produces records [from, to) of the stream.
func (s *faultStory) produce(from, to int) {
	s.t.Helper()
	recs := make([]kafkatest.Record, 0, to-from)
	for _, r := range s.stream.Records[from:to] {
		recs = append(recs, kafkatest.Record{Partition: r.Partition, Key: r.Key, Value: r.Value})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := s.kafka.Produce(ctx, s.topic, recs...)
	require.NoError(s.t, err)
}

func (s *faultStory) produceAll() { s.produce(0, len(s.stream.Records)) }

// flow produces the stream in chunks in the background; wait blocks
// until it is all produced.
func (s *faultStory) flow(chunk int, every time.Duration) (wait func()) {
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	wg.Go(func() {
		n := len(s.stream.Records)
		for i := 0; i < n; i += chunk {
			recs := make([]kafkatest.Record, 0, chunk)
			for _, r := range s.stream.Records[i:min(i+chunk, n)] {
				recs = append(recs, kafkatest.Record{Partition: r.Partition, Key: r.Key, Value: r.Value})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			_, err := s.kafka.Produce(ctx, s.topic, recs...)
			cancel()
			if err != nil {
				errc <- err
				return
			}
			time.Sleep(every) // pacing the producer, not synchronising
		}
	})
	return func() {
		s.t.Helper()
		wg.Wait()
		select {
		case err := <-errc:
			s.t.Fatalf("producing the stream: %v", err)
		default:
		}
	}
}

// committed is how many records the stored positions cover.
func (s *faultStory) committed() int64 {
	s.t.Helper()
	pos, err := s.hist.Positions(context.Background())
	require.NoError(s.t, err)
	var n int64
	for _, at := range pos {
		n += max(at, 0)
	}
	return n
}

func (s *faultStory) waitCommitted(n int64, within time.Duration, procs ...*proc) {
	s.t.Helper()
	eventually(s.t, within, fmt.Sprintf("%d records committed", n), func() (bool, string) {
		for _, p := range procs {
			p.requireAlive()
		}
		got := s.committed()
		return got >= n, fmt.Sprintf("%d committed", got)
	})
}

// alive turns procs into the liveness checks of [faulttest.History.Settled].
func alive(procs ...*proc) []func() error {
	var out []func() error
	for _, p := range procs {
		out = append(out, func() error {
			if p.exited() {
				return fmt.Errorf("%s exited with %d\n%s", p.name, p.code, p.logs.String())
			}
			return nil
		})
	}
	return out
}

// waitExit waits for p to exit by itself.
func waitExit(t *testing.T, p *proc, within time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("%s did not exit within %s\n%s", p.name, within, p.logs.String())
	}
}

// A process killed with SIGKILL at each chosen point of the engine: before
// a batch transaction commits, between the PostgreSQL commit and the
// group commit, during a gap attempt, and right after a claim. The next
// instance goes on from the stored positions: nothing is lost, nothing is
// applied twice, no version goes back, and the group's offset never
// passes the stored position.
func TestFaultKilledAtFailpoints(t *testing.T) {
	t.Parallel()
	exe := failpointBin(t)
	points := []struct {
		name string
		at   func(seed uint64) int
	}{
		{failpoint.BeforeCommit, func(seed uint64) int { return 3 + int(seed%5) }},
		{failpoint.AfterCommit, func(seed uint64) int { return 3 + int(seed%5) }},
		{failpoint.GapAttempt, func(seed uint64) int { return 1 + int(seed%2) }},
		{failpoint.Claimed, func(seed uint64) int { return 2 }},
	}
	for i, pt := range points {
		for _, seed := range seeds(t, 100+uint64(10*i), 1, 5) {
			t.Run(fmt.Sprintf("%s/seed%d", pt.name, seed), func(t *testing.T) {
				t.Parallel()
				s := newFaultStory(t, seed, 100, 3)
				s.produceAll()
				arm := fmt.Sprintf("%s=%d", pt.name, pt.at(seed))
				a := startExe(t, exe, "run a ("+arm+")", dbEnv(failpoint.Env+"="+arm), s.args("inst-a")...)
				waitExit(t, a, 60*time.Second)
				require.Equal(t, -1, a.code, "killed by a signal\n%s", a.logs.String())
				require.Contains(t, a.logs.String(), "failpoint "+pt.name+": SIGKILL")

				b := startBin(t, "run b", dbEnv(), s.args("inst-b")...)
				s.hist.Settled(90*time.Second, alive(b)...)
				b.stop(stopWithin)
				s.hist.Check(s.ref, faulttest.Options{})
			})
		}
	}
}

// SIGTERM while the instance has lag: it finishes or abandons its batch in
// flight, commits, and exits 0 within the shutdown grace; the group's
// offsets equal the stored positions; the next instance loses nothing.
func TestFaultSigtermUnderLoad(t *testing.T) {
	t.Parallel()
	for _, seed := range seeds(t, 200, 1, 3) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			s := newFaultStory(t, seed, 300, 3)
			s.produceAll()
			a := startBin(t, "run a", dbEnv(), s.args("inst-a")...)
			s.waitCommitted(100, joinWithin, a)
			lag, err := s.hist.Lag(context.Background())
			require.NoError(t, err)
			t.Logf("SIGTERM with lag %v", lag)
			a.stop(20 * time.Second) // the shutdown grace is 15 s
			s.hist.CommitsCaughtUp(5 * time.Second)

			b := startBin(t, "run b", dbEnv(), s.args("inst-b")...)
			s.hist.Settled(90*time.Second, alive(b)...)
			b.stop(stopWithin)
			s.hist.Check(s.ref, faulttest.Options{})
		})
	}
}

// Three instances share six partitions while the stream flows; each in
// turn gets SIGTERM and is replaced by a new one, which must take
// partitions before the next goes.
func TestFaultRollingRestartsOfThree(t *testing.T) {
	t.Parallel()
	s := newFaultStory(t, 300, 200, 6)
	wait := s.flow(20, 30*time.Millisecond)
	procs := make([]*proc, 3)
	addrs := make([]string, 3)
	for i := range procs {
		procs[i] = startBin(t, fmt.Sprintf("run %d", i), dbEnv(), s.args(fmt.Sprintf("inst-%d", i))...)
		addrs[i] = procs[i].httpAddr(15 * time.Second)
	}
	owns := func(addr string) int {
		st, err := fetchStatus(addr)
		if err != nil {
			return 0
		}
		return len(st.Partitions)
	}
	for i := range procs {
		procs[i].stop(stopWithin)
		next := startBin(t, fmt.Sprintf("run %d'", i), dbEnv(), s.args(fmt.Sprintf("inst-%d-b", i))...)
		addr := next.httpAddr(15 * time.Second)
		eventually(t, 2*joinWithin, next.name+" takes partitions", func() (bool, string) {
			next.requireAlive()
			n := owns(addr)
			return n > 0, fmt.Sprintf("owns %d", n)
		})
		procs[i], addrs[i] = next, addr
	}
	wait()
	s.hist.Settled(90*time.Second, alive(procs...)...)
	for _, p := range procs {
		p.stop(stopWithin)
	}
	s.hist.Check(s.ref, faulttest.Options{})
}

// stopped reports whether the process is stopped by a signal (state T in
// /proc).
func stopped(p *proc) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces, the state follows the
	// last parenthesis.
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && len(b) > i+2 && b[i+2] == 'T'
}

// A zombie: instance a freezes (SIGSTOP, from a failpoint) with a planned
// batch in flight, past its session timeout; its partitions move to b,
// which projects the stream. Resumed (SIGCONT), a's batch is refused (by
// the fence, or abandoned after PostgreSQL ended its idle transaction),
// nothing regresses, and a rejoins.
func TestFaultZombieStoppedPastSessionTimeout(t *testing.T) {
	t.Parallel()
	exe := failpointBin(t)
	s := newFaultStory(t, 400, 150, 3)
	a := startExe(t, exe, "run a", dbEnv(failpoint.Env+"="+failpoint.Planned+"=4:stop"), s.args("inst-a")...)
	b := startBin(t, "run b", dbEnv(), s.args("inst-b")...)
	addrA, addrB := a.httpAddr(15*time.Second), b.httpAddr(15*time.Second)
	eventually(t, 2*joinWithin, "both instances own partitions", func() (bool, string) {
		a.requireAlive()
		b.requireAlive()
		sa, errA := fetchStatus(addrA)
		sb, errB := fetchStatus(addrB)
		if errA != nil || errB != nil {
			return false, fmt.Sprint(errA, errB)
		}
		return len(sa.Partitions) > 0 && len(sb.Partitions) > 0, fmt.Sprintf("a %v, b %v", sa.owned(), sb.owned())
	})
	s.produceAll()
	// The line is written just before the signal; the copier of a's
	// stderr may pass it on after a has stopped.
	eventually(t, joinWithin, "a freezes with a batch in flight", func() (bool, string) {
		return stopped(a) && strings.Contains(a.logs.String(), "failpoint "+failpoint.Planned+": SIGSTOP"), "running"
	})
	eventually(t, 2*joinWithin, "b owns every partition", func() (bool, string) {
		b.requireAlive()
		sb, err := fetchStatus(addrB)
		if err != nil {
			return false, err.Error()
		}
		return slices.Equal(sortedInts(sb.owned()), []int{0, 1, 2}), fmt.Sprintf("b owns %v", sb.owned())
	})
	s.hist.Settled(90*time.Second, alive(b)...)

	// a's frozen batch must not commit. What refuses it depends on how
	// long it stayed frozen: the fence (b's claim moved the epoch), or
	// PostgreSQL ending its idle transaction (--idle-in-transaction-timeout)
	// with the generation gone by then, so the batch is abandoned. Either
	// way the invariants below show that nothing of it regressed a row.
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	eventually(t, joinWithin, "a's batch is refused", func() (bool, string) {
		a.requireAlive()
		l := a.logs.String()
		return strings.Contains(l, "fenced") || strings.Contains(l, "batch abandoned"), "neither a fence nor an abandoned batch in a's log yet"
	})
	s.hist.Settled(90*time.Second, alive(a, b)...)
	a.stop(stopWithin)
	b.stop(stopWithin)
	s.hist.Check(s.ref, faulttest.Options{})
}

// A rebalance storm: while the stream flows, instances join and leave
// (SIGTERM, or SIGKILL every other time) every few seconds beside one that
// stays. The default run churns four times at 5 s (kfake with kafka-go
// settles slowly after faster churn); the soak churns for two minutes.
func TestFaultRebalanceStorm(t *testing.T) {
	t.Parallel()
	events, every := 4, 5*time.Second
	if soak(t) {
		events = 24
	}
	s := newFaultStory(t, 500, 300, 6)
	wait := s.flow(10, 40*time.Millisecond)
	steady := startBin(t, "run steady", dbEnv(), s.args("inst-steady")...)
	var churn []*proc
	for i := range events {
		time.Sleep(every) // the storm's pace, not a synchronisation
		steady.requireAlive()
		if i%2 == 0 {
			churn = append(churn, startBin(t, fmt.Sprintf("run churn-%d", i), dbEnv(), s.args(fmt.Sprintf("inst-churn-%d", i))...))
			continue
		}
		p := churn[len(churn)-1]
		churn = churn[:len(churn)-1]
		if i%4 == 1 {
			p.stop(stopWithin)
		} else {
			require.NoError(t, p.cmd.Process.Kill())
			<-p.done
		}
	}
	wait()
	s.hist.Settled(3*time.Minute, alive(append([]*proc{steady}, churn...)...)...)
	for _, p := range append(churn, steady) {
		p.stop(stopWithin)
	}
	s.hist.Check(s.ref, faulttest.Options{})
}

// TestFaultRebalanceStormSoak is the long storm, run only when asked.
func TestFaultRebalanceStormSoak(t *testing.T) {
	if !soak(t) || !strings.Contains(strings.Join(os.Args, " "), "Soak") {
		t.Skip("soak: run with -run Soak (or PROJECTOR_SOAK=1 for every long variant)")
	}
	TestFaultRebalanceStorm(t)
}

// PostgreSQL unreachable at start-up: run stays up and waits, logging
// that the server (named) does not answer; once the path is back it
// starts by itself, without a restart, and projects everything.
func TestFaultDatabaseUnreachableAtStartup(t *testing.T) {
	t.Parallel()
	s := newFaultStory(t, 600, 60, 3)
	s.produceAll()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	proxy := faulttest.NewProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	url := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&connect_timeout=2", cfg.ConnConfig.User, proxy.Addr(), cfg.ConnConfig.Database)
	proxy.Cut()
	a := startBin(t, "run a", baseEnv("DATABASE_URL="+url), s.args("inst-a")...)
	eventually(t, 30*time.Second, "a waits for PostgreSQL", func() (bool, string) {
		a.requireAlive()
		return strings.Contains(a.logs.String(), "PostgreSQL does not answer at start"), a.logs.String()
	})
	require.Contains(t, a.logs.String(), proxy.Addr(), "the message names the server")

	proxy.Restore()
	s.hist.Settled(90*time.Second, alive(a)...)
	a.stop(stopWithin)
	s.hist.Check(s.ref, faulttest.Options{})
}

// SIGTERM while run is still starting, waiting for another instance's
// migration (the test holds the schema's migration lock): a clean stop, exit 0,
// as for a running instance. Found by the rebalance storm, where an
// instance stopped seconds after it started on a loaded machine exited 1.
func TestFaultSigtermWhileStarting(t *testing.T) {
	t.Parallel()
	s := newFaultStory(t, 700, 10, 1)
	ctx := context.Background()
	// A run on current tables takes no migration lock: make them behind.
	_, err := pgtest.Pool(t).Exec(ctx, `DELETE FROM `+pgx.Identifier{s.schema, "projector_migrations"}.Sanitize()+
		` WHERE name = (SELECT max(name) FROM `+pgx.Identifier{s.schema, "projector_migrations"}.Sanitize()+`)`)
	require.NoError(t, err)
	conn, err := pgtest.Pool(t).Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('projector.migrate:' || $1, 0))`, s.schema)
	require.NoError(t, err)
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			_, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended('projector.migrate:' || $1, 0))`, s.schema)
			require.NoError(t, err)
		}
	}
	defer unlock()

	// Other tests' instances wait for the same lock: only this one's
	// backend, named by PGAPPNAME, says that a is waiting (and so is
	// running, with its signal handler in place).
	app := fmt.Sprintf("sigterm-while-starting-%d", os.Getpid())
	a := startBin(t, "run a", dbEnv("PGAPPNAME="+app), s.args("inst-a")...)
	eventually(t, 15*time.Second, "run waits for the migration lock", func() (bool, string) {
		a.requireAlive()
		var waiting int
		err := pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity s USING (pid)
			WHERE l.locktype = 'advisory' AND NOT l.granted AND s.query LIKE '%projector.migrate%'
				AND s.application_name = $1`, app).Scan(&waiting)
		return err == nil && waiting > 0, fmt.Sprintf("waiting %d, %v", waiting, err)
	})
	a.stop(10 * time.Second)
	unlock()
}

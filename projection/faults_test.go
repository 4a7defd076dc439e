package projection

// The fault suite of the engine in process: each test injects one fault
// with a fixed seed while a generated stream (late, duplicate, missing,
// misrouted and bad records) flows, lets it heal, and checks the
// invariants of internal/testkit/faulttest over the whole history. The faults that
// need a process to die are in cmd/projector/faults_test.go, against the
// built binary.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/projector/projector/internal/app/jobgen"
	"github.com/projector/projector/internal/testkit/faulttest"
	"github.com/projector/projector/internal/testkit/kafkatest"
	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// faultRig is a rig whose engine reaches PostgreSQL on a pool of its own
// (named, so its backends can be found and terminated, and optionally
// through a proxy) and the broker through a gate, with a generated stream,
// its reference, a truthful authority and the history being watched.
type faultRig struct {
	*rig
	seed   uint64
	schema string
	app    string // application_name of the engine's connections
	broker *faulttest.Gate
	stream *jobgen.Stream
	ref    *faulttest.Reference
	hist   *faulttest.History
	// authority is the trusted snapshot endpoint; faultOpts.authority may
	// wrap the truthful one with a fault.
	authority *httptest.Server
	truthful  *jobgen.Authority
}

type faultOpts struct {
	seed       uint64
	jobs       int
	partitions int
	// proxy, when set, carries the engine's PostgreSQL connections.
	proxy *faulttest.Proxy
	// authority wraps the truthful authority with a fault.
	authority func(truth http.Handler) http.Handler
	// statementTimeout bounds each statement of a batch transaction.
	statementTimeout time.Duration
}

func newFaultRig(t *testing.T, o faultOpts) *faultRig {
	t.Helper()
	if o.jobs == 0 {
		o.jobs = 120
	}
	if o.partitions == 0 {
		o.partitions = 3
	}
	gate := faulttest.NewGate()
	c := kafkatest.New(t, kafkatest.WithKfakeOptions(kfake.ListenFn(gate.Listener())))
	topic := kafkatest.Topic(t, c, o.partitions)

	schema := pgtest.Schema(t)
	direct, err := store.New(pgtest.Pool(t), store.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, direct.Migrate(context.Background()))

	app := fmt.Sprintf("faults-%s", schema)
	pcfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	pcfg.ConnConfig.RuntimeParams["application_name"] = app
	if o.proxy != nil {
		host, port, _ := net.SplitHostPort(o.proxy.Addr())
		n, _ := strconv.Atoi(port)
		pcfg.ConnConfig.Host, pcfg.ConnConfig.Port = host, uint16(n)
		pcfg.ConnConfig.ConnectTimeout = 2 * time.Second
	}
	pcfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	st, err := store.New(pool, store.Config{Schema: schema, StatementTimeout: o.statementTimeout})
	require.NoError(t, err)

	stream := jobgen.Generate(jobgen.Config{
		Seed: o.seed, Jobs: o.jobs, EventsPerJob: 12, Partitions: o.partitions,
		LateRate: 0.2, DuplicateRate: 0.2, MissingRate: 0.05, MisrouteRate: 0.05, BadRate: 0.05, DeleteRate: 0.1,
	})
	truthful := jobgen.NewAuthority(stream.Truth)
	var h http.Handler = truthful
	if o.authority != nil {
		h = o.authority(truthful)
	}
	auth := httptest.NewServer(h)
	t.Cleanup(auth.Close)

	f := &faultRig{
		rig:  &rig{t: t, kafka: c, topic: topic, store: st, parts: o.partitions},
		seed: o.seed, schema: schema, app: app, broker: gate, stream: stream,
		ref: faulttest.ReferenceOf(stream), authority: auth, truthful: truthful,
	}
	f.hist = faulttest.Watch(t, faulttest.Target{
		Pool: pgtest.Pool(t), Schema: schema, Kafka: c, Topic: topic, Group: topic + "-group",
	})
	t.Logf("seed %d: %d jobs, %d records, faults %+v", o.seed, o.jobs, len(stream.Records), stream.Faults)
	return f
}

// config is the rig's engine configuration with the authority on and
// small batches, so a fault meets many batch transactions.
func (f *faultRig) config(mod ...func(*Config)) Config {
	return f.rig.config(append([]func(*Config){func(c *Config) {
		c.BatchSize = 50
		c.SnapshotURL = f.authority.URL
		c.SnapshotTimeout = 2 * time.Second
		c.SnapshotMaxElapsed = 3 * time.Second
	}}, mod...)...)
}

// flow produces the stream in chunks of chunk records, one chunk every
// `every`, in the background; wait blocks until all is produced.
func (f *faultRig) flow(chunk int, every time.Duration) (wait func()) {
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	wg.Go(func() {
		recs := f.stream.Records
		for i := 0; i < len(recs); i += chunk {
			batch := make([]kafkatest.Record, 0, chunk)
			for _, r := range recs[i:min(i+chunk, len(recs))] {
				batch = append(batch, kafkatest.Record{Partition: r.Partition, Key: r.Key, Value: r.Value})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			_, err := f.kafka.Produce(ctx, f.topic, batch...)
			cancel()
			if err != nil {
				errc <- err
				return
			}
			if every > 0 {
				time.Sleep(every) // pacing the producer, not synchronising
			}
		}
	})
	return func() {
		f.t.Helper()
		wg.Wait()
		select {
		case err := <-errc:
			f.t.Fatalf("producing the stream: %v", err)
		default:
		}
	}
}

// produceAll produces the whole stream now.
func (f *faultRig) produceAll() { f.flow(len(f.stream.Records), 0)() }

// committedRecords is how many records the stored positions cover, read
// on the test's own connection to PostgreSQL.
func (f *faultRig) committedRecords() int64 {
	f.t.Helper()
	pos, err := f.hist.Positions(context.Background())
	require.NoError(f.t, err)
	var n int64
	for _, at := range pos {
		n += max(at, 0)
	}
	return n
}

// verify waits for the lag to return to zero and every gap to close, and
// checks every invariant.
func (f *faultRig) verify(within time.Duration, opts faulttest.Options) faulttest.Report {
	f.t.Helper()
	if opts.AllowHeld {
		f.hist.CaughtUp(within)
	} else {
		f.hist.Settled(within)
	}
	return f.hist.Check(f.ref, opts)
}

// terminateBackends ends every backend of the engine's pool and returns
// how many there were, and how many were inside a transaction.
func (f *faultRig) terminateBackends() (all, inTx int) {
	f.t.Helper()
	rows, err := pgtest.Pool(f.t).Query(context.Background(),
		`SELECT pg_terminate_backend(pid), coalesce(state, '') NOT IN ('', 'idle')
		 FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, f.app)
	require.NoError(f.t, err)
	defer rows.Close()
	for rows.Next() {
		var ok, busy bool
		require.NoError(f.t, rows.Scan(&ok, &busy))
		if ok {
			all++
			if busy {
				inTx++
			}
		}
	}
	require.NoError(f.t, rows.Err())
	return all, inTx
}

// The engine's PostgreSQL backends are terminated again and again while
// batches run: every batch in flight fails, is rolled back and retried on
// a new connection; nothing is lost or applied twice, and the projection
// catches up without a restart.
func TestFaultBackendsTerminatedMidBatch(t *testing.T) {
	t.Parallel()
	for _, seed := range []uint64{11, 12} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			f := newFaultRig(t, faultOpts{seed: seed})
			// A slow flow of small chunks (about 11 s of records, a batch
			// every few tens of milliseconds), so batches keep running
			// while the terminations look for busy backends: a stream
			// produced at once was projected in a second or two, and once
			// batches got faster, chunks of 20 every 50 ms (about 4 s)
			// left one seed with 2 busy backends of 43 terminated.
			wait := f.flow(4, 25*time.Millisecond)
			run := f.start(f.config())
			var killed, inTx int
			f.eventually(30*time.Second, "backends terminated mid-batch", func() (bool, string) {
				a, b := f.terminateBackends()
				killed, inTx = killed+a, inTx+b
				time.Sleep(50 * time.Millisecond) // pacing the fault: batches (a few ms each) run between terminations
				return inTx >= 3, fmt.Sprintf("%d terminated, %d of them busy", killed, inTx)
			})
			// Then the terminations stop: the batches that failed are retried
			// on new connections and commit. (Terminating until a commit is
			// seen can starve every batch on a loaded machine, where a batch
			// takes longer than the pause between terminations.)
			f.eventually(60*time.Second, "a batch commits after the terminations", func() (bool, string) {
				n := f.committedRecords()
				return n > 0, fmt.Sprintf("%d records committed", n)
			})
			wait()
			f.verify(60*time.Second, faulttest.Options{})
			require.Positive(t, run.p.Status().Counters.Batches)
			t.Logf("%d backends terminated, %d of them in a statement or transaction", killed, inTx)
		})
	}
}

// lineCounter counts the log lines that contain a string, passing every
// line on to the test's log.
type lineCounter struct {
	t    *testing.T
	want string
	mu   sync.Mutex
	n    int
}

func (c *lineCounter) Write(p []byte) (int, error) {
	c.mu.Lock()
	if strings.Contains(string(p), c.want) {
		c.n++
	}
	c.mu.Unlock()
	c.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}

func (c *lineCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (f *faultRig) countLines(want string) (*lineCounter, func(*Config)) {
	lc := &lineCounter{t: f.t, want: want}
	return lc, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(lc, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
}

// waitCommitted waits until the stored positions cover at least n records.
func (f *faultRig) waitCommitted(n int64, within time.Duration) {
	f.t.Helper()
	f.eventually(within, fmt.Sprintf("%d records committed", n), func() (bool, string) {
		got := f.committedRecords()
		return got >= n, fmt.Sprintf("%d committed", got)
	})
}

// The path to PostgreSQL is cut (every connection dropped, new ones
// refused) and then stalled (bytes held, nothing answers) while the stream
// flows: batches fail or wait, are retried from the stored state, and the
// projection catches up once the path is back, without a restart.
func TestFaultDatabaseCutAndStalled(t *testing.T) {
	t.Parallel()
	for _, seed := range []uint64{21, 22} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			proxy := faulttest.NewProxy(t, pgUpstream(t))
			f := newFaultRig(t, faultOpts{seed: seed, proxy: proxy})
			wait := f.flow(10, 25*time.Millisecond)
			lc, logs := f.countLines("PostgreSQL is failing")
			f.start(f.config(logs))
			f.waitCommitted(100, 30*time.Second)

			proxy.Cut()
			f.eventually(20*time.Second, "a batch fails on the cut path", func() (bool, string) {
				return lc.count() > 0, "no failed batch yet"
			})
			time.Sleep(time.Second) // the outage lasts a while: the length of the fault, not a synchronisation
			proxy.Restore()
			before := f.committedRecords()
			f.waitCommitted(before+100, 30*time.Second)

			proxy.Stall()
			time.Sleep(2 * time.Second) // the length of the stall
			proxy.Restore()
			wait()
			f.verify(60*time.Second, faulttest.Options{})
		})
	}
}

// pgUpstream is the test server's host:port.
func pgUpstream(t *testing.T) string {
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	return net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
}

// Every statement of the engine runs under a short statement_timeout while
// the test holds a lock on the read model: the batch's writes time out
// (SQLSTATE 57014), the batch is rolled back and retried, and lands once
// the lock is released.
func TestFaultStatementTimeout(t *testing.T) {
	t.Parallel()
	f := newFaultRig(t, faultOpts{seed: 31, statementTimeout: 300 * time.Millisecond})
	wait := f.flow(100, 20*time.Millisecond)
	lc, logs := f.countLines("SQLSTATE 57014")
	f.start(f.config(logs))
	f.waitCommitted(100, 30*time.Second)

	ctx := context.Background()
	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) }) // before the schema is dropped
	_, err = tx.Exec(ctx, `LOCK TABLE `+f.store.JobsTable()+` IN EXCLUSIVE MODE`)
	require.NoError(t, err)
	f.eventually(20*time.Second, "a statement times out", func() (bool, string) {
		return lc.count() > 0, "no statement timeout yet"
	})
	require.NoError(t, tx.Rollback(ctx))
	wait()
	f.verify(60*time.Second, faulttest.Options{})
	t.Logf("%d log lines with a statement timeout", lc.count())
}

// The broker is cut off (connections dropped, new ones refused) and then
// stalled while the engine has lag: fetches and group calls fail or hang,
// the group is rejoined, and the projection catches up once the broker is
// back, without a restart.
func TestFaultBrokerCutAndStalled(t *testing.T) {
	t.Parallel()
	for _, seed := range []uint64{41, 42} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			f := newFaultRig(t, faultOpts{seed: seed, jobs: 200})
			f.produceAll()
			lc, logs := f.countLines("Kafka is failing")
			f.start(f.config(logs, func(c *Config) { c.BatchSize = 20 }))
			f.waitCommitted(1, 30*time.Second)

			f.broker.Cut()
			f.eventually(20*time.Second, "the engine sees the cut broker", func() (bool, string) {
				return lc.count() > 0, "no Kafka failure logged yet"
			})
			time.Sleep(time.Second) // the outage lasts a while: the length of the fault, not a synchronisation
			f.broker.Restore()
			before := f.committedRecords()
			f.waitCommitted(before+1, 30*time.Second)

			f.broker.Stall()
			time.Sleep(2 * time.Second) // the length of the stall
			f.broker.Restore()
			f.verify(90*time.Second, faulttest.Options{})
		})
	}
}

// The broker fails chosen requests: the first group offset commits answer
// REBALANCE_IN_PROGRESS, and fetches either lose their connection or
// answer NOT_LEADER_FOR_PARTITION. Positions in PostgreSQL are unaffected,
// the group commit never passes them, and nothing is lost or repeated.
func TestFaultFetchAndCommitErrorsInjected(t *testing.T) {
	t.Parallel()
	f := newFaultRig(t, faultOpts{seed: 51})
	kf := f.kafka.Kfake()
	var commits, fetches atomic.Int32
	kf.ControlKey(kmsg.OffsetCommit.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		if commits.Add(1) > 3 {
			kf.DropControl()
			return nil, nil, false
		}
		r := req.(*kmsg.OffsetCommitRequest)
		resp := r.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range r.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.RebalanceInProgress.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	kf.ControlKey(kmsg.Fetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		n := fetches.Add(1)
		switch {
		case n > 12:
			kf.DropControl()
			return nil, nil, false
		case n%2 == 1:
			return nil, errors.New("injected: connection dropped"), true
		}
		return kafkatest.FetchErrorResponse(req, kerr.NotLeaderForPartition), nil, true
	})
	wait := f.flow(100, 20*time.Millisecond)
	f.start(f.config())
	wait()
	f.hist.Settled(90 * time.Second)
	f.hist.CommitsCaughtUp(30 * time.Second)
	f.verify(30*time.Second, faulttest.Options{})
	require.Greater(t, commits.Load(), int32(3), "every injected commit error was served, and a commit after them")
	require.Greater(t, fetches.Load(), int32(12), "every injected fetch error was served")
}

// Partitions are added to the topic while the engine runs: the group
// rebalances, the new partitions are claimed from their start, and the
// records produced into them are projected like any other.
func TestFaultPartitionsAddedWhileRunning(t *testing.T) {
	t.Parallel()
	f := newFaultRig(t, faultOpts{seed: 61, partitions: 5})
	// The topic starts with 3 of the stream's 5 partitions.
	ctx := context.Background()
	topic := f.topic + "-grown"
	require.NoError(t, f.kafka.CreateTopic(ctx, topic, 3))
	f.topic = topic
	f.hist = faulttest.Watch(t, faulttest.Target{Pool: pgtest.Pool(t), Schema: f.schema, Kafka: f.kafka, Topic: topic, Group: topic + "-group"})
	var early, late []kafkatest.Record
	for _, r := range f.stream.Records {
		kr := kafkatest.Record{Partition: r.Partition, Key: r.Key, Value: r.Value}
		if r.Partition < 3 {
			early = append(early, kr)
		} else {
			late = append(late, kr)
		}
	}
	_, err := f.kafka.Produce(ctx, topic, early...)
	require.NoError(t, err)
	run := f.start(f.config())
	f.waitCommitted(100, 30*time.Second)
	require.NoError(t, f.kafka.AddPartitions(ctx, topic, 5))
	_, err = f.kafka.Produce(ctx, topic, late...)
	require.NoError(t, err)
	f.verify(60*time.Second, faulttest.Options{})
	f.eventually(30*time.Second, "the engine works all 5 partitions", func() (bool, string) {
		return len(run.p.Status().Partitions) == 5, fmt.Sprintf("%d partitions", len(run.p.Status().Partitions))
	})
}

// misbehaving answers each job's first `bad` requests with fault, then
// passes them to the truthful authority.
type misbehaving struct {
	truth http.Handler
	bad   int
	fault func(m *misbehaving, w http.ResponseWriter, id string)
	// rig is the rig whose rows a fault may read, set once it exists.
	rig  atomic.Pointer[faultRig]
	mu   sync.Mutex
	seen map[string]int
	hits atomic.Int64
}

func (m *misbehaving) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, "/jobs/")
	m.mu.Lock()
	m.seen[id]++
	n := m.seen[id]
	m.mu.Unlock()
	if n > m.bad {
		m.truth.ServeHTTP(w, r)
		return
	}
	m.hits.Add(1)
	m.fault(m, w, id)
}

// The trusted authority misbehaves for each job's first requests: slow
// past the timeout, failing, answering garbage, a body far over the
// limit, a lower version than the one held, or another job's id (at a
// version far ahead). Nothing it says wrongly is written (the audit would
// show a version with a state the stream never had), the gaps close once
// it answers truthfully, and a huge body is never read whole.
func TestFaultAuthorityMisbehaves(t *testing.T) {
	t.Parallel()
	var hugeSent atomic.Int64 // the most bytes one huge answer got out
	cases := []struct {
		name  string
		fault func(m *misbehaving, w http.ResponseWriter, id string)
	}{
		{"slow", func(m *misbehaving, w http.ResponseWriter, id string) {
			time.Sleep(2500 * time.Millisecond) // past the 2s snapshot timeout
			w.WriteHeader(http.StatusServiceUnavailable)
		}},
		{"failing", func(m *misbehaving, w http.ResponseWriter, id string) {
			http.Error(w, "authority down", http.StatusInternalServerError)
		}},
		{"garbage", func(m *misbehaving, w http.ResponseWriter, id string) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"job_id": "` + id + `", "version": 9999, "kind": "snap`))
		}},
		{"huge", func(m *misbehaving, w http.ResponseWriter, id string) {
			w.Header().Set("Content-Type", "application/json")
			chunk := []byte(strings.Repeat(" ", 64<<10))
			var sent int64
			defer func() {
				for old := hugeSent.Load(); sent > old && !hugeSent.CompareAndSwap(old, sent); old = hugeSent.Load() {
				}
			}()
			for range 1024 { // 64 MiB of whitespace, never read whole
				n, err := w.Write(chunk)
				sent += int64(n)
				if err != nil {
					return
				}
			}
		}},
		{"lower-version", func(m *misbehaving, w http.ResponseWriter, id string) {
			// At or below the row's version, with a state the stream never
			// had: stale (below) or a conflict (equal), never written. A
			// job with no row gets no lie to tell: a version-1 answer there
			// would be indistinguishable from the truth to any reader.
			rows, err := m.rig.Load().store.LoadJobs(context.Background(), []string{id})
			row, ok := rows[id]
			if err != nil || !ok {
				http.NotFound(w, nil)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprintf(w, `{"job_id":%q,"version":%d,"kind":"snapshot","state":{"bogus":"lower version"}}`, id, max(row.Version-1, 1))
		}},
		{"another-job", func(m *misbehaving, w http.ResponseWriter, id string) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprintf(w, `{"job_id":%q,"version":9999,"kind":"snapshot","state":{"bogus":"another job"}}`, id+"-other")
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var m *misbehaving
			f := newFaultRig(t, faultOpts{seed: 70 + uint64(i), jobs: 80, authority: func(truth http.Handler) http.Handler {
				m = &misbehaving{truth: truth, bad: 2, fault: tc.fault, seen: map[string]int{}}
				return m
			}})
			m.rig.Store(f)
			f.produceAll()
			f.start(f.config(func(c *Config) { c.NoReread = true }))
			f.verify(60*time.Second, faulttest.Options{})
			require.Positive(t, m.hits.Load(), "the authority misbehaved at least once")
			if tc.name == "huge" {
				require.Less(t, hugeSent.Load(), int64(16<<20), "the client stops reading a body over the limit: the most one answer sent is bounded by the limit and the socket buffers")
			}
		})
	}
}

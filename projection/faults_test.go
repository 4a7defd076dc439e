package projection

// The fault suite of the engine in process: each test injects one fault
// with a fixed seed while a generated stream (late, duplicate, missing,
// misrouted and bad records) flows, lets it heal, and checks the
// invariants of internal/faulttest over the whole history. The faults that
// need a process to die are in cmd/projector/faults_test.go, against the
// built binary.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/projector/projector/internal/faulttest"
	"github.com/projector/projector/internal/jobgen"
	"github.com/projector/projector/internal/kafkatest"
	"github.com/projector/projector/internal/pgtest"
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
	// params are run-time parameters of the engine's connections, e.g.
	// statement_timeout.
	params map[string]string
	// authority wraps the truthful authority with a fault.
	authority func(truth http.Handler) http.Handler
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
	for k, v := range o.params {
		pcfg.ConnConfig.RuntimeParams[k] = v
	}
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
	st, err := store.New(pool, store.Config{Schema: schema})
	require.NoError(t, err)

	stream := jobgen.Generate(jobgen.Config{
		Seed: o.seed, Jobs: o.jobs, EventsPerJob: 12, Partitions: o.partitions,
		LateRate: 0.2, DuplicateRate: 0.2, MissingRate: 0.05, MisrouteRate: 0.05, BadRate: 0.05,
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
// on the test's own connection.
func (f *faultRig) committedRecords() int64 {
	f.t.Helper()
	lag, err := f.hist.Lag(context.Background())
	require.NoError(f.t, err)
	hwm := f.highWatermarks()
	var n int64
	for p, l := range lag {
		n += hwm[p] - l
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
			wait := f.flow(100, 20*time.Millisecond)
			run := f.start(f.config())
			var killed, inTx int
			f.eventually(30*time.Second, "backends terminated mid-batch", func() (bool, string) {
				a, b := f.terminateBackends()
				killed, inTx = killed+a, inTx+b
				time.Sleep(100 * time.Millisecond) // pacing the fault: batches run between terminations
				return inTx >= 3 && f.committedRecords() > 0, fmt.Sprintf("%d terminated, %d of them busy", killed, inTx)
			})
			wait()
			f.verify(60*time.Second, faulttest.Options{})
			require.Positive(t, run.p.Status().Counters.Batches)
			t.Logf("%d backends terminated, %d of them in a statement or transaction", killed, inTx)
		})
	}
}

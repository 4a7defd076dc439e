package projection

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector/projector/event"
	"github.com/projector/projector/internal/app/jobgen"
	"github.com/projector/projector/internal/testkit/faulttest"
	"github.com/projector/projector/internal/testkit/kafkatest"
	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// abortedMark is in every record the tests write in transactions they
// abort: a state or a change that carries it came from an aborted record.
const abortedMark = "aborted_txn"

// txnProducer is a transactional producer (franz-go's, as Kafka Streams,
// Flink or an outbox relay would be), writing at explicit partitions.
type txnProducer struct {
	t     *testing.T
	cl    *kgo.Client
	topic string
}

func newTxnProducer(t *testing.T, c *kafkatest.Cluster, topic, id string, timeout time.Duration) *txnProducer {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.TransactionalID(id), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.TransactionTimeout(timeout))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return &txnProducer{t: t, cl: cl, topic: topic}
}

func (p *txnProducer) begin() {
	p.t.Helper()
	require.NoError(p.t, p.cl.BeginTransaction())
}

// produce writes recs in the open transaction and waits for the broker to
// have them.
func (p *txnProducer) produce(recs ...kafkatest.Record) {
	p.t.Helper()
	if len(recs) == 0 {
		return
	}
	krs := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		krs[i] = &kgo.Record{Topic: p.topic, Partition: int32(r.Partition), Key: r.Key, Value: r.Value}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(p.t, p.cl.ProduceSync(ctx, krs...).FirstErr())
}

// end commits or aborts the open transaction.
func (p *txnProducer) end(commit bool) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	how := kgo.TryAbort
	if commit {
		how = kgo.TryCommit
	}
	require.NoError(p.t, p.cl.EndTransaction(ctx, how))
}

// txnStream is a generated stream split the way transactional producers
// write it: what is committed (plainly or in committed transactions),
// and what only aborted transactions hold.
type txnStream struct {
	committed [][]kafkatest.Record // by partition, in order
	aborted   []kafkatest.Record
	// withheld are the deltas, one per job of a few, taken out of the
	// committed stream: an aborted transaction holds another delta at
	// their version, so the gap they leave must be healed by the
	// authority, never by the aborted record.
	withheld map[string]int64
	ref      *faulttest.Reference
	truth    map[string]jobgen.Truth
}

// splitForTransactions generates a stream and splits it: a few jobs lose
// a delta inside their history (an aborted transaction holds another
// delta at its version), and the aborted transactions also hold records
// that would show if read: snapshots above the jobs' final versions,
// other contents at versions the stream defines, jobs never produced, and
// records that are not JSON at all.
func splitForTransactions(seed uint64, jobs, partitions int) *txnStream {
	stream := jobgen.Generate(jobgen.Config{
		Seed: seed, Jobs: jobs, EventsPerJob: 10, Partitions: partitions,
		LateRate: 0.1, DuplicateRate: 0.1, MisrouteRate: 0.05, DeleteRate: 0.1,
	})
	s := &txnStream{committed: make([][]kafkatest.Record, partitions), withheld: map[string]int64{}, truth: stream.Truth}
	// A job's deltas, by version, and its last version in the stream.
	deltas := map[string][]int64{}
	last := map[string]int64{}
	for _, r := range stream.Records {
		ev, err := event.Decode(r.Key, r.Value)
		if err != nil {
			continue
		}
		last[ev.JobID] = max(last[ev.JobID], ev.Version)
		if ev.Kind == event.Delta {
			deltas[ev.JobID] = append(deltas[ev.JobID], ev.Version)
		}
	}
	for i, id := range stream.JobIDs() {
		if i%6 != 0 {
			continue
		}
		// A delta inside the history: a later event reveals the gap.
		for _, v := range deltas[id] {
			if v < last[id]-1 && v > 1 {
				s.withheld[id] = v
				break
			}
		}
	}
	s.ref = faulttest.NewReference()
	for _, r := range stream.Records {
		if ev, err := event.Decode(r.Key, r.Value); err == nil && ev.Kind == event.Delta && s.withheld[ev.JobID] == ev.Version {
			continue
		}
		s.ref.Add(r.Key, r.Value)
		s.committed[r.Partition] = append(s.committed[r.Partition], kafkatest.Record{Partition: r.Partition, Key: r.Key, Value: r.Value})
	}
	for id, t := range stream.Truth {
		s.ref.Authority(id, t.Version, t.State, t.Deleted)
	}
	// What only aborted transactions hold.
	for id, v := range s.withheld {
		p := jobgen.PartitionOf(id, partitions)
		s.aborted = append(s.aborted, kafkatest.Record{Partition: p, Key: []byte(id),
			Value: []byte(dlt(id, v, fmt.Sprintf(`[{"op":"set","path":"/%s","value":true}]`, abortedMark)))})
	}
	for i, id := range stream.JobIDs() {
		p := jobgen.PartitionOf(id, partitions)
		switch i % 4 {
		case 0:
			s.aborted = append(s.aborted, kafkatest.Record{Partition: p, Key: []byte(id),
				Value: []byte(snap(id, stream.Truth[id].Version+5, fmt.Sprintf(`{%q:true}`, abortedMark)))})
		case 1:
			s.aborted = append(s.aborted, kafkatest.Record{Partition: p, Key: []byte(id),
				Value: []byte(snap(id, 2, fmt.Sprintf(`{%q:true}`, abortedMark)))})
		case 2:
			s.aborted = append(s.aborted, kafkatest.Record{Partition: p, Key: []byte(id), Value: []byte("not json, " + abortedMark)})
		}
	}
	for p := range partitions {
		ghost := fmt.Sprintf("ghost-%d", p)
		s.aborted = append(s.aborted, kafkatest.Record{Partition: p, Key: []byte(ghost), Value: []byte(snap(ghost, 1, fmt.Sprintf(`{%q:true}`, abortedMark)))})
	}
	return s
}

// produceInterleaved writes the committed records and the aborted ones in
// rounds, across every partition. In a round, producer A opens a
// transaction and writes aborted records; some committed records are
// written plainly, others by producer B in a transaction of its own,
// while A writes more; B commits, then A aborts. Records of open,
// committed and aborted transactions, their markers, and plain records
// end up interleaved in each partition; the last entry of every partition
// is an abort marker.
func produceInterleaved(t *testing.T, c *kafkatest.Cluster, topic string, s *txnStream, rounds int) {
	t.Helper()
	a := newTxnProducer(t, c, topic, topic+"-a", time.Minute)
	b := newTxnProducer(t, c, topic, topic+"-b", time.Minute)
	take := func(recs []kafkatest.Record, round int) []kafkatest.Record {
		per := (len(recs) + rounds - 1) / rounds
		return recs[min(round*per, len(recs)):min((round+1)*per, len(recs))]
	}
	for round := range rounds {
		poison := take(s.aborted, round)
		a.begin()
		a.produce(poison[:len(poison)/2]...)
		var plain, txn []kafkatest.Record
		for _, recs := range s.committed {
			mine := take(recs, round)
			half := len(mine) / 2
			plain = append(plain, mine[:half]...)
			txn = append(txn, mine[half:]...)
		}
		_, err := c.Produce(context.Background(), topic, plain...)
		require.NoError(t, err)
		b.begin()
		b.produce(txn...)
		a.produce(poison[len(poison)/2:]...)
		b.end(true)
		// Every partition ends each round with A's abort marker.
		for p := range s.committed {
			a.produce(kafkatest.Record{Partition: p, Key: []byte("ghost-end"), Value: []byte(snap("ghost-end", int64(round+1), fmt.Sprintf(`{%q:true}`, abortedMark)))})
		}
		a.end(false)
	}
}

// requireNothingAborted asserts that no change the audit recorded in the
// schema carries a state from an aborted record, and that the quarantine
// is empty: markers and aborted records are never decoded.
func requireNothingAborted(t *testing.T, schema string, st *store.Store) {
	t.Helper()
	ctx := context.Background()
	var changes, aborted int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE new_state::text LIKE '%`+abortedMark+`%' OR job_id LIKE 'ghost%')
		FROM `+pgx.Identifier{schema, "faulttest_audit"}.Sanitize()).Scan(&changes, &aborted))
	require.Positive(t, changes, "the audit saw the writes")
	require.Zero(t, aborted, "a change took its state or its job from an aborted record")
	_, quarantined, err := st.Quarantine(ctx, 10)
	require.NoError(t, err)
	require.Zero(t, quarantined, "a marker or an aborted record was quarantined")
}

// requirePastTheMarkers asserts that every partition's stored position is
// its high watermark, which is the last abort marker's offset + 1.
func requirePastTheMarkers(t *testing.T, c *kafkatest.Cluster, topic string, st *store.Store) {
	t.Helper()
	hwm, err := c.HighWatermarks(context.Background(), topic)
	require.NoError(t, err)
	pos, err := st.Positions(context.Background())
	require.NoError(t, err)
	at := map[int]int64{}
	for _, p := range pos {
		if p.Topic == topic {
			at[p.Partition] = p.NextOffset
		}
	}
	for p, h := range hwm {
		require.Equal(t, h, at[p], "partition %d: the stored position is not past its last marker", p)
	}
}

// TestTransactionsReadCommitted: committed and aborted transactions from
// two producers, interleaved with plain records, across three partitions,
// read while they are produced. Some jobs' deltas are missing from the
// committed history, and an aborted transaction holds another delta at
// each missing version: the gap is healed by the authority, never by the
// aborted record. The read model is the committed history exactly (the
// fault suite's invariants: final states, versions only rising, every
// version written with the committed state), the audit shows no change
// from an aborted record, the quarantine is empty, and every stored
// position is past its partition's last marker. Then a rebuild reads the
// topic again into a shadow and swaps it in, with the same results.
//
// Before reading committed, records of aborted transactions ended in the
// read model and every marker in the quarantine.
func TestTransactionsReadCommitted(t *testing.T) {
	t.Parallel()
	const partitions = 3
	c := kafkatest.New(t)
	topic := kafkatest.Topic(t, c, partitions)
	schema := pgtest.Schema(t)
	st, err := store.New(pgtest.Pool(t), store.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, st.Migrate(context.Background()))
	s := splitForTransactions(7, 60, partitions)
	require.NotEmpty(t, s.withheld)
	auth := httptest.NewServer(jobgen.NewAuthority(s.truth))
	t.Cleanup(auth.Close)
	hist := faulttest.Watch(t, faulttest.Target{Pool: pgtest.Pool(t), Schema: schema, Kafka: c, Topic: topic, Group: topic + "-group"})

	r := &rig{t: t, kafka: c, topic: topic, store: st, parts: partitions}
	cfg := r.config(func(c *Config) {
		c.BatchSize = 40
		c.GapWait, c.GapWaitOff = 200*time.Millisecond, false
		c.SnapshotURL = auth.URL
	})
	run := r.start(cfg)
	produceInterleaved(t, c, topic, s, 8)

	hist.Settled(60 * time.Second)
	rep := hist.Check(s.ref, faulttest.Options{})
	require.Positive(t, rep.Exact)
	requireNothingAborted(t, schema, st)
	requirePastTheMarkers(t, c, topic, st)
	status := run.p.Status()
	require.Equal(t, ReadCommitted, status.Isolation)
	require.Equal(t, "last_stable_offset", status.LagMeasuredTo)
	require.Positive(t, status.Counters.ClosedBySnapshot, "the withheld versions were healed by the authority")
	for _, ps := range status.Partitions {
		require.Zero(t, ps.Lag)
		require.Nil(t, ps.OpenTransaction)
	}
	run.halt(t)

	// The rebuild, with the audit on its shadow alone: what the live
	// model went through was checked above.
	_, err = pgtest.Pool(t).Exec(context.Background(), `TRUNCATE `+pgx.Identifier{schema, "faulttest_audit"}.Sanitize())
	require.NoError(t, err)
	rb := &Rebuild{
		Live:     st,
		Config:   cfg,
		HeldWait: 30 * time.Second,
		Started: func(p *Projector) (func(), error) {
			faulttest.Watch(t, faulttest.Target{Pool: pgtest.Pool(t), Schema: schema, Table: store.ShadowName("jobs")})
			return func() {}, nil
		},
	}
	rb.Config.Group = topic + "-rebuild"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := rb.Run(ctx)
	require.NoError(t, err)
	require.Positive(t, res.Counters.ClosedBySnapshot, "the rebuild healed the withheld versions too")
	// The swap moves the shadow's tombstones to the live projection: an
	// update of each that changes no version, not a write of the rebuild.
	// So is its update of a live row the shadow has at the same version
	// but from another record (a job the stream wrote to two partitions:
	// which partition's copy each side kept differs); the states are
	// checked against the reference below.
	_, err = pgtest.Pool(t).Exec(ctx, `DELETE FROM `+pgx.Identifier{schema, "faulttest_audit"}.Sanitize()+`
		WHERE tbl IN ('projector_tombstones', 'jobs') AND op = 'UPDATE' AND old_version = new_version`)
	require.NoError(t, err)
	after := faulttest.Watch(t, faulttest.Target{Pool: pgtest.Pool(t), Schema: schema})
	after.Check(s.ref, faulttest.Options{})
	requireNothingAborted(t, schema, st)
	requirePastTheMarkers(t, c, topic, st)
	var shadowChanges int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "faulttest_audit"}.Sanitize()+` WHERE tbl = $1`, store.ShadowName("jobs")).Scan(&shadowChanges))
	require.Positive(t, shadowChanges, "the audit saw the rebuild's writes")
}

// TestOpenTransactionHoldsThePartition: records before a transaction still
// open are projected; the partition then waits at the last stable offset,
// and says so in /status (its open transaction, no lag) and in the log,
// for longer than the stall timeout without being a stall, with the
// instance ready under --ready-max-lag. Once the transaction commits, is
// aborted, or its producer dies and the broker's transaction timeout
// aborts it, the partition goes on: the record written after it by
// another producer is projected, the transaction's own only if it
// committed, and the position passes the marker.
func TestOpenTransactionHoldsThePartition(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"commit", "abort", "producer dies"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, 1)
			// The dying producer's transaction is aborted by the broker
			// once its timeout passes, and the wait outlasts the stall
			// timeout below before that.
			timeout := time.Minute
			if end == "producer dies" {
				timeout = 6 * time.Second
			}
			producer := newTxnProducer(t, r.kafka, r.topic, r.topic+"-txn", timeout)
			r.produce(rec{0, "before-1", snap("before-1", 1, `{}`)}, rec{0, "before-2", snap("before-2", 1, `{}`)})
			producer.begin()
			producer.produce(kafkatest.Record{Partition: 0, Key: []byte("during"), Value: []byte(snap("during", 1, `{"in":"transaction"}`))})
			r.produce(rec{0, "after", snap("after", 1, `{}`)})

			logs := &lockedBuffer{}
			const stall = 2 * time.Second
			cfg := r.config(func(c *Config) {
				c.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(logs, testWriter{t}), nil))
				c.StallTimeout = stall
				c.ReadyMaxLag = 1
			})
			p, err := New(cfg)
			require.NoError(t, err)
			p.testOpenTxnLogAfter = 200 * time.Millisecond
			run := &running{p: p, done: make(chan error, 1)}
			ctx, cancel := context.WithCancel(context.Background())
			run.stop = cancel
			go func() { run.done <- p.Run(ctx) }()
			t.Cleanup(func() { run.halt(t) })

			var open *OpenTransaction
			r.eventually(30*time.Second, "the partition waits on the open transaction", func() (bool, string) {
				for _, ps := range p.Status().Partitions {
					if open = ps.OpenTransaction; open != nil {
						return ps.Position == open.Offset, fmt.Sprintf("at %d, waiting on %+v", ps.Position, open)
					}
				}
				return false, fmt.Sprintf("%+v", p.Status().Partitions)
			})
			require.Equal(t, int64(2), open.Offset, "the transaction starts after the two records before it")
			require.Equal(t, int64(2), open.Waiting, "its record and the one after it wait")
			rows := r.rows()
			require.Contains(t, rows, "before-1")
			require.Contains(t, rows, "before-2")
			require.NotContains(t, rows, "after", "read past the last stable offset")
			require.NotContains(t, rows, "during")
			r.eventually(10*time.Second, "the log says it", func() (bool, string) {
				return strings.Contains(logs.String(), "the partition waits on a transaction still open"), "not logged yet"
			})

			// Longer than the stall timeout: no stall, no lag, ready.
			r.eventually(30*time.Second, "the wait outlasts the stall timeout", func() (bool, string) {
				return time.Since(open.Since) > 2*stall, ""
			})
			select {
			case err := <-run.done:
				t.Fatalf("the projector stopped while it waited on the transaction: %v", err)
			default:
			}
			st := p.Status()
			require.Len(t, st.Partitions, 1)
			require.NotNil(t, st.Partitions[0].OpenTransaction)
			require.Zero(t, st.Partitions[0].Lag, "waiting on an open transaction is not lag")
			require.Zero(t, st.Counters.Stalls)
			require.True(t, p.Readiness().OK, "%+v", p.Readiness())
			metrics := scrape(t, p)
			require.Equal(t, 0.0, metrics[`projector_partition_lag{partition="0"}`])
			require.Greater(t, metrics[`projector_partition_open_transaction_seconds{partition="0"}`], (2 * stall).Seconds())

			switch end {
			case "commit":
				producer.end(true)
			case "abort":
				producer.end(false)
			default:
				producer.cl.Close()
			}
			r.eventually(30*time.Second, "the partition goes on", func() (bool, string) {
				rows := r.rows()
				_, ok := rows["after"]
				return ok, fmt.Sprintf("%d rows", len(rows))
			})
			_, during := r.rows()["during"]
			require.Equal(t, end == "commit", during, "the transaction's own record is projected only if it committed")
			r.caughtUp(30*time.Second, run)
			r.requirePositionsAtEnd()
			r.eventually(10*time.Second, "the wait is over", func() (bool, string) {
				st := p.Status()
				return st.Partitions[0].OpenTransaction == nil && strings.Contains(logs.String(), "the open transaction the partition waited on ended"), fmt.Sprintf("%+v", st.Partitions[0])
			})
			_, quarantined, err := r.store.Quarantine(context.Background(), 10)
			require.NoError(t, err)
			require.Zero(t, quarantined)
		})
	}
}

// TestReadUncommittedProjectsAbortedRecords: with Isolation
// ReadUncommitted the projector reads as it did before it read committed:
// the records of an aborted transaction and of one still open are
// projected as they are appended, and the lag is measured to the high
// watermark. Markers are passed at either level, never quarantined.
func TestReadUncommittedProjectsAbortedRecords(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	aborts := newTxnProducer(t, r.kafka, r.topic, r.topic+"-a", time.Minute)
	aborts.begin()
	aborts.produce(kafkatest.Record{Partition: 0, Key: []byte("aborted"), Value: []byte(snap("aborted", 1, `{}`))})
	aborts.end(false)
	r.produce(rec{0, "plain", snap("plain", 1, `{}`)})
	open := newTxnProducer(t, r.kafka, r.topic, r.topic+"-o", time.Minute)
	open.begin()
	open.produce(kafkatest.Record{Partition: 0, Key: []byte("open"), Value: []byte(snap("open", 1, `{}`))})

	run := r.start(r.config(func(c *Config) { c.Isolation = ReadUncommitted }))
	r.caughtUp(30*time.Second, run)
	rows := r.rows()
	require.Contains(t, rows, "aborted")
	require.Contains(t, rows, "plain")
	require.Contains(t, rows, "open")
	st := run.p.Status()
	require.Equal(t, ReadUncommitted, st.Isolation)
	require.Equal(t, "high_watermark", st.LagMeasuredTo)
	require.Nil(t, st.Partitions[0].OpenTransaction, "reading uncommitted, nothing waits on a transaction")
	open.end(true)
	r.caughtUp(30*time.Second, run)
	_, quarantined, err := r.store.Quarantine(context.Background(), 10)
	require.NoError(t, err)
	require.Zero(t, quarantined, "a marker was quarantined")
}

package faulttest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/faulttest"
	"github.com/projector/projector/internal/testkit/kafkatest"
	"github.com/projector/projector/internal/testkit/pgtest"
)

// recorder is a testing.TB that keeps the errors the checker reports
// instead of failing the real test.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recorder) has(sub string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.errs {
		if strings.Contains(e, sub) {
			return true
		}
	}
	return false
}

func snapshot(job string, v int, state string) []byte {
	return fmt.Appendf(nil, `{"job_id":%q,"version":%d,"kind":"snapshot","state":%s}`, job, v, state)
}

func delta(job string, v int, by int) []byte {
	return fmt.Appendf(nil, `{"job_id":%q,"version":%d,"kind":"delta","ops":[{"op":"increment","path":"/n","by":%d}]}`, job, v, by)
}

// The checker is only worth its violations: a history written by hand
// with each kind of fault must be reported, invariant by invariant, and a
// correct one must not.
func TestCheckerReportsEachViolation(t *testing.T) {
	t.Parallel()
	st := pgtest.Store(t)
	c := kafkatest.New(t)
	topic := kafkatest.Topic(t, c, 1)
	pool := pgtest.Pool(t)
	schema := strings.Trim(strings.Split(st.JobsTable(), ".")[0], `"`)
	rec := &recorder{TB: t}
	h := faulttest.Watch(rec, faulttest.Target{Pool: pool, Schema: schema, Kafka: c, Topic: topic, Group: "g", SampleEvery: 10 * time.Millisecond})

	ref := faulttest.NewReference()
	ref.Add([]byte("ok"), snapshot("ok", 1, `{"n":0}`))
	ref.Add([]byte("ok"), delta("ok", 2, 5))
	ref.Add([]byte("twice"), snapshot("twice", 1, `{"n":0}`))
	ref.Add([]byte("twice"), delta("twice", 2, 5))
	ref.Add([]byte("twice"), snapshot("twice", 3, `{"n":5,"done":true}`))
	ref.Add([]byte("back"), snapshot("back", 1, `{"n":1}`))
	ref.Add([]byte("back"), snapshot("back", 2, `{"n":2}`))
	ref.Add([]byte("short"), snapshot("short", 1, `{"n":1}`))
	ref.Add([]byte("short"), snapshot("short", 2, `{"n":2}`))

	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	jobs := st.JobsTable()
	// ok: exactly the stream.
	exec(`INSERT INTO ` + jobs + ` (job_id, version, state) VALUES ('ok', 1, '{"n":0}')`)
	exec(`UPDATE ` + jobs + ` SET version = 2, state = '{"n":5}' WHERE job_id = 'ok'`)
	// twice: delta v2 applied twice, then healed by the v3 snapshot; the
	// final row is right, the history is not (invariant 3).
	exec(`INSERT INTO ` + jobs + ` (job_id, version, state) VALUES ('twice', 1, '{"n":0}')`)
	exec(`UPDATE ` + jobs + ` SET version = 2, state = '{"n":10}' WHERE job_id = 'twice'`)
	exec(`UPDATE ` + jobs + ` SET version = 3, state = '{"n":5,"done":true}' WHERE job_id = 'twice'`)
	// back: v2, then v1 again (invariant 2), ending below its final version.
	exec(`INSERT INTO ` + jobs + ` (job_id, version, state) VALUES ('back', 2, '{"n":2}')`)
	exec(`UPDATE ` + jobs + ` SET version = 1, state = '{"n":1}' WHERE job_id = 'back'`)
	// short: never reaches v2 (invariant 1); stray: never produced.
	exec(`INSERT INTO ` + jobs + ` (job_id, version, state) VALUES ('short', 1, '{"n":1}')`)
	exec(`INSERT INTO ` + jobs + ` (job_id, version, state) VALUES ('stray', 1, '{}')`)

	// The group's offset passes the stored position (invariant 4).
	exec(`INSERT INTO `+strings.Replace(jobs, `"jobs"`, `"projector_partitions"`, 1)+` (projection, topic, partition, next_offset, epoch, owner)
		VALUES ('jobs', $1, 0, 1, 1, 'test')`, topic)
	_, err := c.Produce(ctx, topic, kafkatest.Record{Partition: 0, Value: []byte("x")}, kafkatest.Record{Partition: 0, Value: []byte("y")}, kafkatest.Record{Partition: 0, Value: []byte("z")})
	require.NoError(t, err)
	client := &kafka.Client{Addr: kafka.TCP(c.Addrs()...), Transport: &kafka.Transport{}}
	t.Cleanup(client.Transport.(*kafka.Transport).CloseIdleConnections)
	resp, err := client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: "g", GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{topic: {{Partition: 0, Offset: 3}}}})
	require.NoError(t, err)
	require.NoError(t, resp.Topics[topic][0].Error)
	require.Eventually(t, func() bool { return h.Samples() > 3 }, 10*time.Second, 10*time.Millisecond)

	rep := h.Check(ref, faulttest.Options{})
	for _, want := range []string{
		"invariant 3: change #", // twice at v2
		"job twice",
		"invariant 2: change #", // back
		"invariant 1: job short: row at v1, final version 2",
		"invariant 1: job back: row at v1, final version 2",
		"invariant 1: job stray: a row at v1 for a job never produced",
		"invariant 4: partition 0: the group's committed offset 3 passed the position stored in PostgreSQL 1",
	} {
		require.True(t, rec.has(want), "the checker reports %q; it reported:\n%s", want, strings.Join(rec.errs, "\n"))
	}
	require.False(t, rec.has("job ok"), "a correct job is not reported:\n%s", strings.Join(rec.errs, "\n"))
	require.Equal(t, 4, rep.Jobs)
	require.Equal(t, 2, rep.Exact) // ok and twice end right
}

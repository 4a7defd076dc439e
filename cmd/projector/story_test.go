package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/kafkatest"
	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/store"
)

// story is a topic with job events on an in-process broker, a fresh
// PostgreSQL schema to project it into, and the read model the log says
// the projection must end with.
type story struct {
	t          *testing.T
	kafka      *kafkatest.Cluster
	topic      string
	partitions int
	schema     string
	st         *store.Store // reads the schema's tables; never writes

	want     map[string]wantRow
	produced int64 // records produced so far
	// Outcomes the version rules give the records produced so far.
	stale, duplicates, quarantined, deleted int64
}

type wantRow struct {
	version int64
	state   map[string]any
}

func newStory(t *testing.T, partitions int) *story {
	t.Helper()
	c := kafkatest.New(t)
	schema := pgtest.Schema(t)
	st, err := store.New(pgtest.Pool(t), store.Config{Schema: schema})
	require.NoError(t, err)
	return &story{
		t: t, kafka: c, topic: kafkatest.Topic(t, c, partitions), partitions: partitions,
		schema: schema, st: st, want: map[string]wantRow{},
	}
}

func (s *story) brokers() string { return strings.Join(s.kafka.Addrs(), ",") }

func (s *story) produce(recs ...kafkatest.Record) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.t.Context(), 20*time.Second)
	defer cancel()
	_, err := s.kafka.Produce(ctx, s.topic, recs...)
	require.NoError(s.t, err)
	s.produced += int64(len(recs))
}

func snapshotValue(job string, v int64, state map[string]any) []byte {
	b, _ := json.Marshal(map[string]any{"job_id": job, "version": v, "kind": "snapshot", "state": state,
		"event_id": fmt.Sprintf("evt-%s-%d", job, v), "occurred_at": time.Now().UTC().Format(time.RFC3339)})
	return b
}

func deltaValue(job string, v int64, ops ...map[string]any) []byte {
	b, _ := json.Marshal(map[string]any{"job_id": job, "version": v, "kind": "delta", "ops": ops,
		"event_id": fmt.Sprintf("evt-%s-%d", job, v)})
	return b
}

func deleteValue(job string, v int64) []byte {
	b, _ := json.Marshal(map[string]any{"job_id": job, "version": v, "kind": "delete", "event_id": fmt.Sprintf("evt-%s-%d", job, v)})
	return b
}

func rec(partition int, key string, value []byte) kafkatest.Record {
	return kafkatest.Record{Partition: partition, Key: []byte(key), Value: value}
}

// seedStory is the contract's example: job-42 v1 running, v2 completed, and
// (late=true) v1 running again, late, which must be dropped as stale.
func (s *story) seedStory(late bool) {
	s.t.Helper()
	if !late {
		s.produce(
			rec(0, "job-42", snapshotValue("job-42", 1, map[string]any{"status": "running"})),
			rec(0, "job-42", snapshotValue("job-42", 2, map[string]any{"status": "completed"})),
		)
		s.want["job-42"] = wantRow{2, map[string]any{"status": "completed"}}
		return
	}
	s.produce(rec(0, "job-42", snapshotValue("job-42", 1, map[string]any{"status": "running"})))
	s.stale++
}

// jobs produces, for each of n jobs named prefix-i on partition i mod
// partitions, steps [from, to] of its life:
//
//	v1 snapshot {status: running, name, processed: 0}
//	v2..v4 deltas increment /processed by i+v
//	v5 delta sets /status completed and removes /name
//
// Steps go round-robin over the jobs, so each partition interleaves jobs
// while every job's events stay in version order. Every 10th job's v3 is
// delivered twice (a duplicate) and every 7th job's v1 snapshot is
// delivered again after v5 (stale).
func (s *story) jobs(prefix string, n int, from, to int64) {
	s.t.Helper()
	var recs []kafkatest.Record
	for v := from; v <= to; v++ {
		for i := range n {
			job, p := fmt.Sprintf("%s-%d", prefix, i), i%s.partitions
			switch v {
			case 1:
				recs = append(recs, rec(p, job, snapshotValue(job, 1, map[string]any{"status": "running", "name": job, "processed": 0})))
			case 2, 3, 4:
				recs = append(recs, rec(p, job, deltaValue(job, v, map[string]any{"op": "increment", "path": "/processed", "by": i + int(v)})))
				if v == 3 && i%10 == 0 {
					recs = append(recs, recs[len(recs)-1])
					s.duplicates++
				}
			case 5:
				recs = append(recs, rec(p, job, deltaValue(job, 5,
					map[string]any{"op": "set", "path": "/status", "value": "completed"},
					map[string]any{"op": "remove", "path": "/name"})))
				if i%7 == 0 {
					recs = append(recs, rec(p, job, snapshotValue(job, 1, map[string]any{"status": "running", "name": job, "processed": 0})))
					s.stale++
				}
			}
		}
	}
	s.produce(recs...)
	for i := range n {
		job := fmt.Sprintf("%s-%d", prefix, i)
		state := map[string]any{"status": "running", "name": job, "processed": 0}
		for v := int64(2); v <= min(to, 4); v++ {
			state["processed"] = state["processed"].(int) + i + int(v)
		}
		if to >= 5 {
			state["status"] = "completed"
			delete(state, "name")
		}
		s.want[job] = wantRow{min(to, 5), state}
	}
}

// badRecords produces records that break the wire format, one kind per
// partition in turn; each must land in the quarantine.
func (s *story) badRecords() {
	s.t.Helper()
	bad := []kafkatest.Record{
		{Key: []byte("bad-1"), Value: []byte("not json at all")},
		{Key: []byte("bad-2"), Value: nil},                                                                   // a tombstone
		{Key: []byte("job-x"), Value: snapshotValue("job-y", 1, map[string]any{})},                           // key mismatch
		{Key: []byte("bad-4"), Value: []byte(`{"job_id":"bad-4","version":0,"kind":"snapshot","state":{}}`)}, // version 0
	}
	for i := range bad {
		bad[i].Partition = i % s.partitions
	}
	s.produce(bad...)
	s.quarantined += int64(len(bad))
}

// deletes produces n jobs gone-i that are deleted: v1 snapshot, v2 delta,
// v3 delete, then the v2 snapshot late (stale) and the v2 delta again
// (duplicate). None may be in the read model.
func (s *story) deletes(n int) {
	s.t.Helper()
	var recs []kafkatest.Record
	for i := range n {
		job, p := fmt.Sprintf("gone-%d", i), i%s.partitions
		recs = append(recs,
			rec(p, job, snapshotValue(job, 1, map[string]any{"status": "running"})),
			rec(p, job, deltaValue(job, 2, map[string]any{"op": "set", "path": "/status", "value": "cancelled"})),
			rec(p, job, deleteValue(job, 3)),
			rec(p, job, snapshotValue(job, 2, map[string]any{"status": "cancelled"})),
			rec(p, job, deltaValue(job, 2, map[string]any{"op": "set", "path": "/status", "value": "cancelled"})),
		)
		delete(s.want, job)
	}
	s.produce(recs...)
	s.deleted += int64(n)
	s.stale += int64(n)
	s.duplicates += int64(n)
}

// fullStory is the whole fixture: the seed story with its late record, 60
// jobs through all five versions, 3 deleted jobs with late records, and
// the bad records.
func (s *story) fullStory() {
	s.seedStory(false)
	s.jobs("task", 60, 1, 5)
	s.deletes(3)
	s.badRecords()
	s.seedStory(true)
}

func (s *story) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.t.Context(), 10*time.Second)
}

func (s *story) highWatermarks() map[int]int64 {
	s.t.Helper()
	ctx, cancel := s.ctx()
	defer cancel()
	hw, err := s.kafka.HighWatermarks(ctx, s.topic)
	require.NoError(s.t, err)
	return hw
}

// positions are the stored next offsets of the live projection, by
// partition, or an error while the tables do not exist yet.
func (s *story) positions() (map[int]int64, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	pos, err := s.st.Positions(ctx)
	if err != nil {
		return nil, err
	}
	out := map[int]int64{}
	for _, p := range pos {
		if p.Topic == s.topic {
			out[p.Partition] = p.NextOffset
		}
	}
	return out, nil
}

// caughtUp waits until every partition's stored position is its high
// watermark.
func (s *story) caughtUp(within time.Duration, procs ...*proc) {
	s.t.Helper()
	hw := s.highWatermarks()
	eventually(s.t, within, "stored positions reach the high watermarks", func() (bool, string) {
		for _, p := range procs {
			p.requireAlive()
		}
		pos, err := s.positions()
		if err != nil {
			return false, err.Error()
		}
		return maps.Equal(pos, hw), fmt.Sprintf("positions %v, high watermarks %v", pos, hw)
	})
}

// requirePositionsAtEnd requires the stored positions to equal the high
// watermarks now.
func (s *story) requirePositionsAtEnd() {
	s.t.Helper()
	pos, err := s.positions()
	require.NoError(s.t, err)
	require.Equal(s.t, s.highWatermarks(), pos, "stored positions against the high watermarks")
}

// requireModel requires the read model to be exactly s.want: the same
// jobs, each at its version with its state.
func (s *story) requireModel() {
	s.t.Helper()
	ctx, cancel := s.ctx()
	defer cancel()
	rows, err := s.st.Jobs(ctx)
	require.NoError(s.t, err)
	require.ElementsMatch(s.t, slices.Collect(maps.Keys(s.want)), slices.Collect(maps.Keys(rows)), "the read model's jobs")
	for id, w := range s.want {
		r := rows[id]
		wantState, _ := json.Marshal(w.state)
		require.Equal(s.t, w.version, r.Version, "%s version", id)
		require.JSONEq(s.t, string(wantState), string(r.State), "%s state", id)
	}
}

// quarantineCount is how many records the live projection quarantined.
func (s *story) quarantineCount() int {
	s.t.Helper()
	ctx, cancel := s.ctx()
	defer cancel()
	_, n, err := s.st.Quarantine(ctx, 0)
	require.NoError(s.t, err)
	return n
}

// exec runs SQL in the story's schema.
func (s *story) exec(sql string, args ...any) int64 {
	s.t.Helper()
	ctx, cancel := s.ctx()
	defer cancel()
	tag, err := pgtest.Pool(s.t).Exec(ctx, sql, args...)
	require.NoError(s.t, err, sql)
	return tag.RowsAffected()
}

func (s *story) table(name string) string { return pgx.Identifier{s.schema, name}.Sanitize() }

// runArgs are the arguments of a `projector run` on the story's topic.
func (s *story) runArgs(group, owner string, extra ...string) []string {
	return append([]string{"run",
		"--brokers", s.brokers(), "--topic", s.topic, "--group", group, "--schema", s.schema,
		"--http-addr", "127.0.0.1:0", "--owner", owner, "--log-format", "json", "--batch-linger", "10ms",
	}, extra...)
}

// holdRow locks job's row, produces recs, and waits until p's batch is
// blocked on that lock inside its transaction (after the fence). The
// returned release lets the batch go; calling it again does nothing.
func (s *story) holdRow(p *proc, job string, recs ...kafkatest.Record) (release func()) {
	s.t.Helper()
	ctx := s.t.Context()
	release = s.lockRow(job)
	s.produce(recs...)
	eventually(s.t, joinWithin, "the batch waits inside its transaction", func() (bool, string) {
		p.requireAlive()
		var n int
		err := pgtest.Pool(s.t).QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND state = 'active' AND strpos(query, $1) > 0`, s.table("jobs")).Scan(&n)
		if err != nil {
			return false, err.Error()
		}
		return n > 0, fmt.Sprintf("%d backends waiting", n)
	})
	return release
}

// lockRow locks job's row in a transaction of its own until release is
// called (again: nothing) or the test ends.
func (s *story) lockRow(job string) (release func()) {
	s.t.Helper()
	ctx := s.t.Context()
	tx, err := pgtest.Pool(s.t).Begin(ctx)
	require.NoError(s.t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+s.table("jobs")+` WHERE job_id = $1 FOR UPDATE`, job)
	require.NoError(s.t, err)
	release = func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }
	s.t.Cleanup(release)
	return release
}

package projection

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/store"
)

// TestWrittenSetNeverForgetsAndSeldomGuesses: every job added is reported
// (a job reported absent is taken as new without a read, so a miss would
// plan from an empty state), from any goroutine; and at a million jobs, as
// the bench's rebuild has, few others are.
func TestWrittenSetNeverForgetsAndSeldomGuesses(t *testing.T) {
	t.Parallel()
	s := newWrittenSet()
	const n = 1_000_000
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := g; i < n; i += 4 {
				s.add(fmt.Sprintf("job-%d", i))
			}
		})
	}
	wg.Wait()
	for i := range n {
		if !s.mayHold(fmt.Sprintf("job-%d", i)) {
			t.Fatalf("job-%d was added but is reported absent", i)
		}
	}
	guessed := 0
	for i := range n {
		if s.mayHold(fmt.Sprintf("other-%d", i)) {
			guessed++
		}
	}
	// Three probes in 2^24 bits at a million jobs: about 0.5%.
	require.Less(t, guessed, n/100, "jobs never added but reported as maybe written, of %d", n)
	require.False(t, newWrittenSet().mayHold("job-1"), "an empty set holds nothing")
}

// projectFirst projects recs with an engine of its own and stops it: rows
// the next engine's set has not seen.
func projectFirst(t *testing.T, r *rig, recs ...rec) {
	t.Helper()
	r.produce(recs...)
	first := r.start(r.config())
	r.caughtUp(30*time.Second, first)
	first.halt(t)
}

// requireName puts a user's check on the jobs table: a state without
// "name" is refused.
func requireName(t *testing.T, r *rig) {
	t.Helper()
	_, err := r.store.Pool().Exec(context.Background(), `ALTER TABLE `+r.store.JobsTable()+` ADD CONSTRAINT has_name CHECK (state ? 'name')`)
	require.NoError(t, err)
}

// startWithEmptySet runs the projection, reading on from its stored
// positions, with a set that has seen nothing (as a rebuild's would if
// anything else wrote its shadow), until the test ends; logs has its log.
func startWithEmptySet(t *testing.T, r *rig) (run *running, logs *lockedBuffer) {
	t.Helper()
	logs = &lockedBuffer{}
	p, err := New(r.config(func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(logs, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelInfo}))
	}))
	require.NoError(t, err)
	p.written = newWrittenSet()
	ctx, cancel := context.WithCancel(context.Background())
	run = &running{p: p, stop: cancel, done: make(chan error, 1)}
	go func() { run.done <- p.Run(ctx) }()
	t.Cleanup(func() { run.halt(t) })
	return run, logs
}

// TestWrittenSetWrongAnswerCostsARetryNotARow: an engine whose set says
// "never written" for jobs the table does hold (as it would if anything
// but the rebuild's own process wrote the shadow) still leaves exact rows.
// A delta ahead of the row is planned as held behind a gap from version 0,
// and a delta at the row's own version followed by the next one as an
// insert of a new job: the conditional writes refuse both, the jobs are
// read back, and the batch is planned again from their rows. Before the
// stale jobs were added to the set, the retry skipped the read again,
// forever.
func TestWrittenSetWrongAnswerCostsARetryNotARow(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	inc := `[{"op":"increment","path":"/n","by":1}]`
	projectFirst(t, r, rec{0, "ahead", snap("ahead", 1, `{"n":10}`)}, rec{0, "same", snap("same", 1, `{"n":20}`)})
	run, logs := startWithEmptySet(t, r)
	r.produce(
		rec{0, "ahead", dlt("ahead", 2, inc)},
		// Version 1 again, with ops: from an empty state it would make n 1.
		rec{0, "same", dlt("same", 1, inc)},
		rec{0, "same", dlt("same", 2, inc)},
	)
	r.caughtUp(30*time.Second, run)
	// The set was asked: each job was planned as new, and its write refused.
	for _, id := range []string{"ahead", "same"} {
		require.Regexp(t, `msg="rows moved under the batch; reloading them" .* first=`+id+`( |\n)`, logs.String())
	}
	want := map[string]string{"ahead": `{"n": 11}`, "same": `{"n": 21}`}
	rows := r.rows()
	for id, state := range want {
		row, ok := rows[id]
		require.True(t, ok, "job %s has no row", id)
		require.EqualValues(t, 2, row.Version, "job %s", id)
		var got, exp any
		require.NoError(t, json.Unmarshal(row.State, &got))
		require.NoError(t, json.Unmarshal([]byte(state), &exp))
		require.Equal(t, exp, got, "job %s: its row was planned from nothing instead of read", id)
	}
}

// TestWrittenSetWrongGuessUnderACheckIsPlannedAgain: a check the user put
// on the table runs before the insert's conflict, so a job wrongly taken
// as new, planned from nothing, makes a state the check refuses: bad data
// to the engine. The batch is planned once more with the job's row read
// before any record is called bad. The one record here, a duplicate of
// the row's version, would otherwise be quarantined: a batch of one record
// is not planned again by the isolation of its records.
func TestWrittenSetWrongGuessUnderACheckIsPlannedAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRig(t, 1)
	projectFirst(t, r, rec{0, "checked", snap("checked", 1, `{"name":"a","n":20}`)})
	requireName(t, r)
	run, logs := startWithEmptySet(t, r)
	inc := `[{"op":"increment","path":"/n","by":1}]`
	r.produce(rec{0, "checked", dlt("checked", 1, inc)})
	r.caughtUp(30*time.Second, run)
	require.Contains(t, logs.String(), "planning it again with their rows read")
	bad, err := r.store.QuarantineIDs(ctx)
	require.NoError(t, err)
	require.Empty(t, bad, "a duplicate of the row's version was quarantined")
	require.EqualValues(t, 1, run.p.Status().Counters.Duplicates)

	r.produce(rec{0, "checked", dlt("checked", 2, inc)})
	r.caughtUp(30*time.Second, run)
	row := r.rows()["checked"]
	require.EqualValues(t, 2, row.Version)
	require.JSONEq(t, `{"name":"a","n":21}`, string(row.State))
}

// TestRebuildKeepsTheWrittenSetOnlyWhenItStartsAfresh: a rebuild that
// starts from an empty shadow keeps the set, and has every job it wrote in
// it; one that resumes a shadow others' batches may have written has none.
func TestRebuildKeepsTheWrittenSetOnlyWhenItStartsAfresh(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	ids := jobIDs("fresh", 20)
	var recs []rec
	for _, id := range ids {
		recs = append(recs, rec{0, id, snap(id, 1, `{"n":1}`)}, rec{0, id, dlt(id, 2, `[{"op":"increment","path":"/n","by":1}]`)})
	}
	r.produce(recs...)
	live := r.start(r.config())
	r.caughtUp(30*time.Second, live)
	live.halt(t)

	rebuild := func() *Projector {
		var seen *Projector
		rb := &Rebuild{Live: r.store, Config: r.config(func(c *Config) { c.Group = r.topic + "-rebuild" }), DryRun: true,
			Started: func(p *Projector) (func(), error) { seen = p; return func() {}, nil }}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := rb.Run(ctx)
		require.NoError(t, err)
		require.NotNil(t, seen, "the rebuild's engine was not started")
		return seen
	}
	fresh := rebuild()
	require.NotNil(t, fresh.written, "a rebuild from an empty shadow keeps the set")
	for _, id := range ids {
		require.True(t, fresh.written.mayHold(id), "job %s was written but is not in the set", id)
	}
	// The dry run leaves its shadow: this one continues from it.
	require.True(t, rebuild().written == nil, "a resumed rebuild has no set: its shadow holds rows it did not see written")
}

// TestWrittenSetPlanningAgainStillQuarantinesABadRecord: the second plan
// does not hide a record that is bad in itself. Here a job the check
// refuses whatever is read sits in a batch with a good job: the batch is
// planned again once, then its records are isolated, the bad one is
// quarantined and the good one applied.
func TestWrittenSetPlanningAgainStillQuarantinesABadRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRig(t, 1)
	require.NoError(t, r.store.Migrate(ctx))
	requireName(t, r)
	run, logs := startWithEmptySet(t, r)
	inc := `[{"op":"increment","path":"/n","by":1}]`
	r.produce(
		rec{0, "good", snap("good", 1, `{"name":"g","n":0}`)},
		rec{0, "good", dlt("good", 2, inc)},
		rec{0, "bad", dlt("bad", 1, inc)},
	)
	r.caughtUp(30*time.Second, run)
	bad, err := r.store.QuarantineRecords(ctx, store.QuarantineFilter{})
	require.NoError(t, err)
	require.Len(t, bad, 1)
	require.Equal(t, int64(2), bad[0].Offset, "the bad job's record, and only it, is quarantined")
	require.Equal(t, 1, strings.Count(logs.String(), "planning it again with their rows read"), "planned again once")
	rows := r.rows()
	require.EqualValues(t, 2, rows["good"].Version)
	require.JSONEq(t, `{"name":"g","n":1}`, string(rows["good"].State))
	require.NotContains(t, rows, "bad")
}

// TestWrittenSetNoSecondPlanOnceStopping: a batch refused as bad data while
// the worker is told to stop is not planned and applied again: a batch
// that did not land is abandoned at shutdown, to be read again by the
// partition's next owner.
func TestWrittenSetNoSecondPlanOnceStopping(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRig(t, 1)
	projectFirst(t, r, rec{0, "checked", snap("checked", 1, `{"name":"a","n":20}`)})
	requireName(t, r)

	var applies atomic.Int32
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p, err := New(r.config(func(c *Config) {
		c.testBeforeApply = func(int) {
			if applies.Add(1) == 1 {
				cancel() // told to stop while the first attempt runs
			}
		}
	}))
	require.NoError(t, err)
	p.written = newWrittenSet()
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	r.produce(rec{0, "checked", dlt("checked", 1, `[{"op":"increment","path":"/n","by":1}]`)})
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the projector did not stop within 30s")
	}
	require.EqualValues(t, 1, applies.Load(), "a batch was planned and applied again after the stop")
	ids, err := r.store.QuarantineIDs(ctx)
	require.NoError(t, err)
	require.Empty(t, ids, "the batch was abandoned, not isolated")
}

// TestWrittenSetNewJobsAreCopiedIn: the jobs a set that has not seen them
// calls new are written by a COPY, not by the insert, and the job it has
// seen by an update. A trigger records which statement wrote each row.
func TestWrittenSetNewJobsAreCopiedIn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRig(t, 1)
	require.NoError(t, r.store.Migrate(ctx))
	var schema string
	require.NoError(t, r.store.Pool().QueryRow(ctx, `SELECT quote_ident(n.nspname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = $1::regclass`, r.store.JobsTable()).Scan(&schema))
	_, err := r.store.Pool().Exec(ctx, `CREATE TABLE `+schema+`.probe (job_id text, version bigint, stmt text);
		CREATE FUNCTION `+schema+`.probe() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO `+schema+`.probe VALUES (NEW.job_id, NEW.version, split_part(ltrim(current_query()), ' ', 1));
			RETURN NEW;
		END $$;
		CREATE TRIGGER probe BEFORE INSERT OR UPDATE ON `+r.store.JobsTable()+` FOR EACH ROW EXECUTE FUNCTION `+schema+`.probe()`)
	require.NoError(t, err)
	run, _ := startWithEmptySet(t, r)
	inc := `[{"op":"increment","path":"/n","by":1}]`
	r.produce(rec{0, "a", dlt("a", 1, inc)}, rec{0, "b", dlt("b", 1, inc)})
	r.caughtUp(30*time.Second, run)
	r.produce(rec{0, "a", dlt("a", 2, inc)})
	r.caughtUp(30*time.Second, run)

	rows, err := r.store.Pool().Query(ctx, `SELECT job_id || '@' || version || ' ' || upper(stmt) FROM `+schema+`.probe ORDER BY 1`)
	require.NoError(t, err)
	var got []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		got = append(got, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"a@1 COPY", "a@2 UPDATE", "b@1 COPY"}, got)
	require.EqualValues(t, 2, r.rows()["a"].Version)
	require.JSONEq(t, `{"n": 2}`, string(r.rows()["a"].State))
}

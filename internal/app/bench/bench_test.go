package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/app/jobgen"
	"github.com/projector/projector/internal/testkit/pgtest"
)

func small(mix string) Config {
	return Config{DatabaseURL: pgtest.URL(), Mix: mix, Events: 1500, Jobs: 150, Partitions: 3, NaiveSample: 20, Seed: 3}
}

// TestRunChecksExact: a run of each mix, and of the spread shape, ends
// with the read model equal to the reference, and reports the projector's
// figures and the stream's shape.
func TestRunChecksExact(t *testing.T) {
	t.Parallel()
	for _, name := range append(slices.Clone(Mixes), "mixed spread") {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			mix, shape, _ := strings.Cut(name, " ")
			cfg := small(mix)
			cfg.Shape = shape
			cfg.BatchSize = 200
			cfg.checkChunk = 40 // the check crosses chunks
			rep, err := Run(t.Context(), cfg)
			require.NoError(t, err)
			require.Equal(t, mix, rep.Mix)
			require.Equal(t, cmp.Or(shape, ShapeClustered), rep.Shape)
			require.Equal(t, 150, rep.Jobs)
			require.Equal(t, 200, rep.BatchSize)
			// The figure is the stream's: partition 0's records of the
			// whole stream, cut every 200.
			gen := cfg.withDefaults().generator(cfg.Seed, cfg.Events, true)
			require.Equal(t, jobgen.Generate(gen).DistinctJobsPerBatch(0, 200), rep.DistinctJobsPerBatch)
			// Partition 0 has about 50 of the 150 jobs.
			if shape == ShapeSpread {
				require.Greater(t, rep.DistinctJobsPerBatch, 40.0, "a batch of the spread shape meets most of its partition's jobs")
			} else {
				gen.Shape = ShapeSpread
				require.Less(t, rep.DistinctJobsPerBatch, jobgen.Generate(gen).DistinctJobsPerBatch(0, 200),
					"a batch of the clustered shape meets fewer jobs than one of the same stream spread")
			}
			require.Positive(t, rep.ProjectorEventsPerSecond)
			require.Positive(t, rep.ProjectorRatioToNaive)
			require.Positive(t, rep.PeakHeapBytes)
			require.Positive(t, rep.PeakLiveHeapBytes)
			// Not by construction (the two are read apart, and a
			// collection's live figure is new before every CPU's cache of
			// objects is counted), but by a wide margin: the heap runs at
			// about twice its live part.
			require.LessOrEqual(t, rep.PeakLiveHeapBytes, rep.PeakHeapBytes, "the live heap is part of the heap")
			require.Positive(t, rep.BenchPeakRSSBytes, "the bench process's own peak is reported")
			require.Contains(t, rep.Broker, "in this process", "without an executable the broker shares the process, and says so")
			require.Contains(t, rep.Projector, "in this process", "and so does the projector")
		})
	}
}

// TestRunWithWaiters: a run with waits held reports the projector's rate
// with them beside the rate without, and what they took; its read model
// is checked exact too.
func TestRunWithWaiters(t *testing.T) {
	t.Parallel()
	cfg := small(MixMixed)
	cfg.Waiters = 500
	rep, err := Run(t.Context(), cfg)
	require.NoError(t, err)
	require.Equal(t, 500, rep.Waiters)
	require.Positive(t, rep.WaitersEventsPerSecond)
	require.Positive(t, rep.WaitersRatio)
	require.GreaterOrEqual(t, rep.WaitersGoroutines, 500, "a goroutine per waiting caller")
	t.Logf("with 500 waits: %.0f events/s, %.2fx; %d goroutines, %d bytes of heap",
		rep.WaitersEventsPerSecond, rep.WaitersRatio, rep.WaitersGoroutines, rep.WaitersHeapBytes)
}

// TestWrongReadModelFails: a run whose read model differs from the
// reference fails with a MismatchError naming the job, however fast it was.
func TestWrongReadModelFails(t *testing.T) {
	t.Parallel()
	for name, tamper := range map[string]string{
		"a state":               `UPDATE %s SET state = '{"status":"lost"}' WHERE job_id = 'job-00007'`,
		"a state, spread":       `UPDATE %s SET state = '{"status":"lost"}' WHERE job_id = 'job-00007'`,
		"one number, spread":    `UPDATE %s SET state = jsonb_set(state, '{processed_articles}', to_jsonb((state->>'processed_articles')::int + 1)) WHERE job_id = 'job-00007'`,
		"a version":             `UPDATE %s SET version = version - 1 WHERE job_id = 'job-00007'`,
		"a row gone":            `DELETE FROM %s WHERE job_id = 'job-00007'`,
		"a row extra":           `INSERT INTO %s (job_id, version, state) VALUES ('job-stray', 1, '{}')`,
		"a row extra, spread":   `INSERT INTO %s (job_id, version, state) VALUES ('job-stray', 1, '{}')`,
		"a state, second chunk": `UPDATE %s SET state = state || '{"extra": 1}' WHERE job_id = 'job-00107'`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := small(MixMixed)
			if strings.HasSuffix(name, "spread") {
				cfg.Shape = ShapeSpread
			}
			cfg.checkChunk = 100
			cfg.tamper = func(ctx context.Context, pool *pgxpool.Pool, table string) error {
				_, err := pool.Exec(ctx, sprintf(tamper, table))
				return err
			}
			_, err := Run(t.Context(), cfg)
			var wrong *MismatchError
			require.True(t, errors.As(err, &wrong), "want a MismatchError, got %v", err)
			switch {
			case strings.HasPrefix(name, "a row extra"):
				require.Equal(t, int64(151), wrong.Rows)
			case strings.HasSuffix(name, "second chunk"):
				require.Equal(t, "job-00107", wrong.FirstJobID)
				require.Equal(t, 1, wrong.Wrong)
			default:
				require.Equal(t, "job-00007", wrong.FirstJobID)
				require.Equal(t, 1, wrong.Wrong)
			}
		})
	}
}

// TestValidate names the field at fault.
func TestValidate(t *testing.T) {
	t.Parallel()
	for field, cfg := range map[string]Config{
		"Mix":        {Mix: "some", Events: 1000, Jobs: 10, Partitions: 1, NaiveSample: 10},
		"Shape":      {Mix: MixMixed, Shape: "round", Events: 1000, Jobs: 10, Partitions: 1, NaiveSample: 10},
		"Events":     {Mix: MixMixed, Events: 10, Jobs: 1, Partitions: 1, NaiveSample: 10},
		"Jobs":       {Mix: MixMixed, Events: 1000, Jobs: 500, Partitions: 1, NaiveSample: 10},
		"StateBytes": {Mix: MixMixed, Events: 1000, Jobs: 10, Partitions: 1, NaiveSample: 10, StateBytes: -1},
		"Live":       {Mix: MixMixed, Events: 1000, Jobs: 10, Partitions: 1, NaiveSample: 10, Live: true, LiveDuration: time.Millisecond},
		"Rebuild":    {Mix: MixMixed, Events: 1000, Jobs: 10, Partitions: 1, NaiveSample: 10, Rebuild: true},
		"Waiters":    {Mix: MixMixed, Events: 1000, Jobs: 10, Partitions: 1, NaiveSample: 10, Waiters: -1},
	} {
		err := cfg.Validate()
		require.Error(t, err, field)
		require.Contains(t, err.Error(), field)
	}
}

func sprintf(format, table string) string { return fmt.Sprintf(format, table) }

// TestCheckDeletedJobHasNoRow: a job the reference has deleted must have
// no row; one that has fails the check, and the check passes once it is
// gone.
func TestCheckDeletedJobHasNoRow(t *testing.T) {
	t.Parallel()
	st := pgtest.Store(t)
	pool := pgtest.Pool(t)
	ctx := t.Context()
	state := `{"status": "completed", "processed_articles": 12}`
	h, err := jobgen.StateHash([]byte(state))
	require.NoError(t, err)
	refs := []jobgen.Ref{{Version: 3, Hash: h}, {Version: 4, Deleted: true}, {Version: 3, Hash: h}}
	for _, id := range []string{"job-00000", "job-00001", "job-00002"} {
		_, err := pool.Exec(ctx, `INSERT INTO `+st.JobsTable()+` (job_id, version, state) VALUES ($1, 3, $2)`, id, state)
		require.NoError(t, err)
	}
	err = check(ctx, pool, st.JobsTable(), refs, 0, 2)
	var wrong *MismatchError
	require.True(t, errors.As(err, &wrong), "want a MismatchError, got %v", err)
	require.Equal(t, "job-00001", wrong.FirstJobID)
	_, err = pool.Exec(ctx, `DELETE FROM `+st.JobsTable()+` WHERE job_id = 'job-00001'`)
	require.NoError(t, err)
	require.NoError(t, check(ctx, pool, st.JobsTable(), refs, 0, 2))
}

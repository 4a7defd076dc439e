package bench

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
)

func small(mix string) Config {
	return Config{DatabaseURL: pgtest.URL(), Mix: mix, Events: 1500, Jobs: 150, Partitions: 3, NaiveSample: 20, Seed: 3}
}

// TestRunChecksExact: a run of each mix ends with the read model equal to
// the reference, and reports the projector's figures.
func TestRunChecksExact(t *testing.T) {
	t.Parallel()
	for _, mix := range Mixes {
		t.Run(mix, func(t *testing.T) {
			t.Parallel()
			rep, err := Run(t.Context(), small(mix))
			require.NoError(t, err)
			require.Equal(t, mix, rep.Mix)
			require.Positive(t, rep.ProjectorEventsPerSecond)
			require.Positive(t, rep.ProjectorRatioToNaive)
			require.Positive(t, rep.PeakHeapBytes)
			require.Contains(t, rep.Broker, "in this process", "without an executable the broker shares the process, and says so")
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
		"a state":     `UPDATE %s SET state = '{"status":"lost"}' WHERE job_id = 'job-00007'`,
		"a version":   `UPDATE %s SET version = version - 1 WHERE job_id = 'job-00007'`,
		"a row gone":  `DELETE FROM %s WHERE job_id = 'job-00007'`,
		"a row extra": `INSERT INTO %s (job_id, version, state) VALUES ('job-stray', 1, '{}')`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := small(MixMixed)
			cfg.tamper = func(ctx context.Context, pool *pgxpool.Pool, table string) error {
				_, err := pool.Exec(ctx, sprintf(tamper, table))
				return err
			}
			_, err := Run(t.Context(), cfg)
			var wrong *MismatchError
			require.True(t, errors.As(err, &wrong), "want a MismatchError, got %v", err)
			if name != "a row extra" {
				require.Equal(t, "job-00007", wrong.FirstJobID)
			}
		})
	}
}

// TestValidate names the field at fault.
func TestValidate(t *testing.T) {
	t.Parallel()
	for field, cfg := range map[string]Config{
		"Mix":        {Mix: "some", Events: 1000, Jobs: 10, Partitions: 1, NaiveSample: 10},
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

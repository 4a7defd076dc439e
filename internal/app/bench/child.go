package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector/projector/internal/app/broker"
	"github.com/projector/projector/projection"
	"github.com/projector/projector/store"
)

// ProjectorChildEnv, set in the environment of `projector bench`, makes the
// process run the projector's measured run instead (see [ServeProjector]);
// its value is the run's spec as JSON.
const ProjectorChildEnv = "PROJECTOR_BENCH_PROJECTOR_CHILD"

// childSpec is one measured projector run: the table it writes (already
// migrated), the topic it reads, and where its stored positions end.
type childSpec struct {
	DatabaseURL string   `json:"database_url"`
	Schema      string   `json:"schema"`
	Table       string   `json:"table"`
	Topic       string   `json:"topic"`
	Group       string   `json:"group"`
	Brokers     []string `json:"brokers"`
	BatchSize   int      `json:"batch_size"`
	// BatchesInFlight is the engine's Config.BatchesInFlight.
	BatchesInFlight int           `json:"batches_in_flight,omitempty"`
	HWM             map[int]int64 `json:"hwm"`
	// CPUProfile and AllocProfile name the files for the profiles, if any.
	CPUProfile   string `json:"cpu_profile,omitempty"`
	AllocProfile string `json:"alloc_profile,omitempty"`
}

// childResult is what the run measured, or the error that ended it.
type childResult struct {
	Seconds           float64 `json:"seconds"`
	PeakHeapBytes     int64   `json:"peak_heap_bytes"`
	PeakLiveHeapBytes int64   `json:"peak_live_heap_bytes"`
	PeakRSSBytes      int64   `json:"peak_rss_bytes"`
	HeapBeforeBytes   int64   `json:"heap_before_bytes"`
	// BatchesInFlight is the engine's bound as it took it (its default is
	// sized to the memory limit), MemoryLimitBytes the soft memory limit
	// the run had (0: none).
	BatchesInFlight  int    `json:"batches_in_flight"`
	MemoryLimitBytes int64  `json:"memory_limit_bytes"`
	Error            string `json:"error,omitempty"`
}

// ServeProjector runs one measured projector run for a parent bench
// process, described by spec (the value of [ProjectorChildEnv]), and
// writes its result as one JSON line on out. In a process of its own the
// projector's heap and resident set are its alone: no generated stream,
// no reference, no baselines.
func ServeProjector(ctx context.Context, spec string, out io.Writer, logger *slog.Logger) error {
	var s childSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		return fmt.Errorf("bench: projector child: spec: %w", err)
	}
	pool, err := store.OpenPool(ctx, s.DatabaseURL)
	if err != nil {
		return fmt.Errorf("bench: projector child: %w", err)
	}
	defer pool.Close()
	res, err := projectorRun(ctx, pool, s, logger)
	if err != nil {
		res.Error = err.Error()
	}
	return json.NewEncoder(out).Encode(res)
}

// runProjectorChild starts the executable as a projector child for spec and
// returns what it measured.
func runProjectorChild(ctx context.Context, executable string, args []string, spec childSpec) (childResult, error) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return childResult{}, err
	}
	cmd := exec.CommandContext(ctx, executable, append([]string{"bench"}, args...)...)
	cmd.Env = append(os.Environ(), ProjectorChildEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return childResult{}, err
	}
	if err := cmd.Start(); err != nil {
		return childResult{}, fmt.Errorf("start the projector process: %w", err)
	}
	line, readErr := bufio.NewReader(stdout).ReadString('\n')
	waitErr := cmd.Wait()
	var res childResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(line)), &res); err != nil {
		return res, fmt.Errorf("projector process: no result (read %q: %v; exit: %v)", line, readErr, waitErr)
	}
	if res.Error != "" {
		return res, fmt.Errorf("projector process: %s", res.Error)
	}
	if waitErr != nil {
		return res, fmt.Errorf("projector process: %w", waitErr)
	}
	return res, nil
}

// projectorRun is the measured run: the engine from the start to every
// partition's stored position at its high watermark, sampling this
// process's heap and resident set meanwhile.
func projectorRun(ctx context.Context, pool *pgxpool.Pool, s childSpec, logger *slog.Logger) (childResult, error) {
	var res childResult
	if limit := debug.SetMemoryLimit(-1); limit != math.MaxInt64 {
		res.MemoryLimitBytes = limit
	}
	st, err := store.New(pool, store.Config{Schema: s.Schema, Table: s.Table})
	if err != nil {
		return res, err
	}
	p, err := newEngine(s, st, logger)
	if err != nil {
		return res, err
	}
	res.BatchesInFlight = p.Config().BatchesInFlight
	var cpu, alloc *os.File
	for _, f := range []struct {
		path string
		to   **os.File
	}{{s.CPUProfile, &cpu}, {s.AllocProfile, &alloc}} {
		if f.path == "" {
			continue
		}
		if *f.to, err = os.Create(f.path); err != nil {
			return res, fmt.Errorf("profile: %w", err)
		}
		defer (*f.to).Close()
	}
	mem := startMemSampler()
	if cpu != nil {
		if err := pprof.StartCPUProfile(cpu); err != nil {
			return res, fmt.Errorf("cpu profile: %w", err)
		}
	}
	elapsed, err := runUntil(ctx, p, st, s.HWM, func() error {
		if cpu != nil {
			pprof.StopCPUProfile()
			cpu = nil
		}
		if alloc == nil {
			return nil
		}
		// A collection first, so that the profile's heap in use is the
		// engine's now, while it still holds what it holds when caught up.
		runtime.GC()
		if err := pprof.Lookup("allocs").WriteTo(alloc, 0); err != nil {
			return fmt.Errorf("alloc profile: %w", err)
		}
		return nil
	})
	if cpu != nil {
		pprof.StopCPUProfile()
	}
	res.PeakHeapBytes, res.PeakLiveHeapBytes, res.PeakRSSBytes, res.HeapBeforeBytes = mem.finish()
	res.Seconds = elapsed.Seconds()
	return res, err
}

// sessionTimeout is the consumer-group session of the projector's runs
// and the rebuild's. The broker's test timings ([broker.GroupSessionTimeout],
// 2 s) let a test see a vanished member quickly; a bench has one member
// per group and nothing to detect, and a broker holding gigabytes that
// answers a heartbeat late then evicted the run's only member mid-run
// (a rebalance, its batches read again) and counted that in its rate.
// Kafka's own default is 45 s.
const sessionTimeout = 20 * time.Second

// newEngine is the projector `projector run` would be, with the batch
// linger, fetch wait and gap wait of its defaults.
func newEngine(s childSpec, st *store.Store, logger *slog.Logger) (*projection.Projector, error) {
	return projection.New(projection.Config{
		Brokers: s.Brokers, Topic: s.Topic, Group: s.Group, Store: st, Logger: logger,
		BatchSize:         s.BatchSize,
		BatchesInFlight:   s.BatchesInFlight,
		HeartbeatInterval: broker.GroupHeartbeatInterval, SessionTimeout: sessionTimeout,
		RebalanceTimeout: broker.GroupRebalanceTimeout, JoinGroupBackoff: broker.GroupJoinBackoff,
		PartitionWatchInterval: broker.GroupPartitionWatchInterval,
	})
}

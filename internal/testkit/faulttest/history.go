package faulttest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/projector/projector/internal/testkit/kafkatest"
)

// Target is the projection a fault test watches.
type Target struct {
	// Pool reads the schema directly, never through a faulty path.
	Pool   *pgxpool.Pool
	Schema string
	// Table is the read-model table; "jobs" when empty. It also names the
	// projection in the projector's own tables.
	Table string
	// Kafka, Topic and Group are the log and the consumer group whose
	// committed offsets are sampled (invariant 4). A source without
	// offsets (an SQS queue) leaves Kafka nil: nothing is sampled, and the
	// test waits for its own end before [History.Check].
	Kafka *kafkatest.Cluster
	Topic string
	Group string
	// SampleEvery is how often the group's committed offsets and the
	// stored positions are sampled; 50 ms when zero.
	SampleEvery time.Duration
}

// History watches one projection for the length of a fault test: the
// audit records every change of its rows, and a sampler reads the Kafka
// group's committed offsets and the positions in PostgreSQL side by side.
type History struct {
	t         testing.TB
	tg        Target
	client    *kafka.Client
	transport *kafka.Transport

	stop context.CancelFunc
	wg   sync.WaitGroup

	mu         sync.Mutex
	samples    int
	violations []string
	lastPos    map[int]int64
	lastCommit map[int]int64
}

// Watch installs the audit on tg's schema (whose tables must exist: migrate
// first) and starts sampling; both stop when the test ends or at
// [History.Check].
func Watch(t testing.TB, tg Target) *History {
	t.Helper()
	if tg.Table == "" {
		tg.Table = "jobs"
	}
	if tg.SampleEvery == 0 {
		tg.SampleEvery = 50 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := installAudit(ctx, tg.Pool, tg.Schema, tg.Table); err != nil {
		t.Fatal(err)
	}
	h := &History{t: t, tg: tg, lastPos: map[int]int64{}, lastCommit: map[int]int64{}}
	sctx, stop := context.WithCancel(context.Background())
	h.stop = stop
	if tg.Kafka != nil {
		h.transport = &kafka.Transport{}
		h.client = &kafka.Client{Addr: kafka.TCP(tg.Kafka.Addrs()...), Transport: h.transport, Timeout: 2 * time.Second}
		h.wg.Go(func() { h.sample(sctx) })
	}
	t.Cleanup(h.halt)
	return h
}

func (h *History) halt() {
	h.stop()
	h.wg.Wait()
	if h.transport != nil {
		h.transport.CloseIdleConnections()
	}
}

// sample checks, every SampleEvery, that the group's committed offset of
// each partition is at most the position stored in PostgreSQL, and that
// neither went backwards. The committed offset is read first: stored
// positions only grow, so one read after it can only be higher, and a
// committed offset above the stored position read after it is a real
// violation, never a race of the sampler.
func (h *History) sample(ctx context.Context) {
	t := time.NewTicker(h.tg.SampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		committed, err := h.committed(ctx)
		if err != nil {
			continue // the broker may be cut off on purpose
		}
		pos, err := h.positions(ctx)
		if err != nil {
			continue // so may PostgreSQL's path
		}
		h.mu.Lock()
		h.samples++
		for p, c := range committed {
			if c >= 0 && c > pos[p] {
				h.violate("partition %d: the group's committed offset %d passed the position stored in PostgreSQL %d", p, c, pos[p])
			}
			if last, ok := h.lastCommit[p]; ok && c < last {
				h.violate("partition %d: the group's committed offset went back from %d to %d", p, last, c)
			}
			h.lastCommit[p] = c
		}
		for p, at := range pos {
			if last, ok := h.lastPos[p]; ok && at < last {
				h.violate("partition %d: the position stored in PostgreSQL went back from %d to %d", p, last, at)
			}
			h.lastPos[p] = at
		}
		h.mu.Unlock()
	}
}

func (h *History) violate(format string, args ...any) {
	if len(h.violations) < 50 {
		h.violations = append(h.violations, fmt.Sprintf(format, args...))
	}
}

// committed reads the group's committed offsets of every partition of the
// topic; -1 where nothing is committed.
func (h *History) committed(ctx context.Context) (map[int]int64, error) {
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	n, err := h.tg.Kafka.Partitions(qctx, h.tg.Topic)
	if err != nil {
		return nil, err
	}
	parts := make([]int, n)
	for i := range parts {
		parts[i] = i
	}
	resp, err := h.client.OffsetFetch(qctx, &kafka.OffsetFetchRequest{GroupID: h.tg.Group, Topics: map[string][]int{h.tg.Topic: parts}})
	if err != nil {
		return nil, err
	}
	if resp.Error != nil {
		return nil, resp.Error
	}
	out := map[int]int64{}
	for _, p := range resp.Topics[h.tg.Topic] {
		if p.Error != nil {
			return nil, p.Error
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out, nil
}

// Positions reads the stored next offset of every partition of the
// topic; a partition never claimed is absent.
func (h *History) Positions(ctx context.Context) (map[int]int64, error) { return h.positions(ctx) }

// CommitsCaughtUp waits until the group's committed offset of every
// partition equals its stored position: the group commit, which may lag,
// resumes after a fault and catches up.
func (h *History) CommitsCaughtUp(within time.Duration) {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		committed, err := h.committed(ctx)
		var pos map[int]int64
		if err == nil {
			pos, err = h.positions(ctx)
		}
		cancel()
		last := ""
		if err != nil {
			last = err.Error()
		} else {
			for p, at := range pos {
				if at >= 0 && committed[p] != at {
					last += fmt.Sprintf("p%d committed %d, stored %d; ", p, committed[p], at)
				}
			}
			if last == "" {
				h.t.Logf("commits caught up: committed %v, stored %v", committed, pos)
				return
			}
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("the group's committed offsets did not catch up with the stored positions within %s: %s", within, last)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}
}

func (h *History) positions(ctx context.Context) (map[int]int64, error) {
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rows, err := h.tg.Pool.Query(qctx, `SELECT partition, next_offset FROM `+
		pgx.Identifier{h.tg.Schema, "projector_partitions"}.Sanitize()+` WHERE projection = $1 AND topic = $2`,
		h.tg.Table, h.tg.Topic)
	if err != nil {
		return nil, err
	}
	out := map[int]int64{}
	for rows.Next() {
		var p int
		var at int64
		if err := rows.Scan(&p, &at); err != nil {
			return nil, err
		}
		out[p] = at
	}
	return out, rows.Err()
}

// Lag is each partition's high watermark minus its stored position
// (the whole partition when nothing is stored).
func (h *History) Lag(ctx context.Context) (map[int]int64, error) {
	hwm, err := h.tg.Kafka.HighWatermarks(ctx, h.tg.Topic)
	if err != nil {
		return nil, err
	}
	pos, err := h.positions(ctx)
	if err != nil {
		return nil, err
	}
	lag := map[int]int64{}
	for p, end := range hwm {
		at, ok := pos[p]
		if !ok || at < 0 {
			at = 0
		}
		lag[p] = end - at
	}
	return lag, nil
}

// CaughtUp waits until the lag of every partition is zero (invariant 5),
// failing the test after within; alive is checked at every poll, so a
// process that died is reported as such rather than as a timeout.
func (h *History) CaughtUp(within time.Duration, alive ...func() error) {
	h.t.Helper()
	h.settle(within, false, alive...)
}

// Settled is [History.CaughtUp] and, on top, nothing held any more: every
// gap closed.
func (h *History) Settled(within time.Duration, alive ...func() error) {
	h.t.Helper()
	h.settle(within, true, alive...)
}

func (h *History) settle(within time.Duration, unheld bool, alive ...func() error) {
	h.t.Helper()
	deadline := time.Now().Add(within)
	last := ""
	for {
		for _, a := range alive {
			if err := a(); err != nil {
				h.t.Fatalf("waiting for the lag to return to zero: %v", err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		lag, err := h.Lag(ctx)
		if err == nil {
			var behind []string
			for _, p := range slices.Sorted(maps.Keys(lag)) {
				if lag[p] != 0 {
					behind = append(behind, fmt.Sprintf("p%d lag %d", p, lag[p]))
				}
			}
			if len(behind) == 0 && unheld {
				if n, err := h.heldJobs(ctx); err != nil {
					behind = append(behind, err.Error())
				} else if n > 0 {
					behind = append(behind, fmt.Sprintf("%d jobs still held", n))
				}
			}
			if len(behind) == 0 {
				cancel()
				return
			}
			last = strings.Join(behind, ", ")
		} else {
			last = err.Error()
		}
		cancel()
		if time.Now().After(deadline) {
			h.t.Fatalf("invariant 5: the lag did not return to zero (and, settling, the gaps did not close) within %s after the fault healed: %s", within, last)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}
}

func (h *History) heldJobs(ctx context.Context) (int, error) {
	var n int
	err := h.tg.Pool.QueryRow(ctx, `SELECT count(DISTINCT job_id) FROM `+
		pgx.Identifier{h.tg.Schema, "projector_held"}.Sanitize()+` WHERE projection = $1`, h.tg.Table).Scan(&n)
	return n, err
}

// Samples is how many offset samples were taken so far.
func (h *History) Samples() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.samples
}

package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/projector/projector/store"
)

// pollEvery is how often the live line reads the stored positions; it
// bounds the resolution of the latencies.
const pollEvery = 2 * time.Millisecond

// sent is one produced record waiting to be seen.
type sent struct {
	offset int64
	at     time.Time
}

// live produces a stream at a steady rate into a running projector and
// measures, for every event, the time from the start of its produce call
// to the commit that made it visible. An event is visible once its
// partition's stored position passes its offset: the position commits in
// the same transaction as the rows, so from then on the row is readable at
// that version (the stream has no gaps, so nothing is held). The table is
// checked exact at the end.
func (r *run) live(ctx context.Context) error {
	cfg := r.cfg
	total := int(float64(cfg.LiveRate) * cfg.LiveDuration.Seconds())
	// No late deliveries: a held event is not visible at its version, and
	// the position would say it is.
	stream := cfg.stream(cfg.Seed+1, max(total, 3*cfg.Partitions), false)
	const topic = "bench-live"
	if err := r.broker.createTopic(ctx, topic, cfg.Partitions); err != nil {
		return err
	}
	st, err := store.New(r.pool, store.Config{Schema: r.schema, Table: "jobs_live"})
	if err != nil {
		return err
	}
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	p, err := r.engine(st, topic, "bench-live")
	if err != nil {
		return err
	}
	// The runs before wrote gigabytes: a checkpoint of theirs in the
	// middle of the live run would hold its commits back for seconds.
	r.checkpoint(ctx)
	e := startEngine(ctx, p)
	defer e.stop()
	// Produce only once every partition is claimed: the group join is not
	// part of an event's latency.
	if err := waitFor(ctx, e, 30*time.Second, func() (bool, error) {
		pos, err := st.Positions(ctx)
		return len(pos) == cfg.Partitions, err
	}); err != nil {
		return fmt.Errorf("bench: live: partitions not claimed: %w", err)
	}

	var mu sync.Mutex
	pending := make([][]sent, cfg.Partitions)
	var latencies []time.Duration
	produced := make(chan struct{})
	var pollErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var finished time.Time
		for {
			pos, err := st.Positions(ctx)
			if err != nil {
				pollErr = err
				return
			}
			now := time.Now()
			left := 0
			mu.Lock()
			for _, ps := range pos {
				q := pending[ps.Partition]
				k := 0
				for k < len(q) && q[k].offset < ps.NextOffset {
					latencies = append(latencies, now.Sub(q[k].at))
					k++
				}
				pending[ps.Partition] = q[k:]
			}
			for _, q := range pending {
				left += len(q)
			}
			mu.Unlock()
			if !finished.IsZero() && left == 0 {
				return
			}
			if !finished.IsZero() && now.Sub(finished) > 2*time.Minute {
				pollErr = fmt.Errorf("%d events still not visible 2m after the last was produced", left)
				return
			}
			select {
			case <-e.stopped:
				pollErr = fmt.Errorf("engine stopped: %v", e.err)
				return
			case <-produced:
				if finished.IsZero() {
					finished = now
				}
			default:
			}
			select {
			case <-ctx.Done():
				pollErr = ctx.Err()
				return
			case <-time.After(pollEvery):
			}
		}
	}()

	// The records are made as they are due, never all at once.
	rd := stream.Reader()
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	next := 0
	for next < stream.Len {
		due := min(stream.Len, int(time.Since(start).Seconds()*float64(cfg.LiveRate))+1)
		if due > next {
			chunk := rd.Next(due - next)
			if len(chunk) == 0 {
				break // the stream made fewer records than it planned (it never does)
			}
			at := time.Now()
			offs, err := r.broker.produce(ctx, topic, chunk)
			if err != nil {
				tick.Stop()
				close(produced)
				wg.Wait()
				return err
			}
			mu.Lock()
			for i, o := range offs {
				pending[chunk[i].Partition] = append(pending[chunk[i].Partition], sent{offset: o, at: at})
			}
			mu.Unlock()
			next += len(chunk)
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
		if ctx.Err() != nil {
			break
		}
	}
	tick.Stop()
	elapsed := time.Since(start)
	close(produced)
	wg.Wait()
	if pollErr != nil {
		return fmt.Errorf("bench: live: %w", pollErr)
	}
	if err := check(ctx, r.pool, st.JobsTable(), stream.Refs, 0, cfg.checkChunk); err != nil {
		return fmt.Errorf("after the live run: %w", err)
	}
	slices.Sort(latencies)
	ms := func(q float64) *float64 {
		d := latencies[min(len(latencies)-1, int(math.Ceil(q*float64(len(latencies))))-1)]
		v := math.Round(float64(d.Microseconds())/10) / 100
		return &v
	}
	r.rep.LiveRate, r.rep.LiveSeconds, r.rep.LiveEvents = cfg.LiveRate, elapsed.Seconds(), next
	r.rep.LatencyP50Ms, r.rep.LatencyP99Ms, r.rep.LatencyP999Ms, r.rep.LatencyMaxMs = ms(0.50), ms(0.99), ms(0.999), ms(1)
	fmt.Fprintf(cfg.Progress, "  live: %d events in %.1fs (%.0f/s), produce to visible p50 %.1f ms, p99 %.1f ms, p99.9 %.1f ms, max %.1f ms\n",
		next, elapsed.Seconds(), float64(next)/elapsed.Seconds(), *r.rep.LatencyP50Ms, *r.rep.LatencyP99Ms, *r.rep.LatencyP999Ms, *r.rep.LatencyMaxMs)
	return nil
}

// waitFor polls cond until it holds, the engine stops or the limit passes.
func waitFor(ctx context.Context, e *engineRun, limit time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-e.stopped:
			return fmt.Errorf("engine stopped: %v", e.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

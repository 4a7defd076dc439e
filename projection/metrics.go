package projection

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/projector/projector/event"
	"github.com/projector/projector/gapfill"
	"github.com/projector/projector/observe"
	"github.com/projector/projector/snapshot"
)

// newMetrics is p's metrics, its collector reading p at scrape time.
func newMetrics(p *Projector) *observe.Metrics {
	return observe.NewMetrics(prometheus.NewRegistry(), observe.NewCollector(scraped{p}), p.cfg.Version, p.cfg.Revision, Build().GoVersion)
}

// scraped is what the metrics collector reads of p ([observe.Scraped]).
type scraped struct{ p *Projector }

func (s scraped) Status() Status { return s.p.Status() }

func (s scraped) Names() (schema, table string, queue bool) {
	return s.p.cfg.Store.Schema(), s.p.cfg.Store.Projection(), s.p.cfg.Source == SourceSQS
}

func (s scraped) AuthorityLanes() (snapshot.LaneStats, bool) {
	if sc := s.p.snapshots; sc != nil {
		return sc.Lanes(), true
	}
	return snapshot.LaneStats{}, false
}

// MetricFamilies gathers the family of every metric an instance can
// export, those a run shows only in some setups (per partition, with an
// authority, with --source sqs) included, and of the collectors a program
// adds with [Projector.RegisterMetrics] (extra), sorted by name: what
// the metric reference lists. Their sample values mean nothing.
func MetricFamilies(extra ...prometheus.Collector) ([]*dto.MetricFamily, error) {
	m := observe.NewMetrics(prometheus.NewRegistry(), observe.EveryFamily{}, "", "", Build().GoVersion)
	for _, c := range extra {
		if err := m.Registry().Register(c); err != nil {
			return nil, fmt.Errorf("projection: register metrics: %w", err)
		}
	}
	return m.Registry().Gather()
}

// Metrics is the Projector's registry: what /metrics serves. A program
// embedding the Projector may gather it into its own endpoint.
func (p *Projector) Metrics() prometheus.Gatherer { return p.metrics.Registry() }

// RegisterMetrics adds collectors of a program embedding the Projector
// (the waiters of package wait) to its registry, served on /metrics.
func (p *Projector) RegisterMetrics(cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := p.metrics.Registry().Register(c); err != nil {
			return fmt.Errorf("projection: register metrics: %w", err)
		}
	}
	return nil
}

// countedSnapshots counts the authority's answers.
type countedSnapshots struct {
	src gapfill.SnapshotSource
	c   *counters
}

func (s countedSnapshots) Fetch(ctx context.Context, jobID string) (event.Event, error) {
	ev, err := s.src.Fetch(ctx, jobID)
	var timeout *snapshot.TimeoutError
	switch {
	case err == nil:
		s.c.authorityOK.Add(1)
	case errors.Is(err, snapshot.ErrNotFound):
		s.c.authorityNotFound.Add(1)
	case ctx.Err() != nil:
		// stopped, not answered
	default:
		s.c.authorityError.Add(1)
		if errors.As(err, &timeout) {
			s.c.authorityTimeouts.Add(1)
		}
	}
	return ev, err
}

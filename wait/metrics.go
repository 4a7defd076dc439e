package wait

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a wait, the label of projector_waits_total.
const (
	outcomeReached   = "reached"
	outcomeTimeout   = "timeout"
	outcomeCancelled = "cancelled"
	outcomeRefused   = "too_many"
	outcomeStopped   = "stopped"
	// outcomeUnavailable: the wait ended unreached and its last read
	// failed (the database is down).
	outcomeUnavailable = "unavailable"
)

type metrics struct {
	waits    *prometheus.CounterVec
	duration prometheus.Histogram
}

func newMetrics() *metrics {
	m := &metrics{
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "projector_waits_total",
			Help: "Waits for a job's version or a partition's offset by outcome: reached, timeout (the caller's deadline came first), cancelled (the caller left), too_many (refused: the bound on waiters), stopped (the instance stopped first), unavailable (the time ended and the database did not answer the last read).",
		}, []string{"outcome"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "projector_wait_duration_seconds",
			Help:    "Time from a wait's start to its answer, refused waits excluded.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
	}
	for _, o := range []string{outcomeReached, outcomeTimeout, outcomeCancelled, outcomeRefused, outcomeStopped, outcomeUnavailable} {
		m.waits.WithLabelValues(o)
	}
	return m
}

func (m *metrics) observe(outcome string, d time.Duration) {
	m.waits.WithLabelValues(outcome).Inc()
	if outcome != outcomeRefused && d > 0 {
		m.duration.Observe(d.Seconds())
	}
}

// Collectors are the Waiter's metrics, for the instance's /metrics.
func (w *Waiter) Collectors() []prometheus.Collector {
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "projector_waiters",
		Help: "Waits held now, at most --api-max-waiters.",
	}, func() float64 { return float64(w.Waiting()) })
	return []prometheus.Collector{w.metrics.waits, w.metrics.duration, held}
}

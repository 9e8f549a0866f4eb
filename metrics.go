package idempotency

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// storeOps lists every value of the op label.
var storeOps = []string{"reserve", "complete", "release", "renew", "get", "delete", "wait"}

// metrics are created once per process and registered on every config's
// registry (Caddy makes a new registry per config), so counts carry across
// reloads. Labels are bounded: outcome, backend and op only; never keys,
// scopes or hosts.
var metrics struct {
	once              sync.Once
	requests          *prometheus.CounterVec
	byOutcome         map[outcome]prometheus.Counter
	observed          *prometheus.CounterVec
	observedByOutcome map[outcome]prometheus.Counter
	storeDuration     *prometheus.HistogramVec
	inFlight          prometheus.Gauge
}

func initMetrics() {
	metrics.once.Do(func() {
		const ns, sub = "caddy", "http_idempotency"
		metrics.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "Requests seen by the idempotency handler, by outcome.",
		}, []string{"outcome"})
		metrics.observed = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "observed_total",
			Help: "Requests seen by idempotency handlers in observe mode, by the outcome they would have had.",
		}, []string{"outcome"})
		metrics.byOutcome = make(map[outcome]prometheus.Counter, len(outcomes))
		metrics.observedByOutcome = make(map[outcome]prometheus.Counter, len(outcomes))
		for _, o := range outcomes {
			metrics.byOutcome[o] = metrics.requests.WithLabelValues(string(o))
			metrics.observedByOutcome[o] = metrics.observed.WithLabelValues(string(o))
		}
		metrics.storeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "store_duration_seconds",
			Help:    "Latency of idempotency store operations, by backend and operation.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"backend", "op"})
		metrics.inFlight = prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "in_flight",
			Help: "Requests currently running under an idempotency key in this process.",
		})
	})
}

// registerMetrics registers the collectors on a config's registry.
func registerMetrics(reg *prometheus.Registry) error {
	initMetrics()
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{metrics.requests, metrics.observed, metrics.storeDuration, metrics.inFlight} {
		if err := reg.Register(c); err != nil {
			if are := (prometheus.AlreadyRegisteredError{}); !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

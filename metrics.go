package idempotency

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
)

// storeOps lists every value of the op label.
var storeOps = []string{"reserve", "complete", "release", "renew", "get", "delete", "wait"}

// metrics are created once per process and registered on every config's
// registry (Caddy makes a new registry per config), so counts carry across
// reloads. Labels are bounded: server (the HTTP server's name in the
// config, as Caddy's own HTTP metrics have it), outcome, backend and op
// only; never keys, scopes or hosts.
var metrics struct {
	once          sync.Once
	requests      *prometheus.CounterVec
	observed      *prometheus.CounterVec
	storeDuration *prometheus.HistogramVec
	inFlight      *prometheus.GaugeVec
	aftercare     *prometheus.GaugeVec
	abandons      *prometheus.GaugeVec
	failOpen      *prometheus.CounterVec
	unknown       *prometheus.CounterVec
	servers       sync.Map // server name -> *serverMetrics
}

// serverMetrics are one HTTP server's series, made together the first
// time the server counts a request, so that every outcome's series of a
// server exists (at zero) once the server has served one.
type serverMetrics struct {
	byOutcome         map[outcome]prometheus.Counter
	observedByOutcome map[outcome]prometheus.Counter
	inFlight          prometheus.Gauge
	failOpen          prometheus.Counter
	unknownKept       prometheus.Counter // unknown_outcomes_total{action="kept"}
	unknownReleased   prometheus.Counter // unknown_outcomes_total{action="released"}
}

// unknownServer is the server label of a request served outside a Caddy
// HTTP server (Caddy's own metrics say the same).
const unknownServer = "UNKNOWN"

// metricsOf returns the series of the server that serves r.
func metricsOf(r *http.Request) *serverMetrics { return metricsIn(r.Context()) }

// metricsIn returns the series of the server of a request's context.
func metricsIn(ctx context.Context) *serverMetrics {
	name := unknownServer
	if srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && srv != nil && srv.Name() != "" {
		name = srv.Name()
	}
	return serverMetricsNamed(name)
}

// countUnknownOutcome counts a request whose outcome is unknown, by
// whether its key was kept (on_unknown_outcome keep) or released.
func countUnknownOutcome(ctx context.Context, kept bool) {
	m := metricsIn(ctx)
	if kept {
		m.unknownKept.Inc()
	} else {
		m.unknownReleased.Inc()
	}
}

// countOutcome counts one request of the server that serves r.
func countOutcome(r *http.Request, o outcome) {
	if c := metricsOf(r).byOutcome[o]; c != nil {
		c.Inc()
	}
}

// countObserved counts one request of observe mode.
func countObserved(r *http.Request, o outcome) {
	if c := metricsOf(r).observedByOutcome[o]; c != nil {
		c.Inc()
	}
}

func serverMetricsNamed(name string) *serverMetrics {
	if m, ok := metrics.servers.Load(name); ok {
		return m.(*serverMetrics)
	}
	initMetrics()
	m := &serverMetrics{
		byOutcome:         make(map[outcome]prometheus.Counter, len(outcomes)),
		observedByOutcome: make(map[outcome]prometheus.Counter, len(outcomes)),
		inFlight:          metrics.inFlight.WithLabelValues(name),
		failOpen:          metrics.failOpen.WithLabelValues(name),
		unknownKept:       metrics.unknown.WithLabelValues(name, "kept"),
		unknownReleased:   metrics.unknown.WithLabelValues(name, "released"),
	}
	for _, o := range outcomes {
		m.byOutcome[o] = metrics.requests.WithLabelValues(name, string(o))
		m.observedByOutcome[o] = metrics.observed.WithLabelValues(name, string(o))
	}
	actual, _ := metrics.servers.LoadOrStore(name, m)
	return actual.(*serverMetrics)
}

func initMetrics() {
	metrics.once.Do(func() {
		const ns, sub = "caddy", "http_idempotency"
		metrics.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "Requests seen by the idempotency handler, by server and outcome.",
		}, []string{"server", "outcome"})
		metrics.observed = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "observed_total",
			Help: "Requests seen by idempotency handlers in observe mode, by server and the outcome they would have had.",
		}, []string{"server", "outcome"})
		metrics.storeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "store_duration_seconds",
			Help:    "Latency of idempotency store operations, by backend and operation.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"backend", "op"})
		metrics.inFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "in_flight",
			Help: "Requests currently running under an idempotency key in this process, by server.",
		}, []string{"server"})
		metrics.failOpen = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "fail_open_total",
			Help: "Requests passed on without idempotency because the store could not be reached (on_storage_error fail_open), by server.",
		}, []string{"server"})
		metrics.unknown = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "unknown_outcomes_total",
			Help: "Requests whose outcome is unknown: the next handler failed before any status after the request may have reached the upstream, by server and action: kept (an outcome-unknown record refuses every retry until ttl or an operator's release) or released (on_unknown_outcome release: a retry runs again).",
		}, []string{"server", "action"})
		metrics.aftercare = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "aftercare_backlog",
			Help: "Store writes that settle the records of requests that ran (completions, releases), failed, and are retried in the background, each holding its key in flight until it lands, by backend.",
		}, []string{"backend"})
		metrics.abandons = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "abandoned_reservations",
			Help: "Reservations whose outcome is unknown (their requests were answered 503), to be released in the background once the store answers, by backend.",
		}, []string{"backend"})
	})
}

// registerMetrics registers the collectors on a config's registry.
func registerMetrics(reg *prometheus.Registry) error {
	initMetrics()
	if reg == nil {
		return nil
	}
	collectors := []prometheus.Collector{metrics.requests, metrics.observed, metrics.storeDuration, metrics.inFlight, metrics.aftercare, metrics.abandons, metrics.failOpen, metrics.unknown}
	// The storage backends' (records_removed_total), which the handler
	// registers for them: a backend has no registry of its own.
	collectors = append(collectors, backend.Collectors()...)
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			if are := (prometheus.AlreadyRegisteredError{}); !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

package idempotency

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// storeOps lists every value of the op label.
var storeOps = []string{"reserve", "complete", "release", "renew", "get", "delete"}

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

// timedStore measures each operation of a store in the latency histogram
// and, when the request is traced, makes it a child span.
type timedStore struct {
	storage.Store
	backend   string
	observers map[string]prometheus.Observer
}

func newTimedStore(s storage.Store, backend string) *timedStore {
	initMetrics()
	t := &timedStore{Store: s, backend: backend, observers: make(map[string]prometheus.Observer, len(storeOps))}
	for _, op := range storeOps {
		t.observers[op] = metrics.storeDuration.WithLabelValues(backend, op)
	}
	return t
}

// begin starts timing (and tracing) op.
func (t *timedStore) begin(ctx context.Context, op string) (time.Time, trace.Span) {
	return time.Now(), startStoreSpan(ctx, op, t.backend)
}

// end records op, begun at start, with its error.
func (t *timedStore) end(op string, start time.Time, span trace.Span, err error) {
	t.observers[op].Observe(time.Since(start).Seconds())
	endStoreSpan(span, err)
}

func (t *timedStore) Reserve(ctx context.Context, key storage.Key, fp []byte, lease time.Duration) (storage.Reservation, error) {
	start, span := t.begin(ctx, "reserve")
	res, err := t.Store.Reserve(ctx, key, fp, lease)
	t.end("reserve", start, span, err)
	return res, err
}

func (t *timedStore) Complete(ctx context.Context, key storage.Key, token storage.Token, resp *storage.Response, ttl time.Duration) error {
	start, span := t.begin(ctx, "complete")
	err := t.Store.Complete(ctx, key, token, resp, ttl)
	t.end("complete", start, span, err)
	return err
}

func (t *timedStore) Release(ctx context.Context, key storage.Key, token storage.Token) error {
	start, span := t.begin(ctx, "release")
	err := t.Store.Release(ctx, key, token)
	t.end("release", start, span, err)
	return err
}

func (t *timedStore) Renew(ctx context.Context, key storage.Key, token storage.Token, lease time.Duration) error {
	start, span := t.begin(ctx, "renew")
	err := t.Store.Renew(ctx, key, token, lease)
	t.end("renew", start, span, err)
	return err
}

func (t *timedStore) Get(ctx context.Context, key storage.Key, withBody bool) (*storage.Record, error) {
	start, span := t.begin(ctx, "get")
	rec, err := t.Store.Get(ctx, key, withBody)
	t.end("get", start, span, err)
	return rec, err
}

func (t *timedStore) Delete(ctx context.Context, key storage.Key) error {
	start, span := t.begin(ctx, "delete")
	err := t.Store.Delete(ctx, key)
	t.end("delete", start, span, err)
	return err
}

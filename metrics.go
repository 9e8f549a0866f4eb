package idempotency

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// storeOps lists every value of the op label.
var storeOps = []string{"reserve", "complete", "release", "renew", "get", "delete"}

// metrics are created once per process and registered on every config's
// registry (Caddy makes a new registry per config), so counts carry across
// reloads. Labels are bounded: outcome, backend and op only; never keys,
// scopes or hosts.
var metrics struct {
	once          sync.Once
	requests      *prometheus.CounterVec
	byOutcome     map[outcome]prometheus.Counter
	storeDuration *prometheus.HistogramVec
	inFlight      prometheus.Gauge
}

func initMetrics() {
	metrics.once.Do(func() {
		const ns, sub = "caddy", "http_idempotency"
		metrics.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "Requests seen by the idempotency handler, by outcome.",
		}, []string{"outcome"})
		metrics.byOutcome = make(map[outcome]prometheus.Counter, len(outcomes))
		for _, o := range outcomes {
			metrics.byOutcome[o] = metrics.requests.WithLabelValues(string(o))
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
	for _, c := range []prometheus.Collector{metrics.requests, metrics.storeDuration, metrics.inFlight} {
		if err := reg.Register(c); err != nil {
			if are := (prometheus.AlreadyRegisteredError{}); !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

// timedStore measures each operation of a store in the latency histogram.
type timedStore struct {
	storage.Store
	observers map[string]prometheus.Observer
}

func newTimedStore(s storage.Store, backend string) *timedStore {
	initMetrics()
	t := &timedStore{Store: s, observers: make(map[string]prometheus.Observer, len(storeOps))}
	for _, op := range storeOps {
		t.observers[op] = metrics.storeDuration.WithLabelValues(backend, op)
	}
	return t
}

func (t *timedStore) observe(op string, start time.Time) {
	t.observers[op].Observe(time.Since(start).Seconds())
}

func (t *timedStore) Reserve(ctx context.Context, key storage.Key, fp []byte, lease time.Duration) (storage.Reservation, error) {
	defer t.observe("reserve", time.Now())
	return t.Store.Reserve(ctx, key, fp, lease)
}

func (t *timedStore) Complete(ctx context.Context, key storage.Key, token storage.Token, resp *storage.Response, ttl time.Duration) error {
	defer t.observe("complete", time.Now())
	return t.Store.Complete(ctx, key, token, resp, ttl)
}

func (t *timedStore) Release(ctx context.Context, key storage.Key, token storage.Token) error {
	defer t.observe("release", time.Now())
	return t.Store.Release(ctx, key, token)
}

func (t *timedStore) Renew(ctx context.Context, key storage.Key, token storage.Token, lease time.Duration) error {
	defer t.observe("renew", time.Now())
	return t.Store.Renew(ctx, key, token, lease)
}

func (t *timedStore) Get(ctx context.Context, key storage.Key, withBody bool) (*storage.Record, error) {
	defer t.observe("get", time.Now())
	return t.Store.Get(ctx, key, withBody)
}

func (t *timedStore) Delete(ctx context.Context, key storage.Key) error {
	defer t.observe("delete", time.Now())
	return t.Store.Delete(ctx, key)
}

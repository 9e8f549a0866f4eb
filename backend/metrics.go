package backend

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Why a store removed records on its own, as the reason label of
// caddy_http_idempotency_records_removed_total says it.
const (
	// RemovedExpired: expired records and lapsed leases deleted by the
	// store's cleanup (PostgreSQL's periodic cleanup, the memory store's
	// janitor and the sweeps of a full memory store).
	RemovedExpired = "expired"
	// RemovedEvicted: live refusal records (recorded 4xx) that gave way
	// to new keys in a full memory store, or to their own client's new
	// key past its share.
	RemovedEvicted = "evicted"
)

// removed counts the records stores removed on their own. It is made once
// per process, as the handler's metrics are, and registered on every
// config's registry by the handler (see Collectors).
var removed = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "http_idempotency", Name: "records_removed_total",
	Help: "Records idempotency stores removed on their own, by backend and reason: expired (cleanup of expired records and lapsed leases) or evicted (refusal records that gave way in a full memory store).",
}, []string{"backend", "reason"})

// durabilityTimeouts counts the writes too few replicas acknowledged in
// time (a Redis store's durability option).
var durabilityTimeouts = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "http_idempotency", Name: "store_durability_timeouts_total",
	Help: "Reservations and completions (op) that fewer replicas than a store's durability option asks for acknowledged within its timeout, by backend and store.",
}, []string{"backend", "store", "op"})

// storeUp and storeLastPing are each store's health, from its pings
// (every pingInterval, with or without traffic).
var (
	storeUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "http_idempotency", Name: "store_up",
		Help: "1 while an idempotency store answers its pings (every few seconds, with or without traffic), 0 while it does not, by backend and store.",
	}, []string{"backend", "store"})
	storeLastPing = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "http_idempotency", Name: "store_last_ping_success_timestamp_seconds",
		Help: "When an idempotency store last answered a ping, in seconds since the epoch, by backend and store.",
	}, []string{"backend", "store"})
)

// setHealth records a store's ping in its health series.
func setHealth(backend, store string, r PingResult) {
	if store == "" || r.At.IsZero() {
		return
	}
	if r.Err != nil {
		storeUp.WithLabelValues(backend, store).Set(0)
		return
	}
	storeUp.WithLabelValues(backend, store).Set(1)
	storeLastPing.WithLabelValues(backend, store).Set(float64(r.At.Add(r.Took).UnixNano()) / 1e9)
}

// forgetHealth removes the series of a store that closed: a store no
// configuration uses is neither up nor down, and its durability timeouts
// are history (a config that names it again starts its count anew, a
// counter reset to Prometheus); else each store a reload replaced would
// stay in the metrics for the life of the process.
func forgetHealth(backend, store string) {
	storeUp.DeleteLabelValues(backend, store)
	storeLastPing.DeleteLabelValues(backend, store)
	durabilityTimeouts.DeletePartialMatch(prometheus.Labels{"backend": backend, "store": store})
}

// CountDurabilityTimeout counts one write (op "reserve" or "complete") of
// the store named store (Pooled.StoreID) of backend that too few replicas
// acknowledged in time, in
// caddy_http_idempotency_store_durability_timeouts_total.
func CountDurabilityTimeout(backend Name, store, op string) {
	durabilityTimeouts.WithLabelValues(string(backend), store, op).Inc()
}

// CountRemoved adds n records that a store of the backend named backend
// removed for reason (RemovedExpired, RemovedEvicted) to
// caddy_http_idempotency_records_removed_total. n of 0 makes the series
// exist at zero. A store whose records expire by themselves (Redis TTLs)
// has nothing to count.
func CountRemoved(backend Name, reason string, n int64) {
	c := removed.WithLabelValues(string(backend), reason)
	if n > 0 {
		c.Add(float64(n))
	}
}

// Collectors returns the collectors of the kit's metrics, for the handler
// to register on each config's metrics registry.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{removed, durabilityTimeouts, storeUp, storeLastPing}
}

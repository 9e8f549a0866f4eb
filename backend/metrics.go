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

// CountDurabilityTimeout counts one write (op "reserve" or "complete") of
// the store named store (Pooled.StoreID) of backend that too few replicas
// acknowledged in time, in
// caddy_http_idempotency_store_durability_timeouts_total.
func CountDurabilityTimeout(backend, store, op string) {
	durabilityTimeouts.WithLabelValues(backend, store, op).Inc()
}

// CountRemoved adds n records that a store of the backend named backend
// removed for reason (RemovedExpired, RemovedEvicted) to
// caddy_http_idempotency_records_removed_total. n of 0 makes the series
// exist at zero. A store whose records expire by themselves (Redis TTLs)
// has nothing to count.
func CountRemoved(backend, reason string, n int64) {
	c := removed.WithLabelValues(backend, reason)
	if n > 0 {
		c.Add(float64(n))
	}
}

// Collectors returns the collectors of the kit's metrics, for the handler
// to register on each config's metrics registry.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{removed, durabilityTimeouts}
}

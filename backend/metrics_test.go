package backend_test

import (
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/backend/backendtest"
)

// TestCountRemovedIsServedByItsCollector: what CountRemoved counts is
// what the collector the handler registers serves, by backend and reason;
// a count of 0 makes the series exist.
func TestCountRemovedIsServedByItsCollector(t *testing.T) {
	before := backendtest.RemovedTotal(t, "testbackend", backend.RemovedExpired)
	backend.CountRemoved("testbackend", backend.RemovedExpired, 0)
	backend.CountRemoved("testbackend", backend.RemovedExpired, 5)
	backend.CountRemoved("testbackend", backend.RemovedExpired, 2)
	if got := backendtest.RemovedTotal(t, "testbackend", backend.RemovedExpired) - before; got != 7 {
		t.Fatalf("records_removed_total{backend=testbackend,reason=expired} grew by %v, want 7", got)
	}
}

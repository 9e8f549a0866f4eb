package testbackend

import (
	"sync/atomic"
	"testing"

	// The handler, registered as in a Caddy build: backendtest.Run
	// provisions it by its module ID.
	_ "github.com/caddy-idempotency/caddy-idempotency"
	"github.com/caddy-idempotency/caddy-idempotency/backend/backendtest"
)

// TestScenarios runs the scenarios every storage backend must pass on
// this one, as a third party's backend tests do: a Kind whose namespaces
// are stores of their own (handlers share a pooled store when their
// storage configs are the same, so each takes another capacity).
func TestScenarios(t *testing.T) {
	backendtest.Run(t, backendtest.Kind{Name: string(name), Open: open})
}

var nextCapacity atomic.Int64

// open is a store of the test's own.
func open(*testing.T) *backendtest.Namespace {
	capacity := 700_000_000 + nextCapacity.Add(1)
	return &backendtest.Namespace{Storage: func(int) map[string]any {
		return map[string]any{"backend": string(name), "capacity": capacity}
	}}
}

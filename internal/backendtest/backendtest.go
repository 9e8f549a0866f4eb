// Package backendtest holds what the tests of the storage modules under
// backend/ share. It imports caddy, so it is kept apart from testutil,
// which the caddy-free storage packages import.
package backendtest

import (
	"context"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// CaddyContext is a Caddy context for provisioning modules, cancelled
// (its modules cleaned up) after the test.
func CaddyContext(t *testing.T) (caddy.Context, context.CancelFunc) {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return ctx, cancel
}

// FromJSON decodes a module's config as Caddy would, strictly, so that a
// test's misspelt field fails instead of being ignored.
func FromJSON[T any](t *testing.T, config string) *T {
	t.Helper()
	m := new(T)
	if err := caddy.StrictUnmarshalJSON([]byte(config), m); err != nil {
		t.Fatalf("decoding %s: %v", config, err)
	}
	return m
}

// Package backendtest is the public test kit of storage backends: what
// the tests of the modules under backend/ share, and what a third party's
// backend tests import the same way (Caddy contexts, strict JSON
// decoding, the records_removed_total series, the backend matrix). It
// imports caddy, so it is kept apart from the caddy-free storage
// packages' test helpers.
package backendtest

import (
	"context"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
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

// RemovedTotal is what a registry of backend.Collectors serves as
// caddy_http_idempotency_records_removed_total{backend, reason}; 0 when
// it serves no such series.
func RemovedTotal(t testing.TB, backendName, reason string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	for _, c := range backend.Collectors() {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "caddy_http_idempotency_records_removed_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["backend"] == backendName && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

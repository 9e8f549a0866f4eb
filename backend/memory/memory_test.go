package memory

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// TestMemoryDefaultsServeOneHeavyClient provisions the memory store with
// the defaults, as a handler without storage configuration gets it: one client
// sending 25,000 new keys within ttl is never refused (the adapter's
// default of 10,000 keys per scope answered 429 to the rest).
func TestMemoryDefaultsServeOneHeavyClient(t *testing.T) {
	ctx, _ := caddyContext(t)
	m := new(Storage)
	if err := m.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Cleanup()
	// The default store is shared with other tests of the package: a
	// scope of this test's own.
	s, scope := m.Store(), fmt.Sprintf("integration-%d", time.Now().UnixNano())
	resp := &storage.Response{Status: 201, Body: make([]byte, 800), Detail: make([]byte, 150)}
	for i := range 25_000 {
		key := storage.Key{Scope: scope, ID: fmt.Sprint(i)}
		res, err := s.Reserve(t.Context(), key, []byte("fp"), time.Minute)
		if err != nil || res.Outcome != storage.Acquired {
			t.Fatalf("key %d of one client: %v, %v", i, res.Outcome, err)
		}
		if err := s.Complete(t.Context(), key, res.Token, resp, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMemoryMaxBytesFromJSON: max_bytes is in bytes; a value below a
// megabyte is refused, naming the option.
func TestMemoryMaxBytesFromJSON(t *testing.T) {
	ctx, _ := caddyContext(t)
	h := fromJSON(t, `{"max_bytes":512}`)
	err := h.Provision(ctx)
	if err == nil || !strings.Contains(err.Error(), "memory storage: max_bytes must be at least 1.0 MiB, got 512") {
		t.Fatalf("Provision: %v", err)
	}
	h.Cleanup()
	ok := fromJSON(t, `{"max_bytes":268435456}`)
	if err := ok.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	ok.Cleanup()
}

// caddyContext is a Caddy context for provisioning modules, cancelled
// (its modules cleaned up) after the test.
func caddyContext(t *testing.T) (caddy.Context, context.CancelFunc) {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return ctx, cancel
}

// fromJSON decodes a memory storage config as Caddy would.
func fromJSON(t *testing.T, config string) *Storage {
	t.Helper()
	m := new(Storage)
	if err := caddy.StrictUnmarshalJSON([]byte(config), m); err != nil {
		t.Fatalf("decoding %s: %v", config, err)
	}
	return m
}

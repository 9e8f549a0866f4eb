package idempotency

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestPostgresProvisionNeedsNoServer provisions handlers whose DSN points
// where nothing listens: Caddy must start (and reload) while PostgreSQL
// is down.
func TestPostgresProvisionNeedsNoServer(t *testing.T) {
	h := provision(t, &Handler{StorageRaw: json.RawMessage(`{"backend":"postgres","dsn":"postgres://postgres@127.0.0.1:1/test"}`)})
	if h.backendName != "postgres" || h.rawStore() == nil {
		t.Fatalf("backend %q, store %v", h.backendName, h.rawStore())
	}
	if h.keeper.store.waiter == nil {
		t.Fatal("the postgres store is a Waiter: waiting requests share one poll per key")
	}
}

func TestAMaxKeyLengthPostgresCannotIndexIsRefusedAtStart(t *testing.T) {
	for _, cache := range []string{``, `,"replay_cache":{"max_entries":10}`} {
		ctx, _ := caddyContext(t)
		h := &Handler{MaxKeyLength: 3000, StorageRaw: json.RawMessage(`{"backend":"postgres","dsn":"postgres://127.0.0.1:9/app"` + cache + `}`)}
		err := tryProvision(t, ctx, h)
		if err == nil || !strings.Contains(err.Error(), "max_key_length 3000") || !strings.Contains(err.Error(), "at most 2624") {
			t.Errorf("provision with max_key_length 3000%s: %v, want an error naming max_key_length and the store's bound", cache, err)
		}
		_ = h.Cleanup()
	}
	ctx, _ := caddyContext(t)
	h := &Handler{MaxKeyLength: 2624, StorageRaw: json.RawMessage(`{"backend":"postgres","dsn":"postgres://127.0.0.1:9/app"}`)}
	if err := tryProvision(t, ctx, h); err != nil {
		t.Fatalf("max_key_length at the bound: %v", err)
	}
}

func TestPostgresPoolSharedPerConfiguration(t *testing.T) {
	const dsn = `"dsn":"postgres://postgres@127.0.0.1:1/test"`
	a := provision(t, &Handler{StorageRaw: json.RawMessage(`{"backend":"postgres",` + dsn + `,"table":"shared_a"}`)})
	b := provision(t, &Handler{TTL: caddy.Duration(3600_000_000_000), StorageRaw: json.RawMessage(`{"backend":"postgres",` + dsn + `,"table":"shared_a"}`)})
	c := provision(t, &Handler{StorageRaw: json.RawMessage(`{"backend":"postgres",` + dsn + `,"table":"shared_a","max_conns":3}`)})
	d := provision(t, &Handler{StorageRaw: json.RawMessage(`{"backend":"postgres",` + dsn + `,"table":"shared_b"}`)})
	if a.rawStore() != b.rawStore() {
		t.Error("handlers with the same storage configuration have different stores")
	}
	if a.rawStore() == c.rawStore() || a.rawStore() == d.rawStore() || c.rawStore() == d.rawStore() {
		t.Error("handlers with different storage configurations share a store")
	}
}

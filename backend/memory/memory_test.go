package memory

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/backend/backendtest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/opterr"
)

// TestMemoryDefaultsServeOneHeavyClient provisions the memory store with
// the defaults, as a handler without storage configuration gets it: one client
// sending 25,000 new keys within ttl is never refused (the adapter's
// default of 10,000 keys per scope answered 429 to the rest).
func TestMemoryDefaultsServeOneHeavyClient(t *testing.T) {
	ctx, _ := backendtest.CaddyContext(t)
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
	ctx, _ := backendtest.CaddyContext(t)
	h := backendtest.FromJSON[Storage](t, `{"max_bytes":512}`)
	err := h.Provision(ctx)
	if err == nil || !strings.Contains(err.Error(), "memory storage: max_bytes must be at least 1.0 MiB, got 512") {
		t.Fatalf("Provision: %v", err)
	}
	h.Cleanup()
	ok := backendtest.FromJSON[Storage](t, `{"max_bytes":268435456}`)
	if err := ok.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	ok.Cleanup()
}

// TestMemoryValidateAndCompileErrors: a compile error names its option;
// Validate reports it for a config that was not provisioned, Provision
// refuses the config without taking a store, and a provisioned config
// has nothing left to validate.
func TestMemoryValidateAndCompileErrors(t *testing.T) {
	for config, option := range map[string]string{
		`{"max_keys":-1}`:           "max_keys",
		`{"max_keys_per_scope":-1}`: "max_keys_per_scope",
		`{"max_bytes":1024}`:        "max_bytes",
	} {
		bad := backendtest.FromJSON[Storage](t, config)
		if got := opterr.Options(bad.Validate()); !slices.Equal(got, []string{option}) {
			t.Errorf("%s: Validate names %q, want %s", config, got, option)
		}
		ctx, _ := backendtest.CaddyContext(t)
		if err := bad.Provision(ctx); err == nil || bad.Store() != nil {
			t.Errorf("%s: Provision %v, store %v: want an error and no store", config, err, bad.Store())
		}
	}
	ctx, _ := backendtest.CaddyContext(t)
	m := backendtest.FromJSON[Storage](t, `{"max_keys":1000}`)
	if err := m.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Cleanup()
	if err := m.Validate(); err != nil {
		t.Errorf("Validate of a provisioned store: %v", err)
	}
}

package idempotency

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// TestPostgresProvisionNeedsNoServer provisions handlers whose DSN points
// where nothing listens: Caddy must start (and reload) while PostgreSQL
// is down.
func TestPostgresProvisionNeedsNoServer(t *testing.T) {
	h := provision(t, &Handler{StorageRaw: json.RawMessage(`{"backend":"postgres","dsn":"postgres://postgres@127.0.0.1:1/test"}`)})
	if h.backendName != "postgres" || h.store == nil {
		t.Fatalf("backend %q, store %v", h.backendName, h.store)
	}
	if h.waiter == nil {
		t.Fatal("the postgres store is a Waiter: waiting requests share one poll per key")
	}
}

func TestPostgresProvisionDefaults(t *testing.T) {
	p := &PostgresStorage{DSN: "postgres://postgres@127.0.0.1:1/test"}
	ctx, _ := caddyContext(t)
	if err := p.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	if p.Table != "idempotency_keys" || p.CreateTable == nil || !*p.CreateTable || p.CleanupInterval != caddy.Duration(postgres.DefaultCleanupInterval) || p.MaxConns != 0 {
		t.Fatalf("defaults: %+v", p)
	}
	pool := p.Store().(*postgres.Store).Pool()
	if cfg := pool.Config(); cfg.ConnConfig.ConnectTimeout != postgres.DefaultConnectTimeout {
		t.Errorf("connect timeout %v, want %v when the DSN sets none", cfg.ConnConfig.ConnectTimeout, postgres.DefaultConnectTimeout)
	}
}

func TestAMaxKeyLengthPostgresCannotIndexIsRefusedAtStart(t *testing.T) {
	for _, cache := range []string{``, `,"replay_cache":{"max_entries":10}`} {
		ctx, _ := caddyContext(t)
		h := &Handler{MaxKeyLength: 3000, StorageRaw: json.RawMessage(`{"backend":"postgres","dsn":"postgres://db/app"` + cache + `}`)}
		err := tryProvision(t, ctx, h)
		if err == nil || !strings.Contains(err.Error(), "max_key_length 3000") || !strings.Contains(err.Error(), "at most 2624") {
			t.Errorf("provision with max_key_length 3000%s: %v, want an error naming max_key_length and the store's bound", cache, err)
		}
		_ = h.Cleanup()
	}
	ctx, _ := caddyContext(t)
	h := &Handler{MaxKeyLength: 2624, StorageRaw: json.RawMessage(`{"backend":"postgres","dsn":"postgres://db/app"}`)}
	if err := tryProvision(t, ctx, h); err != nil {
		t.Fatalf("max_key_length at the bound: %v", err)
	}
}

func TestPostgresProvisionErrors(t *testing.T) {
	t.Setenv("IDEM_TEST_EMPTY", "")
	tests := []struct {
		name    string
		storage string
		want    string
	}{
		{"no dsn", `{"backend":"postgres"}`, "dsn is required"},
		{"dsn resolving to nothing", `{"backend":"postgres","dsn":"{env.IDEM_TEST_EMPTY}"}`, "dsn is empty"},
		{"invalid dsn", `{"backend":"postgres","dsn":"postgres://app:s3cret-pw@db:notaport/app"}`, "not a valid connection string"},
		{"invalid keyword dsn", `{"backend":"postgres","dsn":"host=db password=s3cret-pw sslmode=sometimes"}`, "not a valid connection string"},
		{"invalid table", `{"backend":"postgres","dsn":"postgres://db/app","table":"Idempotency"}`, "lower-case"},
		{"negative cleanup_interval", `{"backend":"postgres","dsn":"postgres://db/app","cleanup_interval":-1}`, "postgres storage: cleanup_interval must be at least 1s, got -1ns"},
		{"cleanup_interval in nanoseconds", `{"backend":"postgres","dsn":"postgres://db/app","cleanup_interval":300}`, "postgres storage: cleanup_interval must be at least 1s, got 300ns"},
		{"cleanup_interval beyond its ceiling", `{"backend":"postgres","dsn":"postgres://db/app","cleanup_interval":9000000000000000000}`, "postgres storage: cleanup_interval must be at most 720h0m0s, got 2500000h0m0s"},
		{"timeout in nanoseconds", `{"backend":"postgres","dsn":"postgres://db/app","timeout":2}`, "postgres storage: timeout must be at least 10ms, got 2ns"},
		{"negative timeout", `{"backend":"postgres","dsn":"postgres://db/app","timeout":"-1s"}`, "postgres storage: timeout must be at least 10ms, got -1s"},
		{"timeout beyond its ceiling", `{"backend":"postgres","dsn":"postgres://db/app","timeout":"2h"}`, "postgres storage: timeout must be at most 1m0s, got 2h0m0s"},
		{"timeout near the int64 maximum", `{"backend":"postgres","dsn":"postgres://db/app","timeout":"2562047h"}`, "postgres storage: timeout must be at most 1m0s, got 2562047h0m0s"},
		{"negative max_conns", `{"backend":"postgres","dsn":"postgres://db/app","max_conns":-1}`, "max_conns"},
		{"max_conns beyond int32", `{"backend":"postgres","dsn":"postgres://db/app","max_conns":4294967296}`, "max_conns"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, _ := caddyContext(t)
			h := &Handler{StorageRaw: json.RawMessage(tt.storage)}
			err := tryProvision(t, ctx, h)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("provision: %v, want an error mentioning %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "s3cret-pw") {
				t.Fatalf("the error shows the password: %v", err)
			}
			if err := h.Cleanup(); err != nil {
				t.Fatalf("cleanup of the half-provisioned handler: %v", err)
			}
		})
	}
}

// TestPostgresDSNPlaceholderIsNeverWrittenBack resolves {env.*} in the DSN
// while keeping the placeholder, not the secret, in the module's config
// (which is what GET /config would show).
func TestPostgresDSNPlaceholderIsNeverWrittenBack(t *testing.T) {
	const secret = "pw-9f2c1e"
	t.Setenv("IDEM_TEST_PG_PASSWORD", secret)
	p := &PostgresStorage{DSN: "postgres://postgres:{env.IDEM_TEST_PG_PASSWORD}@127.0.0.1:1/test?sslmode=disable"}
	ctx, _ := caddyContext(t)
	if err := p.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	if got := p.Store().(*postgres.Store).Pool().Config().ConnConfig.Password; got != secret {
		t.Fatalf("pool password %q, want the resolved placeholder", got)
	}
	out, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), secret) || !strings.Contains(string(out), "{env.IDEM_TEST_PG_PASSWORD}") {
		t.Fatalf("marshalled config %s: want the placeholder, not the secret", out)
	}
}

// TestPostgresPasswordWithBraces keeps a password's braces that are not a
// known placeholder.
func TestPostgresPasswordWithBraces(t *testing.T) {
	p := &PostgresStorage{DSN: "host=127.0.0.1 port=1 user=postgres password=a{b}c dbname=test"}
	ctx, _ := caddyContext(t)
	if err := p.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	if got := p.Store().(*postgres.Store).Pool().Config().ConnConfig.Password; got != "a{b}c" {
		t.Fatalf("pool password %q, want a{b}c", got)
	}
}

func TestPostgresPoolSharedPerConfiguration(t *testing.T) {
	const dsn = `"dsn":"postgres://postgres@127.0.0.1:1/test"`
	a := provision(t, &Handler{StorageRaw: json.RawMessage(`{"backend":"postgres",` + dsn + `,"table":"shared_a"}`)})
	b := provision(t, &Handler{TTL: caddy.Duration(3600_000_000_000), StorageRaw: json.RawMessage(`{"backend":"postgres",` + dsn + `,"table":"shared_a"}`)})
	c := provision(t, &Handler{StorageRaw: json.RawMessage(`{"backend":"postgres",` + dsn + `,"table":"shared_a","max_conns":3}`)})
	d := provision(t, &Handler{StorageRaw: json.RawMessage(`{"backend":"postgres",` + dsn + `,"table":"shared_b"}`)})
	if a.store != b.store {
		t.Error("handlers with the same storage configuration have different stores")
	}
	if a.store == c.store || a.store == d.store || c.store == d.store {
		t.Error("handlers with different storage configurations share a store")
	}
}

// TestPostgresDurationBoundsAreInclusive provisions every duration option
// at its floor and at its ceiling.
func TestPostgresDurationBoundsAreInclusive(t *testing.T) {
	for _, storage := range []string{
		`"timeout":"10ms","cleanup_interval":"1s"`,
		`"timeout":"1m","cleanup_interval":"720h"`,
	} {
		h := provision(t, &Handler{StorageRaw: json.RawMessage(`{"backend":"postgres","dsn":"postgres://postgres@127.0.0.1:1/test",` + storage + `}`)})
		if h.store == nil {
			t.Fatalf("%s: no store", storage)
		}
	}
}

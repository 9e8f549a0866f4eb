package postgres

import (
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/backend/backendtest"
	"github.com/caddy-idempotency/caddy-idempotency/storage/opterr"
	pgstore "github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

func TestPostgresProvisionDefaults(t *testing.T) {
	p := &Storage{DSN: "postgres://postgres@127.0.0.1:1/test"}
	ctx, _ := backendtest.CaddyContext(t)
	if err := p.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	cfg, err := p.compile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Table != "idempotency_keys" || !cfg.CreateTable || cfg.CleanupInterval != pgstore.DefaultCleanupInterval || cfg.MaxConns != 0 || cfg.Timeout != defaultPostgresTimeout {
		t.Fatalf("defaults: %+v", cfg)
	}
	pool := p.Store().(*pgstore.Store).Pool()
	if cfg := pool.Config(); cfg.ConnConfig.ConnectTimeout != pgstore.DefaultConnectTimeout {
		t.Errorf("connect timeout %v, want %v when the DSN sets none", cfg.ConnConfig.ConnectTimeout, pgstore.DefaultConnectTimeout)
	}
}

func TestPostgresProvisionErrors(t *testing.T) {
	t.Setenv("IDEM_TEST_EMPTY", "")
	tests := []struct {
		name    string
		storage string
		want    string
	}{
		{"no dsn", `{}`, "dsn is required"},
		{"dsn resolving to nothing", `{"dsn":"{env.IDEM_TEST_EMPTY}"}`, "dsn is empty"},
		{"invalid dsn", `{"dsn":"postgres://app:s3cret-pw@db:notaport/app"}`, "dsn parameter port is not valid"},
		{"invalid keyword dsn", `{"dsn":"host=db password=s3cret-pw sslmode=sometimes"}`, "dsn parameter sslmode is not valid"},
		{"unparsable dsn", `{"dsn":"postgres://app:s3cret-pw@db/app?%zz"}`, "not a valid connection string"},
		{"pool_health_check_period of zero (pgxpool's ticker panics)", `{"dsn":"postgres://db/app?pool_health_check_period=0s"}`, "dsn parameter pool_health_check_period must be at least 100ms"},
		{"pool_min_conns above the pool", `{"dsn":"postgres://db/app?pool_max_conns=2&pool_min_conns=5"}`, "dsn parameter pool_min_conns must be from 0 to the pool's size (2)"},
		{"connect_timeout overflowing a duration into 10s", `{"dsn":"postgres://db/app?connect_timeout=36028797018963978"}`, "dsn parameter connect_timeout"},
		{"negative statement_cache_capacity", `{"dsn":"host=db statement_cache_capacity=-1"}`, "dsn parameter statement_cache_capacity"},
		{"pool parameter misspelt", `{"dsn":"postgres://db/app?pool_max_conn=4"}`, "dsn parameter pool_max_conn is not a parameter pgxpool knows"},
		{"max_conns above the module's bound", `{"dsn":"postgres://db/app","max_conns":10001}`, "max_conns must be from 1 to 10000"},
		{"invalid table", `{"dsn":"postgres://db/app","table":"Idempotency"}`, "lower-case"},
		{"negative cleanup_interval", `{"dsn":"postgres://db/app","cleanup_interval":-1}`, "postgres storage: cleanup_interval must be at least 1s, got -1ns"},
		{"cleanup_interval in nanoseconds", `{"dsn":"postgres://db/app","cleanup_interval":300}`, "postgres storage: cleanup_interval must be at least 1s, got 300ns"},
		{"cleanup_interval beyond its ceiling", `{"dsn":"postgres://db/app","cleanup_interval":9000000000000000000}`, "postgres storage: cleanup_interval must be at most 720h0m0s, got 2500000h0m0s"},
		{"timeout in nanoseconds", `{"dsn":"postgres://db/app","timeout":2}`, "postgres storage: timeout must be at least 10ms, got 2ns"},
		{"negative timeout", `{"dsn":"postgres://db/app","timeout":"-1s"}`, "postgres storage: timeout must be at least 10ms, got -1s"},
		{"timeout beyond its ceiling", `{"dsn":"postgres://db/app","timeout":"2h"}`, "postgres storage: timeout must be at most 1m0s, got 2h0m0s"},
		{"timeout near the int64 maximum", `{"dsn":"postgres://db/app","timeout":"2562047h"}`, "postgres storage: timeout must be at most 1m0s, got 2562047h0m0s"},
		{"negative max_conns", `{"dsn":"postgres://db/app","max_conns":-1}`, "max_conns"},
		{"max_conns beyond int32", `{"dsn":"postgres://db/app","max_conns":4294967296}`, "max_conns"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, _ := backendtest.CaddyContext(t)
			h := backendtest.FromJSON[Storage](t, tt.storage)
			err := h.Provision(ctx)
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

// A service file's connect_timeout is read as the DSN's own: one that
// overflows a duration (pgx multiplies its seconds, and it may wrap into
// a range that looks right) is refused too, whichever way the DSN, or
// the environment, names the service and its file.
func TestPostgresServiceFileConnectTimeout(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pg_service.conf")
	conf := "[sane]\nhost=127.0.0.1\nport=1\nconnect_timeout=10\n\n[wrapped]\nhost=127.0.0.1\nport=1\nconnect_timeout=36028797018963978\n"
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, dsn string
		env       map[string]string
		refused   bool
	}{
		{"keyword/value", "service=wrapped servicefile=" + file, nil, true},
		{"URL", "postgres:///test?service=wrapped&servicefile=" + url.QueryEscape(file), nil, true},
		{"PGSERVICE and PGSERVICEFILE", "dbname=test", map[string]string{"PGSERVICE": "wrapped", "PGSERVICEFILE": file}, true},
		{"the DSN's service over PGSERVICE", "service=sane", map[string]string{"PGSERVICE": "wrapped", "PGSERVICEFILE": file}, false},
		{"a sane service", "service=sane servicefile=" + file, nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			ctx, _ := backendtest.CaddyContext(t)
			p := &Storage{DSN: tt.dsn}
			err := p.Provision(ctx)
			defer p.Cleanup()
			if tt.refused != (err != nil) {
				t.Fatalf("provision: %v, want refused %v", err, tt.refused)
			}
			if err != nil && !strings.Contains(err.Error(), "dsn parameter connect_timeout must be from 0 to 3600 seconds") {
				t.Fatalf("provision: %v, want the connect_timeout named", err)
			}
			if err == nil {
				if got := p.Store().(*pgstore.Store).Pool().Config().ConnConfig.ConnectTimeout; got != 10*time.Second {
					t.Fatalf("connect timeout %v, want the service's 10s", got)
				}
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
	p := &Storage{DSN: "postgres://postgres:{env.IDEM_TEST_PG_PASSWORD}@127.0.0.1:1/test?sslmode=disable"}
	ctx, _ := backendtest.CaddyContext(t)
	if err := p.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	if got := p.Store().(*pgstore.Store).Pool().Config().ConnConfig.Password; got != secret {
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
	p := &Storage{DSN: "host=127.0.0.1 port=1 user=postgres password=a{b}c dbname=test"}
	ctx, _ := backendtest.CaddyContext(t)
	if err := p.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	if got := p.Store().(*pgstore.Store).Pool().Config().ConnConfig.Password; got != "a{b}c" {
		t.Fatalf("pool password %q, want a{b}c", got)
	}
}

// TestPostgresDurationBoundsAreInclusive provisions every duration option
// at its floor and at its ceiling.
func TestPostgresDurationBoundsAreInclusive(t *testing.T) {
	for _, storage := range []string{
		`"timeout":"10ms","cleanup_interval":"1s"`,
		`"timeout":"1m","cleanup_interval":"720h"`,
	} {
		ctx, _ := backendtest.CaddyContext(t)
		p := backendtest.FromJSON[Storage](t, `{"dsn":"postgres://postgres@127.0.0.1:1/test",`+storage+`}`)
		if err := p.Provision(ctx); err != nil {
			t.Fatalf("%s: %v", storage, err)
		}
		if p.Store() == nil {
			t.Fatalf("%s: no store", storage)
		}
		p.Cleanup()
	}
}

// TestPostgresValidateAndCompileErrors: a compile error names its option
// (the required dsn after every value); Validate reports it for a config
// that was not provisioned, and a provisioned config has nothing left to
// validate.
func TestPostgresValidateAndCompileErrors(t *testing.T) {
	for config, option := range map[string]string{
		`{}`:                                      "dsn",
		`{"table":"Keys"}`:                        "table",
		`{"dsn":"x","max_conns":-1}`:              "max_conns",
		`{"dsn":"x","cleanup_interval":1}`:        "cleanup_interval",
		`{"dsn":"x","timeout":"2h"}`:              "timeout",
		`{"replay_cache":{"max_entries":0}}`:      "replay_cache",
		`{"dsn":"x","table":"a.b.c","timeout":1}`: "timeout",
	} {
		if got := opterr.Options(backendtest.FromJSON[Storage](t, config).Validate()); !slices.Equal(got, []string{option}) {
			t.Errorf("%s: Validate names %q, want %s", config, got, option)
		}
	}
	ctx, _ := backendtest.CaddyContext(t)
	p := backendtest.FromJSON[Storage](t, `{"dsn":"postgres://postgres@127.0.0.1:1/test"}`)
	if err := p.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	if err := p.Validate(); err != nil {
		t.Errorf("Validate of a provisioned store: %v", err)
	}
}

// TestCleanupCountsTheRowsItDeleted: the rows a periodic cleanup deleted
// are counted in caddy_http_idempotency_records_removed_total
// {backend="postgres",reason="expired"}, those of a run that failed
// half-way too; a run another instance did (locked) counts nothing.
func TestCleanupCountsTheRowsItDeleted(t *testing.T) {
	before := backendtest.RemovedTotal(t, "postgres", backend.RemovedExpired)
	report := logCleanup("idempotency_keys")
	report(1500, nil)
	report(200, errors.New("connection reset"))
	report(0, pgstore.ErrCleanupLocked)
	if got := backendtest.RemovedTotal(t, "postgres", backend.RemovedExpired) - before; got != 1700 {
		t.Fatalf("records_removed_total{backend=postgres,reason=expired} grew by %v, want 1700", got)
	}
}

package idempotency

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

func TestCaddyfilePostgresOptions(t *testing.T) {
	tests := []struct {
		name string
		body []string
		want string // the storage JSON
	}{
		{
			name: "no block",
			body: []string{"storage postgres"},
			want: `{"backend":"postgres"}`,
		},
		{
			name: "dsn only",
			body: []string{"storage postgres {", "\tdsn postgres://app@db:5432/app", "}"},
			want: `{"backend":"postgres","dsn":"postgres://app@db:5432/app"}`,
		},
		{
			name: "keyword/value dsn with an env placeholder",
			body: []string{"storage postgres {", "\tdsn \"host=db user=app password={env.PG_PASSWORD} dbname=app\"", "}"},
			want: `{"backend":"postgres","dsn":"host=db user=app password={env.PG_PASSWORD} dbname=app"}`,
		},
		{
			name: "every option",
			body: []string{
				"storage postgres {",
				"\tdsn {env.PG_DSN}",
				"\ttable app.idempotency",
				"\tcreate_table false",
				"\tcleanup_interval 10m",
				"\tmax_conns 20",
				"\ttimeout 1500ms",
				"}",
			},
			want: `{"backend":"postgres","dsn":"{env.PG_DSN}","table":"app.idempotency","create_table":false,"cleanup_interval":600000000000,"max_conns":20,"timeout":1500000000}`,
		},
		{
			name: "create_table true",
			body: []string{"storage postgres {", "\tcreate_table true", "}"},
			want: `{"backend":"postgres","create_table":true}`,
		},
		{
			name: "cleanup_interval in days",
			body: []string{"storage postgres {", "\tcleanup_interval 1d", "}"},
			want: `{"backend":"postgres","cleanup_interval":86400000000000}`,
		},
		{
			name: "more handler options after the block",
			body: []string{"storage postgres {", "\tdsn x", "}", "ttl 1h"},
			want: `{"backend":"postgres","dsn":"x"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := cfParse(cfBlock(tt.body...))
			if err != nil {
				t.Fatal(err)
			}
			var got, want any
			if err := json.Unmarshal(h.StorageRaw, &got); err != nil {
				t.Fatalf("storage JSON %s: %v", h.StorageRaw, err)
			}
			if err := json.Unmarshal([]byte(tt.want), &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("storage JSON\n got %s\nwant %s", h.StorageRaw, tt.want)
			}
		})
	}
}

func TestCaddyfilePostgresErrors(t *testing.T) {
	// The storage line is line 3 of cfBlock; its first option line 4.
	block := func(lines ...string) []string {
		return append(append([]string{"storage postgres {"}, lines...), "}")
	}
	tests := []struct {
		name string
		body []string
		line int
		want []string
	}{
		{name: "argument after the backend", body: []string{"storage postgres extra {", "\tdsn x", "}"}, line: 3, want: []string{"wrong argument count", "'extra'"}},
		{name: "unknown option", body: block("dsn x", "password secret"), line: 5, want: []string{"unrecognized postgres storage option", "'password'"}},
		{name: "option names are case sensitive", body: block("DSN x"), line: 4, want: []string{"unrecognized postgres storage option", "'DSN'"}},

		{name: "duplicate dsn", body: block("dsn a", "dsn b"), line: 5, want: []string{"dsn", "already specified"}},
		{name: "duplicate table", body: block("table a", "table b"), line: 5, want: []string{"table", "already specified"}},
		{name: "duplicate create_table", body: block("create_table true", "create_table true"), line: 5, want: []string{"create_table", "already specified"}},
		{name: "duplicate cleanup_interval", body: block("cleanup_interval 1m", "cleanup_interval 2m"), line: 5, want: []string{"cleanup_interval", "already specified"}},
		{name: "duplicate max_conns", body: block("max_conns 1", "dsn x", "max_conns 2"), line: 6, want: []string{"max_conns", "already specified"}},

		{name: "dsn without value", body: block("dsn"), line: 4, want: []string{"wrong argument count", "'dsn'"}},
		{name: "empty dsn", body: block(`dsn ""`), line: 4, want: []string{"must not be empty"}},
		{name: "dsn with two values", body: block("dsn host=db user=app"), line: 4, want: []string{"wrong argument count", "'user=app'"}},
		{name: "table without value", body: block("table"), line: 4, want: []string{"wrong argument count", "'table'"}},
		{name: "create_table without value", body: block("create_table"), line: 4, want: []string{"wrong argument count", "'create_table'"}},
		{name: "cleanup_interval without value", body: block("cleanup_interval"), line: 4, want: []string{"wrong argument count", "'cleanup_interval'"}},
		{name: "max_conns without value", body: block("max_conns"), line: 4, want: []string{"wrong argument count", "'max_conns'"}},
		{name: "max_conns with two values", body: block("max_conns 1 2"), line: 4, want: []string{"wrong argument count", "'2'"}},
		{name: "block after dsn", body: block("dsn x {", "\t}"), line: 4, want: []string{"'{'"}},

		{name: "table with upper case", body: block("table Keys"), line: 4, want: []string{"table", `"Keys"`, "lower-case"}},
		{name: "table with three parts", body: block("table a.b.c"), line: 4, want: []string{"table", `"a.b.c"`}},
		{name: "table with a quote", body: block(`table "x\"y"`), line: 4, want: []string{"table"}},
		{name: "create_table yes", body: block("create_table yes"), line: 4, want: []string{"create_table", "true", "false", "'yes'"}},
		{name: "cleanup_interval not a duration", body: block("cleanup_interval often"), line: 4, want: []string{"cleanup_interval", "invalid duration", "'often'"}},
		{name: "cleanup_interval zero", body: block("cleanup_interval 0s"), line: 4, want: []string{"cleanup_interval", "must be positive", "'0s'"}},
		{name: "cleanup_interval negative", body: block("cleanup_interval -1m"), line: 4, want: []string{"cleanup_interval", "must be positive", "'-1m'"}},
		{name: "max_conns zero", body: block("max_conns 0"), line: 4, want: []string{"max_conns", "positive integer", "'0'"}},
		{name: "max_conns negative", body: block("max_conns -4"), line: 4, want: []string{"max_conns", "positive integer", "'-4'"}},
		{name: "max_conns not a number", body: block("max_conns lots"), line: 4, want: []string{"max_conns", "positive integer", "'lots'"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := cfParse(cfBlock(tt.body...))
			cfCheckErr(t, err, tt.line, tt.want...)
		})
	}
}

// TestPostgresProvisionNeedsNoServer provisions handlers whose DSN points
// where nothing listens: Caddy must start (and reload) while PostgreSQL
// is down.
func TestPostgresProvisionNeedsNoServer(t *testing.T) {
	h := provision(t, &Handler{StorageRaw: json.RawMessage(`{"backend":"postgres","dsn":"postgres://postgres@127.0.0.1:1/test"}`)})
	if h.backendName != "postgres" || h.store == nil {
		t.Fatalf("backend %q, store %v", h.backendName, h.store)
	}
	if h.waiter != nil {
		t.Fatal("the postgres store must not claim to be a Waiter")
	}
}

func TestPostgresProvisionDefaults(t *testing.T) {
	p := &PostgresStorage{DSN: "postgres://postgres@127.0.0.1:1/test"}
	ctx, _ := mtContext(t)
	if err := p.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	if p.Table != "idempotency_keys" || p.CreateTable == nil || !*p.CreateTable || p.CleanupInterval != cfDur(postgres.DefaultCleanupInterval) || p.MaxConns != 0 {
		t.Fatalf("defaults: %+v", p)
	}
	pool := p.Store().(*postgres.Store).Pool()
	if cfg := pool.Config(); cfg.ConnConfig.ConnectTimeout != postgres.DefaultConnectTimeout {
		t.Errorf("connect timeout %v, want %v when the DSN sets none", cfg.ConnConfig.ConnectTimeout, postgres.DefaultConnectTimeout)
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
		{"negative cleanup_interval", `{"backend":"postgres","dsn":"postgres://db/app","cleanup_interval":-1}`, "cleanup_interval must be positive"},
		{"negative max_conns", `{"backend":"postgres","dsn":"postgres://db/app","max_conns":-1}`, "max_conns"},
		{"max_conns beyond int32", `{"backend":"postgres","dsn":"postgres://db/app","max_conns":4294967296}`, "max_conns"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, _ := mtContext(t)
			h := &Handler{StorageRaw: json.RawMessage(tt.storage)}
			err := mtProvision(t, ctx, h)
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
	ctx, _ := mtContext(t)
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
	ctx, _ := mtContext(t)
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
	b := provision(t, &Handler{TTL: cfDur(3600_000_000_000), StorageRaw: json.RawMessage(`{"backend":"postgres",` + dsn + `,"table":"shared_a"}`)})
	c := provision(t, &Handler{StorageRaw: json.RawMessage(`{"backend":"postgres",` + dsn + `,"table":"shared_a","max_conns":3}`)})
	d := provision(t, &Handler{StorageRaw: json.RawMessage(`{"backend":"postgres",` + dsn + `,"table":"shared_b"}`)})
	if a.store != b.store {
		t.Error("handlers with the same storage configuration have different stores")
	}
	if a.store == c.store || a.store == d.store || c.store == d.store {
		t.Error("handlers with different storage configurations share a store")
	}
}

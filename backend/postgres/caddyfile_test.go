package postgres

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/backend/backendtest"
)

// The `storage postgres` block, parsed as the idempotency directive
// parses it (backendtest.ParseStorage): its storage line is line 1 of
// Testfile.

// parsePostgres parses the lines of a `storage postgres` block into the
// storage JSON of the handler's config.
func parsePostgres(lines ...string) (json.RawMessage, error) {
	return backendtest.ParseStorage(strings.Join(lines, "\n"))
}

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
			// replay_cache's syntax is the kit's (backend.ParseReplayCache),
			// tested there; this is its place in this block.
			name: "replay_cache",
			body: []string{"storage postgres {", "\treplay_cache 5000 30s", "\tdsn postgres://x@h/db", "}"},
			want: `{"backend":"postgres","dsn":"postgres://x@h/db","replay_cache":{"max_entries":5000,"ttl":30000000000}}`,
		},
		{
			// The block ends at its brace; what follows is the directive's.
			name: "more handler options after the block",
			body: []string{"storage postgres {", "\tdsn host=db", "}", "ttl 1h"},
			want: `{"backend":"postgres","dsn":"host=db"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, err := parsePostgres(tt.body...)
			if err != nil {
				t.Fatal(err)
			}
			var got, want any
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatalf("storage JSON %s: %v", raw, err)
			}
			if err := json.Unmarshal([]byte(tt.want), &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("storage JSON\n got %s\nwant %s", raw, tt.want)
			}
		})
	}
}

func TestCaddyfilePostgresErrors(t *testing.T) {
	// The storage line is line 1; its first option line 2.
	postgres := func(lines ...string) []string {
		return append(append([]string{"storage postgres {"}, lines...), "}")
	}
	tests := []struct {
		name string
		body []string
		line int
		want []string
	}{
		{name: "argument after the backend", body: []string{"storage postgres extra {", "\tdsn x", "}"}, line: 1, want: []string{"wrong argument count", "'extra'"}},
		{name: "unknown option", body: postgres("dsn x", "password secret"), line: 3, want: []string{"unrecognized postgres storage option", "'password'"}},
		{name: "option names are case sensitive", body: postgres("DSN x"), line: 2, want: []string{"unrecognized postgres storage option", "'DSN'"}},

		{name: "duplicate dsn", body: postgres("dsn a", "dsn b"), line: 3, want: []string{"dsn", "already specified"}},
		{name: "duplicate table", body: postgres("table a", "table b"), line: 3, want: []string{"table", "already specified"}},
		{name: "duplicate create_table", body: postgres("create_table true", "create_table true"), line: 3, want: []string{"create_table", "already specified"}},
		{name: "duplicate cleanup_interval", body: postgres("cleanup_interval 1m", "cleanup_interval 2m"), line: 3, want: []string{"cleanup_interval", "already specified"}},
		{name: "duplicate max_conns", body: postgres("max_conns 1", "dsn x", "max_conns 2"), line: 4, want: []string{"max_conns", "already specified"}},

		{name: "dsn without value", body: postgres("dsn"), line: 2, want: []string{"wrong argument count", "'dsn'"}},
		{name: "empty dsn", body: postgres(`dsn ""`), line: 2, want: []string{"must not be empty"}},
		{name: "dsn with two values", body: postgres("dsn host=db user=app"), line: 2, want: []string{"wrong argument count", "'user=app'"}},
		{name: "table without value", body: postgres("table"), line: 2, want: []string{"wrong argument count", "'table'"}},
		{name: "create_table without value", body: postgres("create_table"), line: 2, want: []string{"wrong argument count", "'create_table'"}},
		{name: "cleanup_interval without value", body: postgres("cleanup_interval"), line: 2, want: []string{"wrong argument count", "'cleanup_interval'"}},
		{name: "max_conns without value", body: postgres("max_conns"), line: 2, want: []string{"wrong argument count", "'max_conns'"}},
		{name: "max_conns with two values", body: postgres("max_conns 1 2"), line: 2, want: []string{"wrong argument count", "'2'"}},
		{name: "block after dsn", body: postgres("dsn x {", "\t}"), line: 2, want: []string{"'{'"}},

		{name: "table with upper case", body: postgres("table Keys"), line: 2, want: []string{"table", `"Keys"`, "lower-case"}},
		{name: "table with three parts", body: postgres("table a.b.c"), line: 2, want: []string{"table", `"a.b.c"`}},
		{name: "table with a quote", body: postgres(`table "x\"y"`), line: 2, want: []string{"table"}},
		{name: "create_table yes", body: postgres("create_table yes"), line: 2, want: []string{"create_table", "true", "false", "'yes'"}},
		{name: "cleanup_interval not a duration", body: postgres("cleanup_interval often"), line: 2, want: []string{"cleanup_interval", "invalid duration", "'often'"}},
		{name: "cleanup_interval zero", body: postgres("cleanup_interval 0s"), line: 2, want: []string{"cleanup_interval", "must be positive", "'0s'"}},
		{name: "cleanup_interval negative", body: postgres("cleanup_interval -1m"), line: 2, want: []string{"cleanup_interval", "must be positive", "'-1m'"}},
		{name: "cleanup_interval below its floor", body: postgres("cleanup_interval 500ms"), line: 2, want: []string{"postgres storage: cleanup_interval must be at least 1s, got 500ms"}},
		{name: "cleanup_interval above its ceiling", body: postgres("cleanup_interval 31d"), line: 2, want: []string{"postgres storage: cleanup_interval must be at most 720h0m0s, got 744h0m0s"}},
		{name: "timeout below its floor", body: postgres("dsn x", "timeout 2ns"), line: 3, want: []string{"postgres storage: timeout must be at least 10ms, got 2ns"}},
		{name: "timeout above its ceiling", body: postgres("timeout 2h"), line: 2, want: []string{"postgres storage: timeout must be at most 1m0s, got 2h0m0s"}},
		{name: "max_conns zero", body: postgres("max_conns 0"), line: 2, want: []string{"max_conns", "positive integer", "'0'"}},
		{name: "max_conns negative", body: postgres("max_conns -4"), line: 2, want: []string{"max_conns", "positive integer", "'-4'"}},
		{name: "max_conns not a number", body: postgres("max_conns lots"), line: 2, want: []string{"max_conns", "positive integer", "'lots'"}},
		{name: "a bad table before the dsn", body: postgres("table Keys", "dsn x", "max_conns 2"), line: 2, want: []string{"table", `"Keys"`}},
		{name: "a bad replay_cache without dsn", body: postgres("table keys", "replay_cache 0"), line: 3, want: []string{"replay_cache: max_entries must be positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parsePostgres(tt.body...)
			backendtest.WantParseError(t, err, tt.line, tt.want...)
		})
	}
}

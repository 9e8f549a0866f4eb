package idempotency_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	redisbackend "github.com/caddy-idempotency/caddy-idempotency/backend/redis"
)

// The storage blocks of the directive: redis, postgres, and the replay
// cache both have.

// parseRedis parses a Caddyfile idempotency block and returns its redis
// storage module as the JSON config would decode it.
func parseRedis(t *testing.T, body ...string) (*redisbackend.Storage, error) {
	t.Helper()
	h, err := parse(block(body...))
	if err != nil {
		return nil, err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(h.StorageRaw, &obj); err != nil {
		t.Fatalf("storage JSON %s: %v", h.StorageRaw, err)
	}
	if string(obj["backend"]) != `"redis"` {
		t.Fatalf("storage JSON %s: backend is not redis", h.StorageRaw)
	}
	r := new(redisbackend.Storage)
	if err := caddy.StrictUnmarshalJSON(stripBackend(t, h.StorageRaw), r); err != nil {
		t.Fatalf("decoding %s: %v", h.StorageRaw, err)
	}
	return r, nil
}

func stripBackend(t *testing.T, raw json.RawMessage) []byte {
	t.Helper()
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		t.Fatal(err)
	}
	delete(obj, "backend")
	b, _ := json.Marshal(obj)
	return b
}

func TestRedisCaddyfileOptions(t *testing.T) {
	tests := []struct {
		name string
		body []string
		want redisbackend.Storage
	}{
		{"bare", []string{"storage redis"}, redisbackend.Storage{}},
		{"empty block", []string{"storage redis {", "}"}, redisbackend.Storage{}},
		{"url shorthand", []string{"storage redis rediss://cache.internal:6380/2"}, redisbackend.Storage{URL: "rediss://cache.internal:6380/2"}},
		{"url shorthand with block", []string{"storage redis redis://r:6379 {", "\tkey_prefix app:", "}"},
			redisbackend.Storage{URL: "redis://r:6379", KeyPrefix: "app:"}},
		{"every single-node option", []string{
			"storage redis {",
			"\turl redis://r:6379/1",
			"\tusername app",
			"\tpassword {env.REDIS_PASSWORD}",
			"\tkey_prefix idem:",
			"\tpool_size 20",
			"\tdial_timeout 500ms",
			"\ttimeout 3s",
			"}",
		}, redisbackend.Storage{
			URL: "redis://r:6379/1", Username: "app", Password: "{env.REDIS_PASSWORD}", KeyPrefix: "idem:",
			PoolSize: 20, DialTimeout: caddy.Duration(500 * time.Millisecond), Timeout: caddy.Duration(3 * time.Second),
		}},
		{"cluster", []string{"storage redis {", "\taddresses rediss://n1:7000 rediss://n2:7000 rediss://n3:7000", "}"},
			redisbackend.Storage{Addresses: []string{"rediss://n1:7000", "rediss://n2:7000", "rediss://n3:7000"}}},
		{"sentinel", []string{"storage redis {", "\taddresses s1:26379 s2:26379", "\tmaster_name mymaster", "}"},
			redisbackend.Storage{Addresses: []string{"s1:26379", "s2:26379"}, MasterName: "mymaster"}},
		{"sentinel with its own credentials", []string{"storage redis {", "\taddresses s1:26379", "\tmaster_name mymaster",
			"\tsentinel_username watcher", "\tsentinel_password {env.SENTINEL_PASSWORD}", "\tpassword {env.REDIS_PASSWORD}", "}"},
			redisbackend.Storage{Addresses: []string{"s1:26379"}, MasterName: "mymaster", SentinelUsername: "watcher",
				SentinelPassword: "{env.SENTINEL_PASSWORD}", Password: "{env.REDIS_PASSWORD}"}},
		{"sentinel, master_name first", []string{"storage redis {", "\tmaster_name mymaster", "\taddresses s1:26379", "}"},
			redisbackend.Storage{Addresses: []string{"s1:26379"}, MasterName: "mymaster"}},
		{"addresses from a placeholder", []string{"storage redis {", "\taddresses {env.REDIS_NODES}", "}"},
			redisbackend.Storage{Addresses: []string{"{env.REDIS_NODES}"}}},
		{"url from a placeholder", []string{"storage redis {env.REDIS_URL}"}, redisbackend.Storage{URL: "{env.REDIS_URL}"}},
		{"host:port without a scheme", []string{"storage redis 127.0.0.1:6379"}, redisbackend.Storage{URL: "127.0.0.1:6379"}},
		{"TLS files", []string{"storage redis {", "	url redis://10.0.0.7:6379", "	tls_ca_file /etc/redis/ca.pem",
			"	tls_cert_file {env.REDIS_CERT}", "	tls_key_file /etc/redis/client.key", "	tls_server_name cache.internal", "}"},
			redisbackend.Storage{URL: "redis://10.0.0.7:6379", TLSCAFile: "/etc/redis/ca.pem", TLSCertFile: "{env.REDIS_CERT}",
				TLSKeyFile: "/etc/redis/client.key", TLSServerName: "cache.internal"}},
		{"durability replicas", []string{"storage redis {", "	durability replicas 1", "}"},
			redisbackend.Storage{Durability: &redisbackend.Durability{Replicas: 1}}},
		{"durability with a timeout", []string{"storage redis {", "	durability replicas 2 500ms", "}"},
			redisbackend.Storage{Durability: &redisbackend.Durability{Replicas: 2, Timeout: caddy.Duration(500 * time.Millisecond)}}},
		{"durability with everything", []string{"storage redis {", "	timeout 3s", "	durability replicas 1 2s on_timeout proceed", "}"},
			redisbackend.Storage{Timeout: caddy.Duration(3 * time.Second), Durability: &redisbackend.Durability{Replicas: 1, Timeout: caddy.Duration(2 * time.Second), OnTimeout: "proceed"}}},
		{"durability on_timeout without a timeout", []string{"storage redis {", "	durability replicas 1 on_timeout fail", "}"},
			redisbackend.Storage{Durability: &redisbackend.Durability{Replicas: 1, OnTimeout: "fail"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseRedis(t, tt.body...)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, tt.want) {
				t.Errorf("got %+v\nwant %+v", *got, tt.want)
			}
		})
	}
}

func TestRedisCaddyfileErrors(t *testing.T) {
	tests := []struct {
		name string
		body []string
		line int
		want []string
	}{
		{"unknown option", []string{"storage redis {", "\tdb 2", "}"}, 4, []string{"unrecognized redis storage option", "'db'"}},
		{"two url arguments", []string{"storage redis redis://a redis://b"}, 3, []string{"wrong argument count", "'redis://b'"}},
		{"a host without a scheme or port", []string{"storage redis cache.internal"}, 3, []string{"url must start with a scheme", "redis://host:port"}},
		{"tls_cert_file without its key", []string{"storage redis {", "\ttls_cert_file c.pem", "\tkey_prefix x:", "}"}, 4, []string{"tls_cert_file and tls_key_file go together"}},
		{"url shorthand and url", []string{"storage redis redis://a {", "\turl redis://b", "}"}, 4, []string{"url", "already specified"}},
		{"url without value", []string{"storage redis {", "\turl", "}"}, 4, []string{"wrong argument count", "'url'"}},
		{"url with two values", []string{"storage redis {", "\turl redis://a redis://b", "}"}, 4, []string{"wrong argument count", "'redis://b'"}},
		{"url with a bad scheme", []string{"storage redis {", "\turl http://cache:6379", "}"}, 4, []string{"invalid url", "scheme"}},
		{"url shorthand with a bad scheme", []string{"storage redis memcached://cache"}, 3, []string{"invalid url"}},
		{"url with a bad database", []string{"storage redis {", "\turl redis://cache:6379/zero", "}"}, 4, []string{"invalid url", "database"}},
		{"url without host", []string{"storage redis {", "\turl redis://", "}"}, 4, []string{"invalid url", "no host"}},
		{"url and addresses", []string{"storage redis {", "\turl redis://a:6379", "\taddresses b:6379 c:6379", "}"}, 5, []string{"mutually exclusive"}},
		{"addresses and url", []string{"storage redis {", "\taddresses b:6379 c:6379", "\turl redis://a:6379", "}"}, 5, []string{"mutually exclusive"}},
		{"url shorthand and addresses", []string{"storage redis redis://a {", "\taddresses b:6379", "}"}, 4, []string{"mutually exclusive"}},
		{"addresses without value", []string{"storage redis {", "\taddresses", "}"}, 4, []string{"wrong argument count", "'addresses'"}},
		{"address without port", []string{"storage redis {", "\taddresses n1:7000 n2", "}"}, 4, []string{"address", `"n2"`, "host:port"}},
		{"address with a path", []string{"storage redis {", "\taddresses redis://n1:7000/3", "}"}, 4, []string{"address", "host:port"}},
		{"address with credentials", []string{"storage redis {", "\taddresses redis://u:p@n1:7000", "}"}, 4, []string{"address", "host:port"}},
		{"mixed TLS addresses", []string{"storage redis {", "\taddresses rediss://n1:7000 n2:7000", "}"}, 4, []string{"mix TLS"}},
		{"master_name without addresses", []string{"storage redis {", "\tmaster_name m", "\ttimeout 1s", "}"}, 4, []string{"master_name needs addresses"}},
		{"sentinel_password without master_name", []string{"storage redis {", "\taddresses s1:26379", "\tsentinel_password p", "\ttimeout 1s", "}"}, 5, []string{"sentinel_password needs master_name"}},
		{"sentinel_username without master_name", []string{"storage redis {", "\tsentinel_username u", "}"}, 4, []string{"sentinel_username needs master_name"}},
		{"sentinel_password without value", []string{"storage redis {", "\tsentinel_password", "}"}, 4, []string{"wrong argument count", "'sentinel_password'"}},
		{"master_name without value", []string{"storage redis {", "\tmaster_name", "}"}, 4, []string{"wrong argument count", "'master_name'"}},
		{"username without value", []string{"storage redis {", "\tusername", "}"}, 4, []string{"wrong argument count", "'username'"}},
		{"password with two values", []string{"storage redis {", "\tpassword a b", "}"}, 4, []string{"wrong argument count", "'b'"}},
		{"key_prefix without value", []string{"storage redis {", "\tkey_prefix", "}"}, 4, []string{"wrong argument count", "'key_prefix'"}},
		{"pool_size not a number", []string{"storage redis {", "\tpool_size many", "}"}, 4, []string{"pool_size", "positive integer", "'many'"}},
		{"pool_size zero", []string{"storage redis {", "\tpool_size 0", "}"}, 4, []string{"pool_size", "positive integer", "'0'"}},
		{"dial_timeout invalid", []string{"storage redis {", "\tdial_timeout quick", "}"}, 4, []string{"dial_timeout", "invalid duration", "'quick'"}},
		{"timeout negative", []string{"storage redis {", "\ttimeout -1s", "}"}, 4, []string{"timeout", "must be positive", "'-1s'"}},
		{"timeout without value", []string{"storage redis {", "\ttimeout", "}"}, 4, []string{"wrong argument count", "'timeout'"}},
		{"block after timeout", []string{"storage redis {", "\ttimeout 1s {", "\t}", "}"}, 4, []string{"'{'"}},
		{"timeout below the floor", []string{"storage redis {", "\ttimeout 2ns", "}"}, 4, []string{"redis storage: timeout must be at least 10ms, got 2ns"}},
		{"timeout above the ceiling", []string{"storage redis {", "\ttimeout 2h", "}"}, 4, []string{"redis storage: timeout must be at most 1m0s, got 2h0m0s"}},
		{"dial_timeout below the floor", []string{"storage redis {", "\tkey_prefix k:", "\tdial_timeout 1ms", "}"}, 5, []string{"redis storage: dial_timeout must be at least 10ms, got 1ms"}},
		{"dial_timeout that overflows a doubling", []string{"storage redis {", "\tdial_timeout 60000d", "}"}, 4, []string{"redis storage: dial_timeout must be at most 1m0s"}},
		{"key_prefix with a hash tag", []string{"storage redis {", "\tkey_prefix app:{tenant}:", "}"}, 4, []string{"key_prefix must not contain '{' or '}'", "hash tag", `"app:{tenant}:"`}},
		{"key_prefix with a closing brace", []string{"storage redis {", "\tkey_prefix app}", "}"}, 4, []string{"key_prefix must not contain"}},
		{"replay_cache ttl below the floor", []string{"storage redis {", "\treplay_cache 100 2ns", "}"}, 4, []string{"redis storage: replay_cache: ttl must be at least 1s, got 2ns"}},
		{"replay_cache ttl above the ceiling", []string{"storage redis {", "\treplay_cache 100 106751d", "}"}, 4, []string{"redis storage: replay_cache: ttl must be at most 24h0m0s"}},
		{"durability without replicas", []string{"storage redis {", "\tdurability", "}"}, 4, []string{"durability replicas <n>"}},
		{"durability replicas not a number", []string{"storage redis {", "\tdurability replicas one", "}"}, 4, []string{"replicas must be an integer", "'one'"}},
		{"durability replicas zero", []string{"storage redis {", "\tdurability replicas 0", "\tkey_prefix k:", "}"}, 4, []string{"durability replicas must be at least 1, got 0"}},
		{"durability timeout invalid", []string{"storage redis {", "\tdurability replicas 1 soon", "}"}, 4, []string{"durability timeout", "'soon'"}},
		{"durability timeout zero", []string{"storage redis {", "\tdurability replicas 1 0", "\tkey_prefix k:", "}"}, 4, []string{"durability timeout must be positive", "'0'"}},
		{"durability timeout zero with a unit", []string{"storage redis {", "\tdurability replicas 1 0s on_timeout proceed", "}"}, 4, []string{"durability timeout must be positive", "'0s'"}},
		{"durability on_timeout unknown", []string{"storage redis {", "\tdurability replicas 1 on_timeout retry", "\tkey_prefix k:", "}"}, 4, []string{`on_timeout must be "fail" or "proceed", got "retry"`}},
		{"durability with a stray word", []string{"storage redis {", "\tdurability replicas 1 1s later", "}"}, 4, []string{"durability replicas <n>"}},
		{"durability timeout past the timeout", []string{"storage redis {", "\tdurability replicas 1 2s", "\tkey_prefix k:", "}"}, 4, []string{"durability timeout 2s must be shorter than timeout 2s"}},
		{"timeout below the durability timeout", []string{"storage redis {", "\tdurability replicas 1 500ms", "\ttimeout 400ms", "}"}, 5, []string{"durability timeout 500ms must be shorter than timeout 400ms"}},
		// Each error at the line of the option it names, whatever follows.
		{"a bad value before other options", []string{"storage redis {", "\ttimeout 2ns", "\tkey_prefix k:", "\tpool_size 2", "}"}, 4, []string{"timeout must be at least 10ms"}},
		{"a user in url, username lines later", []string{"storage redis {", "\turl redis://u@cache:6379", "\tkey_prefix k:", "\tusername v", "}"}, 6, []string{"a user is set both in url and in username"}},
		{"username, a user in url lines later", []string{"storage redis {", "\tusername v", "\tkey_prefix k:", "\turl redis://u@cache:6379", "}"}, 6, []string{"a user is set both in url and in username"}},
		{"a password in the url shorthand, password later", []string{"storage redis redis://:pw@cache:6379 {", "\tkey_prefix k:", "\tpassword other", "}"}, 5, []string{"a password is set both in url and in password"}},
		{"tls_key_file without its cert", []string{"storage redis {", "\turl redis://cache:6379", "\ttls_key_file k.pem", "\tkey_prefix x:", "}"}, 5, []string{"tls_cert_file and tls_key_file go together"}},
		{"sentinel_username far from the end", []string{"storage redis {", "\tsentinel_username u", "\taddresses s1:26379", "\tkey_prefix k:", "}"}, 4, []string{"sentinel_username needs master_name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(block(tt.body...))
			wantParseError(t, err, tt.line, tt.want...)
		})
	}
}

func TestRedisCaddyfileDuplicates(t *testing.T) {
	for _, line := range []string{
		"url redis://a", "addresses a:1 b:2", "master_name m", "username u", "password p",
		"sentinel_username u", "sentinel_password p",
		"key_prefix k", "pool_size 2", "dial_timeout 1s", "timeout 1s",
	} {
		opt, _, _ := strings.Cut(line, " ")
		t.Run(opt, func(t *testing.T) {
			body := []string{"storage redis {", "\t" + line, "\t" + line, "}"}
			if opt == "master_name" || strings.HasPrefix(opt, "sentinel_") {
				body = []string{"storage redis {", "\taddresses a:1", "\t" + line, "\t" + line, "}"}
			}
			_, err := parse(block(body...))
			wantParseError(t, err, 2+len(body)-1, opt, "already specified")
		})
	}
}

// TestRedisCaddyfileErrorsKeepSecrets checks that a malformed url is
// reported without the password it carries.
func TestRedisCaddyfileErrorsKeepSecrets(t *testing.T) {
	for _, u := range []string{"redis://user:hunter2@cache:6379/x", "redis://user:hunter2@cache:notaport/0", "redis://user:hunter2@ca che/0"} {
		_, err := parse(block("storage redis " + u))
		if err == nil {
			t.Errorf("%s: no error", u)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error %q shows the password", err)
		}
	}
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
			name: "more handler options after the block",
			body: []string{"storage postgres {", "\tdsn x", "}", "ttl 1h"},
			want: `{"backend":"postgres","dsn":"x"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := parse(block(tt.body...))
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
	// The storage line is line 3 of block; its first option line 4.
	postgres := func(lines ...string) []string {
		return append(append([]string{"storage postgres {"}, lines...), "}")
	}
	tests := []struct {
		name string
		body []string
		line int
		want []string
	}{
		{name: "argument after the backend", body: []string{"storage postgres extra {", "\tdsn x", "}"}, line: 3, want: []string{"wrong argument count", "'extra'"}},
		{name: "unknown option", body: postgres("dsn x", "password secret"), line: 5, want: []string{"unrecognized postgres storage option", "'password'"}},
		{name: "option names are case sensitive", body: postgres("DSN x"), line: 4, want: []string{"unrecognized postgres storage option", "'DSN'"}},

		{name: "duplicate dsn", body: postgres("dsn a", "dsn b"), line: 5, want: []string{"dsn", "already specified"}},
		{name: "duplicate table", body: postgres("table a", "table b"), line: 5, want: []string{"table", "already specified"}},
		{name: "duplicate create_table", body: postgres("create_table true", "create_table true"), line: 5, want: []string{"create_table", "already specified"}},
		{name: "duplicate cleanup_interval", body: postgres("cleanup_interval 1m", "cleanup_interval 2m"), line: 5, want: []string{"cleanup_interval", "already specified"}},
		{name: "duplicate max_conns", body: postgres("max_conns 1", "dsn x", "max_conns 2"), line: 6, want: []string{"max_conns", "already specified"}},

		{name: "dsn without value", body: postgres("dsn"), line: 4, want: []string{"wrong argument count", "'dsn'"}},
		{name: "empty dsn", body: postgres(`dsn ""`), line: 4, want: []string{"must not be empty"}},
		{name: "dsn with two values", body: postgres("dsn host=db user=app"), line: 4, want: []string{"wrong argument count", "'user=app'"}},
		{name: "table without value", body: postgres("table"), line: 4, want: []string{"wrong argument count", "'table'"}},
		{name: "create_table without value", body: postgres("create_table"), line: 4, want: []string{"wrong argument count", "'create_table'"}},
		{name: "cleanup_interval without value", body: postgres("cleanup_interval"), line: 4, want: []string{"wrong argument count", "'cleanup_interval'"}},
		{name: "max_conns without value", body: postgres("max_conns"), line: 4, want: []string{"wrong argument count", "'max_conns'"}},
		{name: "max_conns with two values", body: postgres("max_conns 1 2"), line: 4, want: []string{"wrong argument count", "'2'"}},
		{name: "block after dsn", body: postgres("dsn x {", "\t}"), line: 4, want: []string{"'{'"}},

		{name: "table with upper case", body: postgres("table Keys"), line: 4, want: []string{"table", `"Keys"`, "lower-case"}},
		{name: "table with three parts", body: postgres("table a.b.c"), line: 4, want: []string{"table", `"a.b.c"`}},
		{name: "table with a quote", body: postgres(`table "x\"y"`), line: 4, want: []string{"table"}},
		{name: "create_table yes", body: postgres("create_table yes"), line: 4, want: []string{"create_table", "true", "false", "'yes'"}},
		{name: "cleanup_interval not a duration", body: postgres("cleanup_interval often"), line: 4, want: []string{"cleanup_interval", "invalid duration", "'often'"}},
		{name: "cleanup_interval zero", body: postgres("cleanup_interval 0s"), line: 4, want: []string{"cleanup_interval", "must be positive", "'0s'"}},
		{name: "cleanup_interval negative", body: postgres("cleanup_interval -1m"), line: 4, want: []string{"cleanup_interval", "must be positive", "'-1m'"}},
		{name: "cleanup_interval below its floor", body: postgres("cleanup_interval 500ms"), line: 4, want: []string{"postgres storage: cleanup_interval must be at least 1s, got 500ms"}},
		{name: "cleanup_interval above its ceiling", body: postgres("cleanup_interval 31d"), line: 4, want: []string{"postgres storage: cleanup_interval must be at most 720h0m0s, got 744h0m0s"}},
		{name: "timeout below its floor", body: postgres("dsn x", "timeout 2ns"), line: 5, want: []string{"postgres storage: timeout must be at least 10ms, got 2ns"}},
		{name: "timeout above its ceiling", body: postgres("timeout 2h"), line: 4, want: []string{"postgres storage: timeout must be at most 1m0s, got 2h0m0s"}},
		{name: "max_conns zero", body: postgres("max_conns 0"), line: 4, want: []string{"max_conns", "positive integer", "'0'"}},
		{name: "max_conns negative", body: postgres("max_conns -4"), line: 4, want: []string{"max_conns", "positive integer", "'-4'"}},
		{name: "max_conns not a number", body: postgres("max_conns lots"), line: 4, want: []string{"max_conns", "positive integer", "'lots'"}},
		{name: "a bad table before the dsn", body: postgres("table Keys", "dsn x", "max_conns 2"), line: 4, want: []string{"table", `"Keys"`}},
		{name: "a bad replay_cache without dsn", body: postgres("table keys", "replay_cache 0"), line: 5, want: []string{"replay_cache: max_entries must be positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(block(tt.body...))
			wantParseError(t, err, tt.line, tt.want...)
		})
	}
}

func TestReplayCacheOptionParsesInRedisAndPostgresBlocks(t *testing.T) {
	for _, backend := range []string{"redis", "postgres dsn"} {
		for in, want := range map[string]string{
			"replay_cache 5000":     `"replay_cache":{"max_entries":5000}`,
			"replay_cache 5000 30s": `"replay_cache":{"max_entries":5000,"ttl":30000000000}`,
		} {
			storage := "storage " + strings.Fields(backend)[0] + " {\n" + in + "\n"
			if backend == "postgres dsn" {
				storage += "dsn postgres://x@h/db\n"
			}
			h, err := parse(block(storage + "}"))
			if err != nil {
				t.Fatalf("%s: %v", in, err)
			}
			if !strings.Contains(string(h.StorageRaw), want) {
				t.Errorf("%s %s: storage JSON %s lacks %s", backend, in, h.StorageRaw, want)
			}
		}
		for _, bad := range []string{"replay_cache", "replay_cache 0", "replay_cache x", "replay_cache 10 -1s", "replay_cache 10 1s 2"} {
			storage := "storage " + strings.Fields(backend)[0] + " {\n" + bad + "\n}"
			if _, err := parse(block(storage)); err == nil || !strings.Contains(err.Error(), "Testfile:") {
				t.Errorf("%s %q: err %v, want an error with file and line", backend, bad, err)
			}
		}
	}
}

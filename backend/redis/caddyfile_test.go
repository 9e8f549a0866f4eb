package redis

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/backend/backendtest"
)

// The `storage redis` block, parsed as the idempotency directive parses
// it (backendtest.ParseStorage): its storage line is line 1 of Testfile.

// parseRedis parses the lines of a `storage redis` block and returns the
// module as its JSON config decodes.
func parseRedis(t *testing.T, lines ...string) (*Storage, error) {
	t.Helper()
	raw, err := backendtest.ParseStorage(strings.Join(lines, "\n"))
	if err != nil {
		return nil, err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		t.Fatalf("storage JSON %s: %v", raw, err)
	}
	if string(obj["backend"]) != `"redis"` {
		t.Fatalf("storage JSON %s: backend is not redis", raw)
	}
	delete(obj, "backend")
	stripped, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return backendtest.FromJSON[Storage](t, string(stripped)), nil
}

func TestRedisCaddyfileOptions(t *testing.T) {
	tests := []struct {
		name string
		body []string
		want Storage
	}{
		{"bare", []string{"storage redis"}, Storage{}},
		{"empty block", []string{"storage redis {", "}"}, Storage{}},
		{"url shorthand", []string{"storage redis rediss://cache.internal:6380/2"}, Storage{URL: "rediss://cache.internal:6380/2"}},
		{"url shorthand with block", []string{"storage redis redis://r:6379 {", "\tkey_prefix app:", "}"},
			Storage{URL: "redis://r:6379", KeyPrefix: "app:"}},
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
		}, Storage{
			URL: "redis://r:6379/1", Username: "app", Password: "{env.REDIS_PASSWORD}", KeyPrefix: "idem:",
			PoolSize: 20, DialTimeout: caddy.Duration(500 * time.Millisecond), Timeout: caddy.Duration(3 * time.Second),
		}},
		{"cluster", []string{"storage redis {", "\taddresses rediss://n1:7000 rediss://n2:7000 rediss://n3:7000", "}"},
			Storage{Addresses: []string{"rediss://n1:7000", "rediss://n2:7000", "rediss://n3:7000"}}},
		{"sentinel", []string{"storage redis {", "\taddresses s1:26379 s2:26379", "\tmaster_name mymaster", "}"},
			Storage{Addresses: []string{"s1:26379", "s2:26379"}, MasterName: "mymaster"}},
		{"sentinel with its own credentials", []string{"storage redis {", "\taddresses s1:26379", "\tmaster_name mymaster",
			"\tsentinel_username watcher", "\tsentinel_password {env.SENTINEL_PASSWORD}", "\tpassword {env.REDIS_PASSWORD}", "}"},
			Storage{Addresses: []string{"s1:26379"}, MasterName: "mymaster", SentinelUsername: "watcher",
				SentinelPassword: "{env.SENTINEL_PASSWORD}", Password: "{env.REDIS_PASSWORD}"}},
		{"sentinel, master_name first", []string{"storage redis {", "\tmaster_name mymaster", "\taddresses s1:26379", "}"},
			Storage{Addresses: []string{"s1:26379"}, MasterName: "mymaster"}},
		{"addresses from a placeholder", []string{"storage redis {", "\taddresses {env.REDIS_NODES}", "}"},
			Storage{Addresses: []string{"{env.REDIS_NODES}"}}},
		{"url from a placeholder", []string{"storage redis {env.REDIS_URL}"}, Storage{URL: "{env.REDIS_URL}"}},
		{"host:port without a scheme", []string{"storage redis 127.0.0.1:6379"}, Storage{URL: "127.0.0.1:6379"}},
		{"TLS files", []string{"storage redis {", "	url redis://10.0.0.7:6379", "	tls_ca_file /etc/redis/ca.pem",
			"	tls_cert_file {env.REDIS_CERT}", "	tls_key_file /etc/redis/client.key", "	tls_server_name cache.internal", "}"},
			Storage{URL: "redis://10.0.0.7:6379", TLSCAFile: "/etc/redis/ca.pem", TLSCertFile: "{env.REDIS_CERT}",
				TLSKeyFile: "/etc/redis/client.key", TLSServerName: "cache.internal"}},
		{"durability replicas", []string{"storage redis {", "	durability replicas 1", "}"},
			Storage{Durability: &Durability{Replicas: 1}}},
		{"durability with a timeout", []string{"storage redis {", "	durability replicas 2 500ms", "}"},
			Storage{Durability: &Durability{Replicas: 2, Timeout: caddy.Duration(500 * time.Millisecond)}}},
		{"durability with everything", []string{"storage redis {", "	timeout 3s", "	durability replicas 1 2s on_timeout proceed", "}"},
			Storage{Timeout: caddy.Duration(3 * time.Second), Durability: &Durability{Replicas: 1, Timeout: caddy.Duration(2 * time.Second), OnTimeout: "proceed"}}},
		{"durability on_timeout without a timeout", []string{"storage redis {", "	durability replicas 1 on_timeout fail", "}"},
			Storage{Durability: &Durability{Replicas: 1, OnTimeout: "fail"}}},
		// replay_cache's syntax is the kit's (backend.ParseReplayCache),
		// tested there; this is its place in this block.
		{"replay_cache", []string{"storage redis {", "\treplay_cache 5000 30s", "}"},
			Storage{ReplayCache: &backend.ReplayCache{MaxEntries: 5000, TTL: caddy.Duration(30 * time.Second)}}},
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
		{"unknown option", []string{"storage redis {", "\tdb 2", "}"}, 2, []string{"unrecognized redis storage option", "'db'"}},
		{"two url arguments", []string{"storage redis redis://a redis://b"}, 1, []string{"wrong argument count", "'redis://b'"}},
		{"a host without a scheme or port", []string{"storage redis cache.internal"}, 1, []string{"url must start with a scheme", "redis://host:port"}},
		{"tls_cert_file without its key", []string{"storage redis {", "\ttls_cert_file c.pem", "\tkey_prefix x:", "}"}, 2, []string{"tls_cert_file and tls_key_file go together"}},
		{"url shorthand and url", []string{"storage redis redis://a {", "\turl redis://b", "}"}, 2, []string{"url", "already specified"}},
		{"url without value", []string{"storage redis {", "\turl", "}"}, 2, []string{"wrong argument count", "'url'"}},
		{"url with two values", []string{"storage redis {", "\turl redis://a redis://b", "}"}, 2, []string{"wrong argument count", "'redis://b'"}},
		{"url with a bad scheme", []string{"storage redis {", "\turl http://cache:6379", "}"}, 2, []string{"invalid url", "scheme"}},
		{"url shorthand with a bad scheme", []string{"storage redis memcached://cache"}, 1, []string{"invalid url"}},
		{"url with a bad database", []string{"storage redis {", "\turl redis://cache:6379/zero", "}"}, 2, []string{"invalid url", "database"}},
		{"url without host", []string{"storage redis {", "\turl redis://", "}"}, 2, []string{"invalid url", "no host"}},
		{"url and addresses", []string{"storage redis {", "\turl redis://a:6379", "\taddresses b:6379 c:6379", "}"}, 3, []string{"mutually exclusive"}},
		{"addresses and url", []string{"storage redis {", "\taddresses b:6379 c:6379", "\turl redis://a:6379", "}"}, 3, []string{"mutually exclusive"}},
		{"url shorthand and addresses", []string{"storage redis redis://a {", "\taddresses b:6379", "}"}, 2, []string{"mutually exclusive"}},
		{"addresses without value", []string{"storage redis {", "\taddresses", "}"}, 2, []string{"wrong argument count", "'addresses'"}},
		{"address without port", []string{"storage redis {", "\taddresses n1:7000 n2", "}"}, 2, []string{"address", `"n2"`, "host:port"}},
		{"address with a path", []string{"storage redis {", "\taddresses redis://n1:7000/3", "}"}, 2, []string{"address", "host:port"}},
		{"address with credentials", []string{"storage redis {", "\taddresses redis://u:p@n1:7000", "}"}, 2, []string{"address", "host:port"}},
		{"mixed TLS addresses", []string{"storage redis {", "\taddresses rediss://n1:7000 n2:7000", "}"}, 2, []string{"mix TLS"}},
		{"master_name without addresses", []string{"storage redis {", "\tmaster_name m", "\ttimeout 1s", "}"}, 2, []string{"master_name needs addresses"}},
		{"sentinel_password without master_name", []string{"storage redis {", "\taddresses s1:26379", "\tsentinel_password p", "\ttimeout 1s", "}"}, 3, []string{"sentinel_password needs master_name"}},
		{"sentinel_username without master_name", []string{"storage redis {", "\tsentinel_username u", "}"}, 2, []string{"sentinel_username needs master_name"}},
		{"sentinel_password without value", []string{"storage redis {", "\tsentinel_password", "}"}, 2, []string{"wrong argument count", "'sentinel_password'"}},
		{"master_name without value", []string{"storage redis {", "\tmaster_name", "}"}, 2, []string{"wrong argument count", "'master_name'"}},
		{"username without value", []string{"storage redis {", "\tusername", "}"}, 2, []string{"wrong argument count", "'username'"}},
		{"password with two values", []string{"storage redis {", "\tpassword a b", "}"}, 2, []string{"wrong argument count", "'b'"}},
		{"key_prefix without value", []string{"storage redis {", "\tkey_prefix", "}"}, 2, []string{"wrong argument count", "'key_prefix'"}},
		{"pool_size not a number", []string{"storage redis {", "\tpool_size many", "}"}, 2, []string{"pool_size", "positive integer", "'many'"}},
		{"pool_size zero", []string{"storage redis {", "\tpool_size 0", "}"}, 2, []string{"pool_size", "positive integer", "'0'"}},
		{"dial_timeout invalid", []string{"storage redis {", "\tdial_timeout quick", "}"}, 2, []string{"dial_timeout", "invalid duration", "'quick'"}},
		{"timeout negative", []string{"storage redis {", "\ttimeout -1s", "}"}, 2, []string{"timeout", "must be positive", "'-1s'"}},
		{"timeout without value", []string{"storage redis {", "\ttimeout", "}"}, 2, []string{"wrong argument count", "'timeout'"}},
		{"block after timeout", []string{"storage redis {", "\ttimeout 1s {", "\t}", "}"}, 2, []string{"'{'"}},
		{"timeout below the floor", []string{"storage redis {", "\ttimeout 2ns", "}"}, 2, []string{"redis storage: timeout must be at least 10ms, got 2ns"}},
		{"timeout above the ceiling", []string{"storage redis {", "\ttimeout 2h", "}"}, 2, []string{"redis storage: timeout must be at most 1m0s, got 2h0m0s"}},
		{"dial_timeout below the floor", []string{"storage redis {", "\tkey_prefix k:", "\tdial_timeout 1ms", "}"}, 3, []string{"redis storage: dial_timeout must be at least 10ms, got 1ms"}},
		{"dial_timeout that overflows a doubling", []string{"storage redis {", "\tdial_timeout 60000d", "}"}, 2, []string{"redis storage: dial_timeout must be at most 1m0s"}},
		{"key_prefix with a hash tag", []string{"storage redis {", "\tkey_prefix app:{tenant}:", "}"}, 2, []string{"key_prefix must not contain '{' or '}'", "hash tag", `"app:{tenant}:"`}},
		{"key_prefix with a closing brace", []string{"storage redis {", "\tkey_prefix app}", "}"}, 2, []string{"key_prefix must not contain"}},
		{"replay_cache ttl below the floor", []string{"storage redis {", "\treplay_cache 100 2ns", "}"}, 2, []string{"redis storage: replay_cache: ttl must be at least 1s, got 2ns"}},
		{"replay_cache ttl above the ceiling", []string{"storage redis {", "\treplay_cache 100 106751d", "}"}, 2, []string{"redis storage: replay_cache: ttl must be at most 24h0m0s"}},
		{"durability without replicas", []string{"storage redis {", "\tdurability", "}"}, 2, []string{"durability replicas <n>"}},
		{"durability replicas not a number", []string{"storage redis {", "\tdurability replicas one", "}"}, 2, []string{"replicas must be an integer", "'one'"}},
		{"durability replicas zero", []string{"storage redis {", "\tdurability replicas 0", "\tkey_prefix k:", "}"}, 2, []string{"durability replicas must be at least 1, got 0"}},
		{"durability timeout invalid", []string{"storage redis {", "\tdurability replicas 1 soon", "}"}, 2, []string{"durability timeout", "'soon'"}},
		{"durability timeout zero", []string{"storage redis {", "\tdurability replicas 1 0", "\tkey_prefix k:", "}"}, 2, []string{"durability timeout must be positive", "'0'"}},
		{"durability timeout zero with a unit", []string{"storage redis {", "\tdurability replicas 1 0s on_timeout proceed", "}"}, 2, []string{"durability timeout must be positive", "'0s'"}},
		{"durability on_timeout unknown", []string{"storage redis {", "\tdurability replicas 1 on_timeout retry", "\tkey_prefix k:", "}"}, 2, []string{`on_timeout must be "fail" or "proceed", got "retry"`}},
		{"durability with a stray word", []string{"storage redis {", "\tdurability replicas 1 1s later", "}"}, 2, []string{"durability replicas <n>"}},
		{"durability timeout past the timeout", []string{"storage redis {", "\tdurability replicas 1 2s", "\tkey_prefix k:", "}"}, 2, []string{"durability timeout 2s must be shorter than timeout 2s"}},
		{"timeout below the durability timeout", []string{"storage redis {", "\tdurability replicas 1 500ms", "\ttimeout 400ms", "}"}, 3, []string{"durability timeout 500ms must be shorter than timeout 400ms"}},
		// Each error at the line of the option it names, whatever follows.
		{"a bad value before other options", []string{"storage redis {", "\ttimeout 2ns", "\tkey_prefix k:", "\tpool_size 2", "}"}, 2, []string{"timeout must be at least 10ms"}},
		{"a user in url, username lines later", []string{"storage redis {", "\turl redis://u@cache:6379", "\tkey_prefix k:", "\tusername v", "}"}, 4, []string{"a user is set both in url and in username"}},
		{"username, a user in url lines later", []string{"storage redis {", "\tusername v", "\tkey_prefix k:", "\turl redis://u@cache:6379", "}"}, 4, []string{"a user is set both in url and in username"}},
		{"a password in the url shorthand, password later", []string{"storage redis redis://:pw@cache:6379 {", "\tkey_prefix k:", "\tpassword other", "}"}, 3, []string{"a password is set both in url and in password"}},
		{"tls_key_file without its cert", []string{"storage redis {", "\turl redis://cache:6379", "\ttls_key_file k.pem", "\tkey_prefix x:", "}"}, 3, []string{"tls_cert_file and tls_key_file go together"}},
		{"sentinel_username far from the end", []string{"storage redis {", "\tsentinel_username u", "\taddresses s1:26379", "\tkey_prefix k:", "}"}, 2, []string{"sentinel_username needs master_name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseRedis(t, tt.body...)
			backendtest.WantParseError(t, err, tt.line, tt.want...)
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
			_, err := parseRedis(t, body...)
			// The duplicate is on the line before the closing brace.
			backendtest.WantParseError(t, err, len(body)-1, opt, "already specified")
		})
	}
}

// TestRedisCaddyfileErrorsKeepSecrets checks that a malformed url is
// reported without the password it carries.
func TestRedisCaddyfileErrorsKeepSecrets(t *testing.T) {
	for _, u := range []string{"redis://user:hunter2@cache:6379/x", "redis://user:hunter2@cache:notaport/0", "redis://user:hunter2@ca che/0"} {
		_, err := backendtest.ParseStorage("storage redis " + u)
		if err == nil {
			t.Errorf("%s: no error", u)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error %q shows the password", err)
		}
	}
}

package idempotency

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	redisstore "github.com/caddy-idempotency/caddy-idempotency/storage/redis"
)

// rsParse parses a Caddyfile idempotency block and returns its redis
// storage module as the JSON config would decode it.
func rsParse(t *testing.T, body ...string) (*RedisStorage, error) {
	t.Helper()
	h, err := cfParse(cfBlock(body...))
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
	r := new(RedisStorage)
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
		want RedisStorage
	}{
		{"bare", []string{"storage redis"}, RedisStorage{}},
		{"empty block", []string{"storage redis {", "}"}, RedisStorage{}},
		{"url shorthand", []string{"storage redis rediss://cache.internal:6380/2"}, RedisStorage{URL: "rediss://cache.internal:6380/2"}},
		{"url shorthand with block", []string{"storage redis redis://r:6379 {", "\tkey_prefix app:", "}"},
			RedisStorage{URL: "redis://r:6379", KeyPrefix: "app:"}},
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
		}, RedisStorage{
			URL: "redis://r:6379/1", Username: "app", Password: "{env.REDIS_PASSWORD}", KeyPrefix: "idem:",
			PoolSize: 20, DialTimeout: cfDur(500 * time.Millisecond), Timeout: cfDur(3 * time.Second),
		}},
		{"cluster", []string{"storage redis {", "\taddresses rediss://n1:7000 rediss://n2:7000 rediss://n3:7000", "}"},
			RedisStorage{Addresses: []string{"rediss://n1:7000", "rediss://n2:7000", "rediss://n3:7000"}}},
		{"sentinel", []string{"storage redis {", "\taddresses s1:26379 s2:26379", "\tmaster_name mymaster", "}"},
			RedisStorage{Addresses: []string{"s1:26379", "s2:26379"}, MasterName: "mymaster"}},
		{"sentinel with its own credentials", []string{"storage redis {", "\taddresses s1:26379", "\tmaster_name mymaster",
			"\tsentinel_username watcher", "\tsentinel_password {env.SENTINEL_PASSWORD}", "\tpassword {env.REDIS_PASSWORD}", "}"},
			RedisStorage{Addresses: []string{"s1:26379"}, MasterName: "mymaster", SentinelUsername: "watcher",
				SentinelPassword: "{env.SENTINEL_PASSWORD}", Password: "{env.REDIS_PASSWORD}"}},
		{"sentinel, master_name first", []string{"storage redis {", "\tmaster_name mymaster", "\taddresses s1:26379", "}"},
			RedisStorage{Addresses: []string{"s1:26379"}, MasterName: "mymaster"}},
		{"addresses from a placeholder", []string{"storage redis {", "\taddresses {env.REDIS_NODES}", "}"},
			RedisStorage{Addresses: []string{"{env.REDIS_NODES}"}}},
		{"url from a placeholder", []string{"storage redis {env.REDIS_URL}"}, RedisStorage{URL: "{env.REDIS_URL}"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := rsParse(t, tt.body...)
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := cfParse(cfBlock(tt.body...))
			cfCheckErr(t, err, tt.line, tt.want...)
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
			_, err := cfParse(cfBlock(body...))
			cfCheckErr(t, err, 2+len(body)-1, opt, "already specified")
		})
	}
}

// TestRedisCaddyfileErrorsKeepSecrets checks that a malformed url is
// reported without the password it carries.
func TestRedisCaddyfileErrorsKeepSecrets(t *testing.T) {
	for _, u := range []string{"redis://user:hunter2@cache:6379/x", "redis://user:hunter2@cache:notaport/0", "redis://user:hunter2@ca che/0"} {
		_, err := cfParse(cfBlock("storage redis " + u))
		if err == nil {
			t.Errorf("%s: no error", u)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error %q shows the password", err)
		}
	}
}

func TestRedisResolve(t *testing.T) {
	t.Setenv("IDEM_TEST_REDIS_URL", "redis://cache:6380/3")
	t.Setenv("IDEM_TEST_REDIS_NODES", "n1:7000, n2:7000 n3:7000")
	t.Setenv("IDEM_TEST_REDIS_PASSWORD", "s3cr{e}t")
	type opts = redisstore.ClientOptions
	tests := []struct {
		name    string
		in      RedisStorage
		want    redisConfig
		wantErr string
	}{
		{name: "defaults", in: RedisStorage{},
			want: redisConfig{Client: opts{URL: redisstore.DefaultURL}, KeyPrefix: "idempotency:"}},
		{name: "url from env", in: RedisStorage{URL: "{env.IDEM_TEST_REDIS_URL}", KeyPrefix: "k:"},
			want: redisConfig{Client: opts{URL: "redis://cache:6380/3"}, KeyPrefix: "k:"}},
		{name: "password from env, braces kept", in: RedisStorage{Password: "{env.IDEM_TEST_REDIS_PASSWORD}"},
			want: redisConfig{Client: opts{URL: redisstore.DefaultURL, Password: "s3cr{e}t"}, KeyPrefix: "idempotency:"}},
		{name: "literal password with braces", in: RedisStorage{Password: "a{b}c"},
			want: redisConfig{Client: opts{URL: redisstore.DefaultURL, Password: "a{b}c"}, KeyPrefix: "idempotency:"}},
		{name: "cluster from one env var", in: RedisStorage{Addresses: []string{"{env.IDEM_TEST_REDIS_NODES}"}},
			want: redisConfig{Client: opts{Addrs: []string{"n1:7000, n2:7000 n3:7000"}}, KeyPrefix: "idempotency:"}},
		{name: "cluster over TLS", in: RedisStorage{Addresses: []string{"rediss://n1:7000", "rediss://n2:7000/"}},
			want: redisConfig{Client: opts{Addrs: []string{"rediss://n1:7000", "rediss://n2:7000/"}}, KeyPrefix: "idempotency:"}},
		{name: "sentinel", in: RedisStorage{Addresses: []string{"s1:26379"}, MasterName: "m", Username: "u", Password: "p", PoolSize: 7, DialTimeout: caddy.Duration(time.Second), Timeout: caddy.Duration(time.Minute)},
			want: redisConfig{Client: opts{Addrs: []string{"s1:26379"}, MasterName: "m", Username: "u", Password: "p", PoolSize: 7, DialTimeout: time.Second, Timeout: time.Minute}, KeyPrefix: "idempotency:"}},
		{name: "sentinel credentials from env", in: RedisStorage{Addresses: []string{"s1:26379"}, MasterName: "m", SentinelUsername: "w", SentinelPassword: "{env.IDEM_TEST_REDIS_PASSWORD}"},
			want: redisConfig{Client: opts{Addrs: []string{"s1:26379"}, MasterName: "m", SentinelUsername: "w", SentinelPassword: "s3cr{e}t"}, KeyPrefix: "idempotency:"}},

		{name: "url and addresses", in: RedisStorage{URL: "redis://a", Addresses: []string{"b:1"}}, wantErr: "mutually exclusive"},
		{name: "sentinel_password without master_name", in: RedisStorage{Addresses: []string{"b:1"}, SentinelPassword: "p"}, wantErr: "sentinel_password needs master_name"},
		{name: "master_name alone", in: RedisStorage{MasterName: "m"}, wantErr: "master_name needs addresses"},
		{name: "master_name with url", in: RedisStorage{MasterName: "m", URL: "redis://a"}, wantErr: "master_name needs addresses"},
		{name: "url empty from env", in: RedisStorage{URL: "{env.IDEM_TEST_UNSET_VARIABLE}"}, wantErr: "url is empty"},
		{name: "bad url", in: RedisStorage{URL: "https://cache"}, wantErr: "invalid url"},
		{name: "password twice", in: RedisStorage{URL: "redis://:pw@cache", Password: "other"}, wantErr: "password is set both"},
		{name: "user twice", in: RedisStorage{URL: "redis://u@cache", Username: "v"}, wantErr: "user is set both"},
		{name: "empty address", in: RedisStorage{Addresses: []string{"{env.IDEM_TEST_UNSET_VARIABLE}"}}, wantErr: "address is empty"},
		{name: "negative pool_size", in: RedisStorage{PoolSize: -1}, wantErr: "pool_size"},
		{name: "negative timeout", in: RedisStorage{Timeout: -1}, wantErr: "timeout"},
		{name: "negative dial_timeout", in: RedisStorage{DialTimeout: -1}, wantErr: "dial_timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.in.check()
			var got redisConfig
			if err == nil {
				got, err = tt.in.resolve()
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// TestRedisSecretsStayOutOfConfig provisions with {env.*} credentials:
// they reach the client but neither the module's JSON nor the pool key.
func TestRedisSecretsStayOutOfConfig(t *testing.T) {
	const secret = "pa55-w0rd-from-env"
	t.Setenv("IDEM_TEST_REDIS_SECRET", secret)
	ctx, _ := mtContext(t)
	r := &RedisStorage{
		URL:       "redis://127.0.0.1:1/0",
		Username:  "{env.IDEM_TEST_REDIS_SECRET}",
		Password:  "{env.IDEM_TEST_REDIS_SECRET}",
		KeyPrefix: "idempotency-test:" + t.Name() + ":",
	}
	if err := r.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Cleanup()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), secret) || !strings.Contains(string(b), "{env.IDEM_TEST_REDIS_SECRET}") {
		t.Errorf("module JSON %s: want the placeholder, not the secret", b)
	}
	if strings.Contains(r.key, secret) {
		t.Errorf("pool key %q holds the secret", r.key)
	}
	cfg, err := r.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Client.Password != secret || cfg.Client.Username != secret {
		t.Errorf("resolved credentials %q %q", cfg.Client.Username, cfg.Client.Password)
	}
	// Another secret is another client.
	t.Setenv("IDEM_TEST_REDIS_SECRET", "other")
	other := &RedisStorage{URL: r.URL, Username: r.Username, Password: r.Password, KeyPrefix: r.KeyPrefix}
	if err := other.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer other.Cleanup()
	if other.key == r.key || other.Store() == r.Store() {
		t.Error("two passwords share a pool key")
	}
}

// TestRedisProvisionSharesOneClient checks the pooling: one store (one
// client) per configuration, kept across a reload, closed with the last
// user.
func TestRedisProvisionSharesOneClient(t *testing.T) {
	prefix := "idempotency-test:" + t.Name() + ":"
	provisioned := func(ctx caddy.Context, poolSize int) *RedisStorage {
		t.Helper()
		r := &RedisStorage{URL: "redis://127.0.0.1:1/0", KeyPrefix: prefix, PoolSize: poolSize}
		if err := r.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		return r
	}
	ctx1, _ := mtContext(t)
	a, b, c := provisioned(ctx1, 5), provisioned(ctx1, 5), provisioned(ctx1, 6)
	if a.Store() != b.Store() {
		t.Error("same configuration, two stores")
	}
	if a.Store() == c.Store() {
		t.Error("different pool_size, one store")
	}
	// Reload: the new config is provisioned before the old is cleaned up.
	ctx2, _ := mtContext(t)
	d := provisioned(ctx2, 5)
	shared := a.Store()
	for _, r := range []*RedisStorage{a, b, c} {
		if err := r.Cleanup(); err != nil {
			t.Fatal(err)
		}
	}
	if d.Store() != shared {
		t.Fatal("the reloaded config got another store")
	}
	if err := d.Cleanup(); err != nil {
		t.Fatal(err)
	}
	// The last user is gone: the client is closed.
	if _, err := shared.Get(t.Context(), storage.Key{Scope: "s", ID: "k"}, false); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Get on the released store: %v, want a closed-client error", err)
	}
	// Cleanup of a module that never provisioned, or twice, is harmless.
	if err := new(RedisStorage).Cleanup(); err != nil {
		t.Error(err)
	}
	if err := d.Cleanup(); err != nil {
		t.Error(err)
	}
}

func TestRedisProvisionRejectsBadConfigWithoutHoldingAStore(t *testing.T) {
	ctx, _ := mtContext(t)
	bad := mtFromJSON(t, `{"storage":{"backend":"redis","url":"redis://a:6379","addresses":["b:1"]}}`)
	err := mtProvision(t, ctx, bad)
	if err == nil || !strings.Contains(err.Error(), "mutually exclusive") {
		t.Fatalf("Provision: %v", err)
	}
	if err := bad.Cleanup(); err != nil {
		t.Fatal(err)
	}
}

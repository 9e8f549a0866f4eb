package redis

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/backend/backendtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/opterr"
	redisstore "github.com/caddy-idempotency/caddy-idempotency/storage/redis"
)

func TestRedisConfigResolvesPlaceholdersAndRejectsConflicts(t *testing.T) {
	t.Setenv("IDEM_TEST_REDIS_URL", "redis://cache:6380/3")
	t.Setenv("IDEM_TEST_REDIS_NODES", "n1:7000, n2:7000 n3:7000")
	t.Setenv("IDEM_TEST_REDIS_PASSWORD", "s3cr{e}t")
	type opts = redisstore.ClientOptions
	tests := []struct {
		name    string
		in      Storage
		want    redisConfig
		wantErr string
	}{
		{name: "defaults", in: Storage{},
			want: redisConfig{Client: opts{URL: redisstore.DefaultURL}, KeyPrefix: "idempotency:"}},
		{name: "url from env", in: Storage{URL: "{env.IDEM_TEST_REDIS_URL}", KeyPrefix: "k:"},
			want: redisConfig{Client: opts{URL: "redis://cache:6380/3"}, KeyPrefix: "k:"}},
		{name: "password from env, braces kept", in: Storage{Password: "{env.IDEM_TEST_REDIS_PASSWORD}"},
			want: redisConfig{Client: opts{URL: redisstore.DefaultURL, Password: "s3cr{e}t"}, KeyPrefix: "idempotency:"}},
		{name: "literal password with braces", in: Storage{Password: "a{b}c"},
			want: redisConfig{Client: opts{URL: redisstore.DefaultURL, Password: "a{b}c"}, KeyPrefix: "idempotency:"}},
		{name: "cluster from one env var", in: Storage{Addresses: []string{"{env.IDEM_TEST_REDIS_NODES}"}},
			want: redisConfig{Client: opts{Addrs: []string{"n1:7000, n2:7000 n3:7000"}}, KeyPrefix: "idempotency:"}},
		{name: "cluster over TLS", in: Storage{Addresses: []string{"rediss://n1:7000", "rediss://n2:7000/"}},
			want: redisConfig{Client: opts{Addrs: []string{"rediss://n1:7000", "rediss://n2:7000/"}}, KeyPrefix: "idempotency:"}},
		{name: "sentinel", in: Storage{Addresses: []string{"s1:26379"}, MasterName: "m", Username: "u", Password: "p", PoolSize: 7, DialTimeout: caddy.Duration(time.Second), Timeout: caddy.Duration(time.Minute)},
			want: redisConfig{Client: opts{Addrs: []string{"s1:26379"}, MasterName: "m", Username: "u", Password: "p", PoolSize: 7, DialTimeout: time.Second, Timeout: time.Minute}, KeyPrefix: "idempotency:"}},
		{name: "sentinel credentials from env", in: Storage{Addresses: []string{"s1:26379"}, MasterName: "m", SentinelUsername: "w", SentinelPassword: "{env.IDEM_TEST_REDIS_PASSWORD}"},
			want: redisConfig{Client: opts{Addrs: []string{"s1:26379"}, MasterName: "m", SentinelUsername: "w", SentinelPassword: "s3cr{e}t"}, KeyPrefix: "idempotency:"}},

		{name: "url and addresses", in: Storage{URL: "redis://a", Addresses: []string{"b:1"}}, wantErr: "mutually exclusive"},
		{name: "sentinel_password without master_name", in: Storage{Addresses: []string{"b:1"}, SentinelPassword: "p"}, wantErr: "sentinel_password needs master_name"},
		{name: "master_name alone", in: Storage{MasterName: "m"}, wantErr: "master_name needs addresses"},
		{name: "master_name with url", in: Storage{MasterName: "m", URL: "redis://a"}, wantErr: "master_name needs addresses"},
		{name: "url empty from env", in: Storage{URL: "{env.IDEM_TEST_UNSET_VARIABLE}"}, wantErr: "url is empty"},
		{name: "bad url", in: Storage{URL: "https://cache"}, wantErr: "invalid url"},
		{name: "password twice", in: Storage{URL: "redis://:pw@cache", Password: "other"}, wantErr: "password is set both"},
		{name: "user twice", in: Storage{URL: "redis://u@cache", Username: "v"}, wantErr: "user is set both"},
		{name: "empty address", in: Storage{Addresses: []string{"{env.IDEM_TEST_UNSET_VARIABLE}"}}, wantErr: "address is empty"},
		{name: "negative pool_size", in: Storage{PoolSize: -1}, wantErr: "pool_size"},
		{name: "negative timeout", in: Storage{Timeout: -1}, wantErr: "timeout"},
		{name: "negative dial_timeout", in: Storage{DialTimeout: -1}, wantErr: "dial_timeout"},
		// JSON durations given as bare numbers are nanoseconds.
		{name: "timeout in nanoseconds", in: Storage{Timeout: 2}, wantErr: "redis storage: timeout must be at least 10ms, got 2ns"},
		{name: "dial_timeout in nanoseconds", in: Storage{DialTimeout: 500}, wantErr: "redis storage: dial_timeout must be at least 10ms, got 500ns"},
		{name: "timeout near the int64 limit", in: Storage{Timeout: 1<<63 - 1}, wantErr: "redis storage: timeout must be at most 1m0s"},
		{name: "replay_cache ttl in nanoseconds", in: Storage{ReplayCache: &backend.ReplayCache{MaxEntries: 10, TTL: 10}}, wantErr: "redis storage: replay_cache: ttl must be at least 1s, got 10ns"},
		{name: "replay_cache ttl near the int64 limit", in: Storage{ReplayCache: &backend.ReplayCache{MaxEntries: 10, TTL: 1<<63 - 1}}, wantErr: "redis storage: replay_cache: ttl must be at most 24h0m0s"},
		{name: "key_prefix with a hash tag", in: Storage{KeyPrefix: "{idem}:"}, wantErr: "redis storage: key_prefix must not contain '{' or '}'"},
		{name: "key_prefix from a placeholder", in: Storage{KeyPrefix: "{env.IDEM_TEST_REDIS_URL}"}, wantErr: "key_prefix must not contain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.in.compile()
			if err == nil {
				got, err = got.resolve()
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
	ctx, _ := backendtest.CaddyContext(t)
	r := &Storage{
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
	if strings.Contains(r.StoreID(), secret) {
		t.Errorf("pool key %q holds the secret", r.StoreID())
	}
	cfg, err := r.compile()
	if err == nil {
		cfg, err = cfg.resolve()
	}
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Client.Password != secret || cfg.Client.Username != secret {
		t.Errorf("resolved credentials %q %q", cfg.Client.Username, cfg.Client.Password)
	}
	// Another secret is another client.
	t.Setenv("IDEM_TEST_REDIS_SECRET", "other")
	other := &Storage{URL: r.URL, Username: r.Username, Password: r.Password, KeyPrefix: r.KeyPrefix}
	if err := other.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer other.Cleanup()
	if other.StoreID() == r.StoreID() || other.Store() == r.Store() {
		t.Error("two passwords share a pool key")
	}
}

// TestRedisProvisionSharesOneClient checks the pooling: one store (one
// client) per configuration, kept across a reload, closed with the last
// user.
func TestRedisProvisionSharesOneClient(t *testing.T) {
	prefix := "idempotency-test:" + t.Name() + ":"
	provisioned := func(ctx caddy.Context, poolSize int) *Storage {
		t.Helper()
		r := &Storage{URL: "redis://127.0.0.1:1/0", KeyPrefix: prefix, PoolSize: poolSize}
		if err := r.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		return r
	}
	ctx1, _ := backendtest.CaddyContext(t)
	a, b, c := provisioned(ctx1, 5), provisioned(ctx1, 5), provisioned(ctx1, 6)
	if a.Store() != b.Store() {
		t.Error("same configuration, two stores")
	}
	if a.Store() == c.Store() {
		t.Error("different pool_size, one store")
	}
	// Reload: the new config is provisioned before the old is cleaned up.
	ctx2, _ := backendtest.CaddyContext(t)
	d := provisioned(ctx2, 5)
	shared := a.Store()
	for _, r := range []*Storage{a, b, c} {
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
	if err := new(Storage).Cleanup(); err != nil {
		t.Error(err)
	}
	if err := d.Cleanup(); err != nil {
		t.Error(err)
	}
}

// TestRedisRenewsLeasesInBatches: the store the module builds renews
// leases in batches (storage.BatchRenewer), with a replay cache in front
// of it too, on a client of its own that closes with the store.
func TestRedisRenewsLeasesInBatches(t *testing.T) {
	addr := redistest.Addr()
	redistest.Require(t, addr)
	for _, cached := range []bool{false, true} {
		t.Run(fmt.Sprint("replay_cache=", cached), func(t *testing.T) {
			r := &Storage{URL: "redis://" + addr + "/0", KeyPrefix: "idempotency-test:" + redistest.RandomHex(6) + ":"}
			if cached {
				r.ReplayCache = &backend.ReplayCache{MaxEntries: 10}
			}
			ctx, _ := backendtest.CaddyContext(t)
			if err := r.Provision(ctx); err != nil {
				t.Fatal(err)
			}
			s := r.Store()
			b, ok := s.(storage.BatchRenewer)
			if !ok {
				t.Fatalf("the store %T does not renew in batches", s)
			}
			key := storage.Key{Scope: "s", ID: "leased"}
			res, err := s.Reserve(t.Context(), key, []byte("fp"), time.Minute)
			if err != nil || res.Outcome != storage.Acquired {
				t.Fatalf("Reserve: %v %v", res.Outcome, err)
			}
			batch := []storage.Renewal{{Key: key, Token: res.Token, Lease: time.Hour}}
			if err := b.RenewBatch(t.Context(), batch); err != nil || batch[0].Err != nil {
				t.Fatalf("RenewBatch: %v, %v", err, batch[0].Err)
			}
			if rec, err := s.Get(t.Context(), key, false); err != nil || time.Until(rec.ExpiresAt) < 30*time.Minute {
				t.Fatalf("the renewed lease: %v, %v; want it to last an hour", rec, err)
			}
			if !cached {
				if n := s.(*redisstore.Store).RenewalRoundTrips(); n < 1 || n > 2 { // 2: the script, new to the server
					t.Errorf("%d round trips for one batch", n)
				}
			}
			if err := r.Cleanup(); err != nil {
				t.Fatal(err)
			}
			// The last user is gone: the renewal client is closed too.
			if err := b.RenewBatch(t.Context(), batch); err == nil || !strings.Contains(err.Error(), "closed") {
				t.Errorf("RenewBatch on the released store: %v, want a closed-client error", err)
			}
		})
	}
}

// TestRedisDurationsInNanosecondsAreConfigErrors: a JSON config that
// gives a duration as a bare number means nanoseconds; "timeout": 2 used
// to load and then answer 503 to every request.
func TestRedisDurationsInNanosecondsAreConfigErrors(t *testing.T) {
	for field, want := range map[string]string{
		`"timeout": 2`:         "redis storage: timeout must be at least 10ms, got 2ns",
		`"dial_timeout": 1000`: "redis storage: dial_timeout must be at least 10ms, got 1µs",
		`"replay_cache": {"max_entries": 10, "ttl": 30}`: "redis storage: replay_cache: ttl must be at least 1s, got 30ns",
		`"key_prefix": "{shop}:"`:                        "redis storage: key_prefix must not contain",
	} {
		ctx, _ := backendtest.CaddyContext(t)
		h := backendtest.FromJSON[Storage](t, `{`+field+`}`)
		err := h.Provision(ctx)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Provision error %v, want one containing %q", field, err, want)
		}
		if err := h.Cleanup(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRedisProvisionRejectsBadConfigWithoutHoldingAStore(t *testing.T) {
	ctx, _ := backendtest.CaddyContext(t)
	bad := backendtest.FromJSON[Storage](t, `{"url":"redis://a:6379","addresses":["b:1"]}`)
	err := bad.Provision(ctx)
	if err == nil || !strings.Contains(err.Error(), "mutually exclusive") {
		t.Fatalf("Provision: %v", err)
	}
	if err := bad.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if bad.Store() != nil {
		t.Fatal("a config that failed holds a store")
	}
}

// The Redis TLS options against a private redis-server that speaks TLS
// with a certificate from a test CA and requires a client certificate.
func TestRedisTLSOptionsReachATLSServer(t *testing.T) {
	srv := redistest.StartTLSServer(t)
	config := func(extra string) string {
		return fmt.Sprintf(`{"url":"redis://%s/0","key_prefix":"tls-%s:","timeout":"1s","dial_timeout":"1s"%s}`,
			srv.TLSAddr, redistest.RandomHex(4), extra)
	}
	// reserve provisions the storage and takes a new key in its store.
	reserve := func(extra string) error {
		ctx, _ := backendtest.CaddyContext(t)
		r := backendtest.FromJSON[Storage](t, config(extra))
		if err := r.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		defer r.Cleanup()
		key := storage.Key{Scope: "tls", ID: redistest.RandomHex(4)}
		res, err := r.Store().Reserve(t.Context(), key, []byte("fp"), time.Minute)
		if err != nil {
			return err
		}
		if err := r.Store().Complete(t.Context(), key, res.Token, &storage.Response{Status: 201}, time.Minute); err != nil {
			return err
		}
		if res, err := r.Store().Reserve(t.Context(), key, []byte("fp"), time.Minute); err != nil || res.Outcome != storage.Replay {
			return fmt.Errorf("the completed key: %v, %v; want a replay", res.Outcome, err)
		}
		return nil
	}

	full := fmt.Sprintf(`,"tls_ca_file":%q,"tls_cert_file":%q,"tls_key_file":%q,"tls_server_name":"localhost"`, srv.CAFile, srv.CertFile, srv.KeyFile)
	if err := reserve(full); err != nil {
		t.Fatalf("over TLS with the test CA and a client certificate: %v", err)
	}
	for name, extra := range map[string]string{
		"no client certificate":     fmt.Sprintf(`,"tls_ca_file":%q`, srv.CAFile),
		"the system's CAs":          fmt.Sprintf(`,"tls_cert_file":%q,"tls_key_file":%q`, srv.CertFile, srv.KeyFile),
		"a name the cert lacks":     fmt.Sprintf(`,"tls_ca_file":%q,"tls_cert_file":%q,"tls_key_file":%q,"tls_server_name":"other.example"`, srv.CAFile, srv.CertFile, srv.KeyFile),
		"plain Redis on a TLS port": "",
	} {
		// The handler answers such an error with 503 (a certificate that
		// fails verification is not an outage: it fails closed even
		// under fail_open).
		if err := reserve(extra); err == nil {
			t.Errorf("%s: the key was taken: the server must not be reachable that way", name)
		}
	}
}

func TestRedisTLSFilesThatCannotBeReadFailProvision(t *testing.T) {
	ctx, _ := backendtest.CaddyContext(t)
	r := backendtest.FromJSON[Storage](t, `{"url":"redis://127.0.0.1:1/0","tls_ca_file":"/nonexistent/ca.pem"}`)
	if err := r.Provision(ctx); err == nil {
		t.Fatal("a tls_ca_file that cannot be read was accepted")
	}
	if err := r.Cleanup(); err != nil {
		t.Fatal(err)
	}
}

// TestRedisValidateAndCompileErrors: a compile error names its options
// (each of a rule between options); Validate reports it for a config that
// was not provisioned, and a provisioned config has nothing left to
// validate.
func TestRedisValidateAndCompileErrors(t *testing.T) {
	for config, options := range map[string][]string{
		`{"url":"redis://a","addresses":["b:1"]}`:        {"url", "addresses"},
		`{"master_name":"m"}`:                            {"master_name", "addresses"},
		`{"addresses":["b:1"],"sentinel_password":"p"}`:  {"sentinel_password", "master_name"},
		`{"tls_key_file":"k.pem"}`:                       {"tls_cert_file", "tls_key_file"},
		`{"url":"redis://u@a","username":"v"}`:           {"url", "username"},
		`{"url":"cache"}`:                                {"url"},
		`{"addresses":["n1"]}`:                           {"addresses"},
		`{"pool_size":-1}`:                               {"pool_size"},
		`{"dial_timeout":1}`:                             {"dial_timeout"},
		`{"timeout":"2h"}`:                               {"timeout"},
		`{"key_prefix":"{x}"}`:                           {"key_prefix"},
		`{"replay_cache":{"max_entries":0}}`:             {"replay_cache"},
		`{"durability":{}}`:                              {"durability"},
		`{"durability":{"replicas":1,"on_timeout":"x"}}`: {"durability"},
		`{"durability":{"replicas":1,"timeout":"5s"}}`:   {"durability", "timeout"},
		`{"durability":{"replicas":1,"timeout":1}}`:      {"durability"},
	} {
		if got := opterr.Options(backendtest.FromJSON[Storage](t, config).Validate()); !slices.Equal(got, options) {
			t.Errorf("%s: Validate names %q, want %q", config, got, options)
		}
	}
	ctx, _ := backendtest.CaddyContext(t)
	r := backendtest.FromJSON[Storage](t, `{"url":"redis://127.0.0.1:1/0","key_prefix":"idempotency-test:`+t.Name()+`:"}`)
	if err := r.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Cleanup()
	if err := r.Validate(); err != nil {
		t.Errorf("Validate of a provisioned store: %v", err)
	}
}

// TestRedisStartUpLineShowsTheKeyPrefix: the address of the start-up
// line ("idempotency store opened") names the key prefix beside the
// server, the default one too, and never the password.
func TestRedisStartUpLineShowsTheKeyPrefix(t *testing.T) {
	for _, tc := range []struct {
		storage Storage
		want    string
	}{
		{Storage{}, `redis://127.0.0.1:6379/0 key_prefix idempotency:`},
		{Storage{URL: "redis://u:hunter2@cache:6380/2", KeyPrefix: "shop:idem:"}, `redis://cache:6380/2 key_prefix shop:idem:`},
		{Storage{Addresses: []string{"n1:7000", "n2:7000"}, KeyPrefix: "a b"}, `redis://n1:7000,n2:7000 (Cluster) key_prefix "a b"`},
	} {
		cfg, err := tc.storage.compile()
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.where(); got != tc.want {
			t.Errorf("where = %q, want %q", got, tc.want)
		}
	}
}

// TestDurabilityTimeoutsAreLoggedOnceASecondPerStore: the first shortfall
// of a store is logged at once, the next ones within the second are held
// back and written as one line with their counts, and a second with none
// ends the window, so that the next is logged at once again.
func TestDurabilityTimeoutsAreLoggedOnceASecondPerStore(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	var due []func()
	l := shortfallLog(zap.New(core), "redis:test", 1, false)
	l.After = func(d time.Duration, f func()) {
		if d != time.Second {
			t.Errorf("next line due after %v, want 1s", d)
		}
		due = append(due, f)
	}
	counts := func() []string {
		var out []string
		for _, e := range logs.TakeAll() {
			m := e.ContextMap()
			out = append(out, fmt.Sprintf("%v/%v acked %v of %v", m["reservations"], m["completions"], m["replicas_acked"], m["replicas_wanted"]))
		}
		return out
	}
	l.Add("reserve", 0)
	l.Add("reserve", 0)
	l.Add("complete", 1)
	l.Add("reserve", 0)
	if got := counts(); !slices.Equal(got, []string{"1/0 acked 0 of 1"}) {
		t.Fatalf("lines at once %q, want the first only", got)
	}
	due[0]()
	if got := counts(); !slices.Equal(got, []string{"2/1 acked 0 of 1"}) {
		t.Fatalf("lines a second later %q, want the held ones counted", got)
	}
	due[1]()
	if got := counts(); len(got) != 0 || len(due) != 2 {
		t.Fatalf("a quiet second wrote %q and scheduled %d", got, len(due))
	}
	l.Add("complete", 0)
	if got := counts(); !slices.Equal(got, []string{"0/1 acked 0 of 1"}) {
		t.Fatalf("after a quiet second %q, want a line at once", got)
	}
}

package redis_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage/redis"
)

// TestClientKinds checks how ClientOptions map onto go-redis: the client
// kind, TLS, credentials and timeouts.
func TestClientKinds(t *testing.T) {
	single := func(t *testing.T, c goredis.UniversalClient) *goredis.Options {
		t.Helper()
		cl, ok := c.(*goredis.Client)
		if !ok {
			t.Fatalf("client %T, want *redis.Client", c)
		}
		return cl.Options()
	}
	build := func(t *testing.T, o redis.ClientOptions) goredis.UniversalClient {
		t.Helper()
		c, err := redis.NewClient(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	t.Run("default", func(t *testing.T) {
		o := single(t, build(t, redis.ClientOptions{}))
		if o.Addr != "127.0.0.1:6379" || o.DB != 0 || o.TLSConfig != nil {
			t.Errorf("options %+v", o)
		}
		if o.ReadTimeout != redis.DefaultTimeout || o.WriteTimeout != redis.DefaultTimeout || o.DialTimeout != redis.DefaultDialTimeout || !o.ContextTimeoutEnabled {
			t.Errorf("timeouts read %v write %v dial %v context %v", o.ReadTimeout, o.WriteTimeout, o.DialTimeout, o.ContextTimeoutEnabled)
		}
	})
	t.Run("rediss url", func(t *testing.T) {
		o := single(t, build(t, redis.ClientOptions{URL: "rediss://cache.example:6380/2", Username: "u", Password: "p", PoolSize: 3, Timeout: 5 * time.Second}))
		if o.Addr != "cache.example:6380" || o.DB != 2 || o.Username != "u" || o.Password != "p" || o.PoolSize != 3 {
			t.Errorf("options %+v", o)
		}
		if o.TLSConfig == nil || o.TLSConfig.ServerName != "cache.example" {
			t.Errorf("TLS %+v, want verification of cache.example", o.TLSConfig)
		}
		if o.ReadTimeout != 5*time.Second {
			t.Errorf("read timeout %v", o.ReadTimeout)
		}
	})
	t.Run("url credentials", func(t *testing.T) {
		o := single(t, build(t, redis.ClientOptions{URL: "redis://u:p@cache?dial_timeout=3s"}))
		if o.Username != "u" || o.Password != "p" || o.DialTimeout != 3*time.Second {
			t.Errorf("user %q password %q dial %v", o.Username, o.Password, o.DialTimeout)
		}
	})
	t.Run("a bare host:port url", func(t *testing.T) {
		o := single(t, build(t, redis.ClientOptions{URL: "cache:6380"}))
		if o.Addr != "cache:6380" || o.TLSConfig != nil {
			t.Errorf("options %+v", o)
		}
	})
	t.Run("TLS files with a redis url", func(t *testing.T) {
		o := single(t, build(t, redis.ClientOptions{URL: "redis://10.0.0.7:6379", TLSServerName: "cache.example"}))
		if o.TLSConfig == nil || o.TLSConfig.ServerName != "cache.example" {
			t.Errorf("TLS %+v, want TLS checking cache.example", o.TLSConfig)
		}
	})
	t.Run("one address", func(t *testing.T) {
		o := single(t, build(t, redis.ClientOptions{Addrs: []string{"cache:6379"}}))
		if o.Addr != "cache:6379" {
			t.Errorf("addr %q", o.Addr)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		c := build(t, redis.ClientOptions{Addrs: []string{"rediss://n1:7000", "rediss://n2:7000"}, Password: "p"})
		cc, ok := c.(*goredis.ClusterClient)
		if !ok {
			t.Fatalf("client %T, want *redis.ClusterClient", c)
		}
		o := cc.Options()
		if !reflect.DeepEqual(o.Addrs, []string{"n1:7000", "n2:7000"}) || o.Password != "p" {
			t.Errorf("options %+v", o)
		}
		if o.TLSConfig == nil || o.TLSConfig.ServerName != "" {
			t.Errorf("TLS %+v, want per-node verification (no fixed ServerName)", o.TLSConfig)
		}
	})
	t.Run("cluster from one entry", func(t *testing.T) {
		c := build(t, redis.ClientOptions{Addrs: []string{"n1:7000, n2:7000 n3:7000"}})
		if got := c.(*goredis.ClusterClient).Options().Addrs; !reflect.DeepEqual(got, []string{"n1:7000", "n2:7000", "n3:7000"}) {
			t.Errorf("addrs %q", got)
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		// A Sentinel-backed failover client is a *redis.Client.
		single(t, build(t, redis.ClientOptions{Addrs: []string{"s1:26379", "s2:26379"}, MasterName: "m"}))
	})
}

// TestRenewClientKinds: the renewal client reaches the deployment the
// store's client does, with the same credentials and TLS, on a pool of
// its own of four connections per node whatever pool_size says, and with
// no socket timeout of its own (0 once go-redis has read the -1 it is
// given): a batch's deadline is its socket's.
func TestRenewClientKinds(t *testing.T) {
	build := func(t *testing.T, o redis.ClientOptions) goredis.UniversalClient {
		t.Helper()
		c, err := redis.NewRenewClient(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	t.Run("single node", func(t *testing.T) {
		o := build(t, redis.ClientOptions{URL: "rediss://cache.example:6380/2", Username: "u", Password: "p", PoolSize: 50, Timeout: 5 * time.Second}).(*goredis.Client).Options()
		if o.Addr != "cache.example:6380" || o.DB != 2 || o.Username != "u" || o.Password != "p" || o.TLSConfig == nil || o.TLSConfig.ServerName != "cache.example" {
			t.Errorf("options %+v", o)
		}
		if o.PoolSize != 4 || o.ReadTimeout != 0 || o.WriteTimeout != 0 || !o.ContextTimeoutEnabled {
			t.Errorf("pool %d, timeouts read %v write %v, context %v; want 4, none, none, true", o.PoolSize, o.ReadTimeout, o.WriteTimeout, o.ContextTimeoutEnabled)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		c, ok := build(t, redis.ClientOptions{Addrs: []string{"n1:7000", "n2:7000"}, Password: "p"}).(*goredis.ClusterClient)
		if !ok {
			t.Fatalf("client %T, want *redis.ClusterClient", c)
		}
		o := c.Options()
		if !reflect.DeepEqual(o.Addrs, []string{"n1:7000", "n2:7000"}) || o.Password != "p" || o.PoolSize != 4 || o.ReadTimeout != 0 || !o.ContextTimeoutEnabled {
			t.Errorf("options %+v", o)
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		o := build(t, redis.ClientOptions{Addrs: []string{"s1:26379"}, MasterName: "m"}).(*goredis.Client).Options()
		if o.PoolSize != 4 || o.ReadTimeout != 0 {
			t.Errorf("pool %d, read timeout %v", o.PoolSize, o.ReadTimeout)
		}
	})
	t.Run("checked as the store's client is", func(t *testing.T) {
		if _, err := redis.NewRenewClient(redis.ClientOptions{MasterName: "m"}); err == nil {
			t.Error("options Check refuses were taken")
		}
	})
}

func TestWhereNamesNoCredentials(t *testing.T) {
	for o, want := range map[*redis.ClientOptions]string{
		{URL: "redis://user:s3cret@cache:6380/2?dial_timeout=3s"}: "redis://cache:6380/2",
		{}:                                       "redis://127.0.0.1:6379/0",
		{URL: "cache:6379", TLSCAFile: "ca.pem"}: "rediss://cache:6379",
		{Addrs: []string{"n1:7000", "n2:7000"}, Password: "s3cret"}:                         "redis://n1:7000,n2:7000 (Cluster)",
		{Addrs: []string{"rediss://s1:26379"}, MasterName: "m", SentinelPassword: "s3cret"}: `rediss://s1:26379 (Sentinel, primary "m")`,
	} {
		if got := o.Where(); got != want {
			t.Errorf("Where(%+v) = %q, want %q", *o, got, want)
		}
	}
}

func TestClientOptionsCheck(t *testing.T) {
	for _, tt := range []struct {
		o    redis.ClientOptions
		want string
	}{
		{redis.ClientOptions{URL: "cache.internal"}, "url must start with a scheme"},
		{redis.ClientOptions{TLSCertFile: "c.pem"}, "tls_cert_file and tls_key_file go together"},
		{redis.ClientOptions{URL: "https://cache"}, "invalid url"},
		{redis.ClientOptions{URL: "redis://:p@cache", Password: "q"}, "password is set both"},
		{redis.ClientOptions{Addrs: []string{"redis://a:1", "rediss://b:1"}}, "mix TLS"},
		{redis.ClientOptions{Addrs: []string{"nope"}}, "must be host:port"},
		{redis.ClientOptions{Addrs: []string{"redis://u:p@a:1"}}, "without credentials"},
		{redis.ClientOptions{MasterName: "m"}, "needs addresses"},
		{redis.ClientOptions{Timeout: 2}, "timeout must be at least 10ms, got 2ns"},
		{redis.ClientOptions{Timeout: -time.Second}, "timeout must be at least 10ms, got -1s"},
		{redis.ClientOptions{Timeout: 1<<63 - 1}, "timeout must be at most 1m0s"},
		{redis.ClientOptions{DialTimeout: time.Millisecond}, "dial_timeout must be at least 10ms, got 1ms"},
		{redis.ClientOptions{DialTimeout: 60000 * 24 * time.Hour}, "dial_timeout must be at most 1m0s"},
	} {
		err := tt.o.Check()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Check(%+v) = %v, want an error mentioning %q", tt.o, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), ":p@") {
			t.Errorf("error %q quotes a password", err)
		}
	}
}

// TestBuildingAClientLooksNothingUp: a client is built without touching
// the network, not even a name lookup (go-redis's maintenance
// notifications would look the host up at once): Caddy starts whatever
// the resolver does.
func TestBuildingAClientLooksNothingUp(t *testing.T) {
	before := len(testutil.LookedUp())
	for _, o := range []redis.ClientOptions{
		{URL: "rediss://cache.example:6380/2"},
		{Addrs: []string{"node1.example:6379", "node2.example:6379"}},
		{Addrs: []string{"sentinel.example:26379"}, MasterName: "main"},
	} {
		for _, build := range []func(redis.ClientOptions) (goredis.UniversalClient, error){redis.NewClient, redis.NewRenewClient} {
			c, err := build(o)
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
		}
	}
	if got := testutil.LookedUp(); len(got) > before {
		t.Fatalf("building clients looked up %q", got[before:])
	}
}

// A misspelt url or address never quotes its password (issue 28): go-redis
// and net/url quote parts of what they cannot read.
func TestCheckNeverQuotesAPassword(t *testing.T) {
	const pw = "s3cr3t-pw"
	for _, o := range []redis.ClientOptions{
		{URL: "redis//:" + pw + "@127.0.0.1:6379"},
		{URL: "rediss:/:" + pw + "@127.0.0.1:6379"},
		{URL: "redis:" + pw + "@127.0.0.1:6379"},
		{URL: "redis://:" + pw + "@127.0.0.1:6379/0/" + pw},
		{URL: "redis://:" + pw + "@127.0.0.1:6379/" + pw},
		{URL: "redis://:" + pw + "@127.0.0.1:6379/0?dial_timeout=" + pw},
		{URL: "redis://:" + pw + "@127.0.0.1:port"},
		{URL: "redi://:" + pw + "@127.0.0.1:6379"},
		{URL: "redis://:" + pw + "@127.0.0.1:6379", Password: pw},
		{Addrs: []string{"127.0.0.1:26379", "redis://:" + pw + "@127.0.0.1:26380"}, MasterName: "m"},
		{Addrs: []string{"redis://x:" + pw + "@127.0.0.1:26380/0"}, MasterName: "m"},
	} {
		err := o.Check()
		if err == nil {
			if _, err = redis.NewClient(o); err == nil {
				t.Errorf("%+v: accepted", o)
				continue
			}
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("%+v: %v", o, err)
		}
	}
}

// A password whose '/', '?' or '#' is not percent-encoded (a base64
// password's '/') ends the URL's authority where net/url reads it: the
// port or the path it then quotes is a part of the password, and no part
// may reach the error.
func TestCheckNeverQuotesAPartOfAPassword(t *testing.T) {
	for _, u := range []string{
		"redis://:Zq7/leak-pw@127.0.0.1:6379",
		"redis://:Zq7?leak-pw@127.0.0.1:6379",
		"redis://:Zq7#leak-pw@127.0.0.1:6379",
		"rediss://app:Zq7/leak-pw@127.0.0.1:6379/0",
		"redis://app:1234/leak-pw@127.0.0.1:6379",
	} {
		err := redis.ClientOptions{URL: u}.Check()
		if err == nil {
			t.Errorf("%s: accepted", u)
			continue
		}
		for _, part := range []string{"Zq7", "leak-pw"} {
			if strings.Contains(err.Error(), part) {
				t.Errorf("%s: the error quotes %q: %v", u, part, err)
			}
		}
	}
}

// A '%' in a password that is not followed by two hexadecimal digits is
// an escape error, which net/url reports quoting the '%' and what follows
// it: a part of the password (issue 39).
func TestAnEscapeErrorQuotesNoPartOfThePassword(t *testing.T) {
	for _, u := range []string{
		"redis://:ab%zzsecret@127.0.0.1:6379/0",
		"redis://app:ab%zsecret@127.0.0.1:6379/0",
		"rediss://app:ab%@127.0.0.1:6379/0",
		"redis://:ab%g1secret@127.0.0.1:6379/0?pool_size=2",
	} {
		err := redis.ClientOptions{URL: u}.Check()
		if err == nil {
			t.Errorf("%s: accepted", u)
			continue
		}
		for _, part := range []string{"%z", "%g", "ab", "secret", "%@"} {
			if strings.Contains(err.Error(), part) {
				t.Errorf("%s: the error quotes %q: %v", u, part, err)
			}
		}
		if !strings.Contains(err.Error(), "'%' is not followed by two hexadecimal digits") {
			t.Errorf("%s: %v, want the reason", u, err)
		}
	}
}

// Every go-redis URL parameter that is a size or a duration is checked
// before a client is built, and the refusal names it: go-redis accepts
// any int, and panics on a negative pool size (makechan), fills a
// semaphore of pool_size tokens (2147483647: start-up held for minutes),
// and reads a duration of zero or less as none, which for a dial is a
// deadline in the past (every request 503s).
func TestURLParametersAreCheckedAndNamed(t *testing.T) {
	for _, tt := range []struct {
		query string
		names string // "" when accepted
	}{
		{"pool_size=-5", "pool_size"},
		{"pool_size=2147483647", "pool_size"},
		{"pool_size=2147483648", "pool_size"},
		{"pool_size=10001", "pool_size"},
		{"pool_size=10000", ""},
		{"pool_size=0", ""},
		{"min_idle_conns=-1", "min_idle_conns"},
		{"min_idle_conns=5&pool_size=2", "min_idle_conns"},
		{"min_idle_conns=2&pool_size=2", ""},
		{"max_idle_conns=-1", "max_idle_conns"},
		{"max_active_conns=99999", "max_active_conns"},
		{"max_concurrent_dials=-1", "max_concurrent_dials"},
		{"pipeline_pool_size=-1", ""},
		{"pipeline_pool_size=-2", "pipeline_pool_size"},
		{"pipeline_read_buffer_size=2147483647", "pipeline_read_buffer_size"},
		{"pipeline_write_buffer_size=-1", "pipeline_write_buffer_size"},
		{"max_retries=-1", ""},
		{"max_retries=-5", "max_retries"},
		{"max_retries=101", "max_retries"},
		{"db=-1", "db"},
		{"db=x", "db"},
		{"protocol=4", "protocol"},
		{"protocol=2", ""},
		{"dial_timeout=-1s", "dial_timeout"},
		{"dial_timeout=0", "dial_timeout"},
		{"dial_timeout=1ns", "dial_timeout"},
		{"dial_timeout=2m", "dial_timeout"},
		{"dial_timeout=9999999999999", "dial_timeout"},
		{"dial_timeout=3", ""},
		{"pool_timeout=-1", "pool_timeout"},
		{"read_timeout=1s", "read_timeout"},
		{"write_timeout=1s", "write_timeout"},
		{"conn_max_idle_time=-1", ""},
		{"conn_max_idle_time=1ns", "conn_max_idle_time"},
		{"conn_max_lifetime=0", ""},
		{"conn_max_lifetime=99999999999999999", "conn_max_lifetime"},
		{"max_retry_backoff=2m", "max_retry_backoff"},
		{"min_retry_backoff=-1", ""},
		{"client_name=a%20b", "client_name"},
		{"client_name=caddy", ""},
		{"pool_fifo=maybe", "pool_fifo"},
		{"no_such_parameter=1", "no_such_parameter"},
	} {
		err := redis.ClientOptions{URL: "redis://127.0.0.1:6379/0?" + tt.query}.Check()
		switch {
		case tt.names == "" && err != nil:
			t.Errorf("%s: %v, want it accepted", tt.query, err)
		case tt.names != "" && err == nil:
			t.Errorf("%s: accepted, want it refused naming %s", tt.query, tt.names)
		case err != nil && !strings.Contains(err.Error(), tt.names):
			t.Errorf("%s: %v, want it to name %s", tt.query, err, tt.names)
		}
	}
	// The option too.
	for _, size := range []int{-5, 10001, 2147483647} {
		if err := (redis.ClientOptions{PoolSize: size}).Check(); err == nil || !strings.Contains(err.Error(), "pool_size") {
			t.Errorf("pool_size %d: %v, want it refused naming pool_size", size, err)
		}
	}
}

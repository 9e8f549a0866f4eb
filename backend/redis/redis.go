package redis

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/backend/cfargs"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/cache"
	redisstore "github.com/caddy-idempotency/caddy-idempotency/storage/redis"
)

// name is the backend's name: storage redis.
const name backend.Name = "redis"

func init() {
	caddy.RegisterModule(Storage{})
}

// redisLogOnce installs redisLogger when the first Redis backend is
// provisioned.
var redisLogOnce sync.Once

// redisLogger forwards go-redis's internal messages (pool and pub/sub
// trouble, which it would print to stderr on its own) to Caddy's logger at
// debug level: the store's callers already report what a failure means for
// the request. go-redis has one logger per process, so this is installed
// only once a Redis backend is in use.
type redisLogger struct{}

func (redisLogger) Printf(_ context.Context, format string, v ...any) {
	if c := caddy.Log().Named("idempotency.redis").Check(zapcore.DebugLevel, fmt.Sprintf(format, v...)); c != nil {
		c.Write()
	}
}

// Storage keeps idempotency records in Redis, shared by every Caddy
// instance that points at it: a single node (url), a Redis Cluster
// (several addresses) or a Sentinel-managed primary (master_name and the
// Sentinel addresses). A new key costs two round trips and a replay one;
// the leases of running requests are renewed together, one round trip
// per Redis node and tick, on a few connections of their own.
//
// Handlers with the same Redis configuration share one client and its
// connection pool, kept across config reloads. Caddy starts and reloads
// while Redis is down: requests then follow the handler's
// on_storage_error until it is back.
//
// url, addresses and the user names and passwords accept placeholders such as
// {env.REDIS_PASSWORD} or {file./run/secrets/redis}, resolved once at
// provisioning; the resolved values never appear in the config.
type Storage struct {
	// The Redis server as a URL: redis://[user:password@]host[:port][/db],
	// rediss:// for TLS, or unix:///path/to/socket. Query parameters
	// configure the go-redis client (for example protocol=2 or
	// skip_verify=true); each size and duration is checked against what
	// go-redis and the module accept (docs/storage-redis.md). Default: redis://127.0.0.1:6379/0 when addresses
	// is not set either. Not together with addresses.
	URL string `json:"url,omitempty"`

	// Nodes as host:port, or as redis://host:port or rediss://host:port
	// (TLS; all alike). Several addresses mean a Redis Cluster (these seed
	// it; the rest of the cluster is discovered), or the Sentinels when
	// master_name is set. A single address is a single node. An entry may
	// hold several addresses separated by commas or spaces (handy with one
	// {env.*} placeholder). Not together with url.
	Addresses []string `json:"addresses,omitempty"`

	// The name of the primary that the Sentinels at addresses monitor.
	// The client asks the Sentinels for the current primary and follows
	// failovers.
	MasterName string `json:"master_name,omitempty"`

	// The ACL user name for the Sentinels themselves, when they require
	// one (username and password are the data nodes'). Needs master_name.
	SentinelUsername string `json:"sentinel_username,omitempty"`

	// The password for the Sentinels themselves, when they set
	// requirepass (password is the data nodes'). Needs master_name. Use a
	// placeholder such as {env.REDIS_SENTINEL_PASSWORD}.
	SentinelPassword string `json:"sentinel_password,omitempty"`

	// The ACL user name (Redis 6 and later). Not together with a user in url.
	Username string `json:"username,omitempty"`

	// The password (of username, or the requirepass one). Not together
	// with a password in url. Use a placeholder such as
	// {env.REDIS_PASSWORD} to keep it out of the config.
	Password string `json:"password,omitempty"`

	// Starts the name of every key and pub/sub channel this storage uses.
	// Handlers with different prefixes never see each other's records.
	// Must not contain '{' or '}': on Redis Cluster that would be a hash
	// tag putting every record in one slot. Default: "idempotency:".
	KeyPrefix string `json:"key_prefix,omitempty"`

	// The most connections per Redis node, 1 to 10000. Default:
	// go-redis's, ten per CPU. Lease renewals have a few connections per
	// node of their own besides.
	PoolSize int `json:"pool_size,omitempty"`

	// How long opening one connection may take. Default: 1s; 10ms to 1m.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`

	// How long one store operation may take, connecting and retries
	// included, before the request gets the on_storage_error treatment.
	// Also the read and write timeout of each command. Default: 2s; 10ms
	// to 1m.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// Keep completed records in this process too, so that replays skip
	// Redis. Off by default.
	ReplayCache *backend.ReplayCache `json:"replay_cache,omitempty"`

	// A PEM file of the CA certificates that the server's certificate is
	// checked against, instead of the system's (a private CA). Setting
	// any tls_* option turns TLS on, also with a redis:// url.
	TLSCAFile string `json:"tls_ca_file,omitempty"`

	// A PEM client certificate, for servers that require one
	// (tls-auth-clients). Needs tls_key_file.
	TLSCertFile string `json:"tls_cert_file,omitempty"`

	// The PEM private key of tls_cert_file.
	TLSKeyFile string `json:"tls_key_file,omitempty"`

	// The name the server's certificate must carry, when it is not the
	// host dialled (an address by IP, a tunnel).
	TLSServerName string `json:"tls_server_name,omitempty"`

	// Wait until this many replicas acknowledged each reservation and
	// completion, so that a failover keeps them (see Durability). Off by
	// default: Redis replicates asynchronously.
	Durability *Durability `json:"durability,omitempty"`

	backend.Pooled
}

// CaddyModule returns the Caddy module information.
func (Storage) CaddyModule() caddy.ModuleInfo {
	return name.ModuleInfo(func() caddy.Module { return new(Storage) })
}

// Provision compiles the configuration, resolves its placeholders and
// takes the shared store for the result. It does not contact Redis, so
// that an outage does not fail a config load or reload.
func (r *Storage) Provision(ctx caddy.Context) error {
	redisLogOnce.Do(func() { goredis.SetLogger(redisLogger{}) })
	cfg, err := r.compile()
	if err != nil {
		return err
	}
	if cfg, err = cfg.resolve(); err != nil {
		return err
	}
	id, err := backend.StoreID(name, cfg)
	if err != nil {
		return err
	}
	logger := ctx.Logger()
	return r.Acquire(logger, name, cfg, cfg.where(), func() (storage.Store, error) {
		client, err := redisstore.NewClient(cfg.Client)
		if err != nil {
			return nil, err
		}
		// Lease renewals go on connections of their own, so that they
		// never wait behind reservations and completions.
		renew, err := redisstore.NewRenewClient(cfg.Client)
		if err != nil {
			client.Close()
			return nil, err
		}
		store := redisstore.New(client, redisstore.Options{
			KeyPrefix:   cfg.KeyPrefix,
			Timeout:     cmp.Or(cfg.Client.Timeout, redisstore.DefaultTimeout),
			RenewClient: renew,
			Secrets:     cfg.Client.Secrets(),
			Durability:  cfg.Durability.store(logger, id),
		})
		return backend.Wrap(store, cfg.Cache), nil
	})
}

// Validate reports configuration errors: none once provisioned (Provision
// compiles the configuration first), else the compile error.
func (r *Storage) Validate() error {
	return backend.Validate(r, r.compile)
}

// redisConfig is what the store is built from and, hashed once its
// placeholders are resolved, what names it in the pool.
type redisConfig struct {
	Client     redisstore.ClientOptions
	KeyPrefix  string
	Cache      *cache.Options
	Durability durabilityConfig
}

// compile checks r and returns its configuration, defaults filled in and
// placeholders as written (resolve resolves them). It is pure; an error
// names its options (opterr). A url or an address that holds a
// placeholder is checked by resolve, once resolved.
func (r *Storage) compile() (redisConfig, error) {
	cfg := redisConfig{
		Client: redisstore.ClientOptions{
			URL:              r.URL,
			Addrs:            r.Addresses,
			MasterName:       r.MasterName,
			Username:         r.Username,
			Password:         r.Password,
			SentinelUsername: r.SentinelUsername,
			SentinelPassword: r.SentinelPassword,
			PoolSize:         r.PoolSize,
			DialTimeout:      time.Duration(r.DialTimeout),
			Timeout:          time.Duration(r.Timeout),
			TLSCAFile:        r.TLSCAFile,
			TLSCertFile:      r.TLSCertFile,
			TLSKeyFile:       r.TLSKeyFile,
			TLSServerName:    r.TLSServerName,
		},
		KeyPrefix: cmp.Or(r.KeyPrefix, redisstore.DefaultKeyPrefix),
		Cache:     r.ReplayCache.Options(),
	}
	o := cfg.Client
	if strings.Contains(o.URL, "{") {
		o.URL = "redis://placeholder"
	}
	o.Addrs = slices.Clone(o.Addrs)
	for i, a := range o.Addrs {
		if strings.Contains(a, "{") {
			o.Addrs[i] = "placeholder:6379"
		}
	}
	if err := o.Check(); err != nil {
		return redisConfig{}, err
	}
	if r.Durability != nil {
		switch r.Durability.OnTimeout {
		case "", onTimeoutFail, onTimeoutProceed:
		default:
			return redisConfig{}, name.OptionErrorf("durability", "durability on_timeout must be %q or %q, got %q", onTimeoutFail, onTimeoutProceed, r.Durability.OnTimeout)
		}
		if r.Durability.Replicas < 1 {
			return redisConfig{}, name.OptionErrorf("durability", "durability replicas must be at least 1, got %d", r.Durability.Replicas)
		}
		cfg.Durability = durabilityConfig{
			Replicas: r.Durability.Replicas,
			Timeout:  cmp.Or(time.Duration(r.Durability.Timeout), redisstore.DefaultDurabilityTimeout),
			Proceed:  r.Durability.OnTimeout == onTimeoutProceed,
		}
	}
	if err := (redisstore.Options{
		KeyPrefix:  r.KeyPrefix,
		Timeout:    cmp.Or(time.Duration(r.Timeout), redisstore.DefaultTimeout),
		Durability: redisstore.Durability{Replicas: cfg.Durability.Replicas, Timeout: cfg.Durability.Timeout},
	}).Check(); err != nil {
		return redisConfig{}, err
	}
	if err := r.ReplayCache.Check(name); err != nil {
		return redisConfig{}, err
	}
	if cfg.Client.URL == "" && len(cfg.Client.Addrs) == 0 {
		cfg.Client.URL = redisstore.DefaultURL
	}
	return cfg, nil
}

// where is the store's address as the start-up log lines show it: the
// server, without credentials, and the key prefix, which tells two stores
// on one server apart.
func (cfg redisConfig) where() string {
	prefix := cfg.KeyPrefix
	if prefix == "" || strings.ContainsAny(prefix, " \t\"") {
		prefix = strconv.Quote(prefix)
	}
	return cfg.Client.Where() + " key_prefix " + prefix
}

// resolve returns cfg with its placeholders resolved, checked again.
// ReplaceKnown rather than ReplaceAll: a brace in a literal password that
// is not a placeholder stays as written. Errors never quote url, user
// names or passwords, which may hold secrets.
func (cfg redisConfig) resolve() (redisConfig, error) {
	repl := caddy.NewReplacer()
	resolve := func(s *string) { *s = repl.ReplaceKnown(*s, "") }
	o := &cfg.Client
	url := o.URL
	for _, s := range []*string{&o.URL, &o.MasterName, &o.Username, &o.Password, &o.SentinelUsername, &o.SentinelPassword,
		&o.TLSCAFile, &o.TLSCertFile, &o.TLSKeyFile, &o.TLSServerName} {
		resolve(s)
	}
	o.Addrs = slices.Clone(o.Addrs)
	for i := range o.Addrs {
		resolve(&o.Addrs[i])
	}
	if url != "" && o.URL == "" {
		return redisConfig{}, name.Errorf("url is empty once its placeholders are replaced")
	}
	return cfg, o.Check()
}

// UnmarshalCaddyfile parses
//
//	storage redis [<url>] {
//	    url <redis://...|rediss://...|unix://...>
//	    addresses <host:port...>
//	    master_name <name>
//	    sentinel_username <user>
//	    sentinel_password <password>
//	    username <user>
//	    password <password>
//	    key_prefix <prefix>
//	    pool_size <n>
//	    dial_timeout <duration>
//	    timeout <duration>
//	    replay_cache <max_entries> [<ttl>]
//	    tls_ca_file <path>
//	    tls_cert_file <path>
//	    tls_key_file <path>
//	    tls_server_name <name>
//	    durability replicas <n> [<timeout>] [on_timeout fail|proceed]
//	}
func (r *Storage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume the backend name
	given := make(cfargs.Given)
	if d.NextArg() {
		r.URL = d.Val()
		given.Add(d, "url")
		if err := cfargs.NoArgs(d); err != nil {
			return err
		}
	}
	return backend.UnmarshalBlock(d, name, given, func(opt string) error {
		var err error
		switch opt {
		case "url":
			return cfargs.StringArg(d, &r.URL)
		case "addresses":
			return cfargs.ArgsList(d, &r.Addresses)
		case "master_name":
			return cfargs.StringArg(d, &r.MasterName)
		case "sentinel_username":
			return cfargs.StringArg(d, &r.SentinelUsername)
		case "sentinel_password":
			return cfargs.StringArg(d, &r.SentinelPassword)
		case "username":
			return cfargs.StringArg(d, &r.Username)
		case "password":
			return cfargs.StringArg(d, &r.Password)
		case "key_prefix":
			return cfargs.StringArg(d, &r.KeyPrefix)
		case "pool_size":
			return cfargs.IntArg(d, &r.PoolSize)
		case "dial_timeout":
			return cfargs.DurationArg(d, &r.DialTimeout)
		case "timeout":
			return cfargs.DurationArg(d, &r.Timeout)
		case "replay_cache":
			r.ReplayCache, err = backend.ParseReplayCache(d)
			return err
		case "tls_ca_file":
			return cfargs.StringArg(d, &r.TLSCAFile)
		case "tls_cert_file":
			return cfargs.StringArg(d, &r.TLSCertFile)
		case "tls_key_file":
			return cfargs.StringArg(d, &r.TLSKeyFile)
		case "tls_server_name":
			return cfargs.StringArg(d, &r.TLSServerName)
		case "durability":
			r.Durability, err = parseDurability(d)
			return err
		}
		return name.Unknown(d, opt, options)
	}, r.compile)
}

// options are the options of the storage redis block.
var options = []string{
	"url", "addresses", "master_name", "sentinel_username", "sentinel_password", "username", "password",
	"key_prefix", "pool_size", "dial_timeout", "timeout", "replay_cache",
	"tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name", "durability",
}

// Interface guards
var (
	_ caddy.Provisioner     = (*Storage)(nil)
	_ caddy.Validator       = (*Storage)(nil)
	_ caddyfile.Unmarshaler = (*Storage)(nil)
	_ backend.Backend       = (*Storage)(nil)
)

// UnmarshalJSON decodes the storage's JSON config as Caddy would, but
// that an error names the option whose value does not decode
// (backend.DecodeJSON).
func (s *Storage) UnmarshalJSON(b []byte) error {
	type fields Storage
	return backend.DecodeJSON(b, (*fields)(s))
}

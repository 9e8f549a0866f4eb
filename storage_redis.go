package idempotency

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"
	"unicode"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/cache"
	redisstore "github.com/caddy-idempotency/caddy-idempotency/storage/redis"
)

func init() {
	caddy.RegisterModule(RedisStorage{})
	// go-redis logs pool and pub/sub trouble to stderr on its own; send it
	// to Caddy's log instead, at debug level: the store's callers already
	// report what a failure means for the request.
	goredis.SetLogger(redisLogger{})
}

// redisLogger forwards go-redis's internal messages to Caddy's logger.
type redisLogger struct{}

func (redisLogger) Printf(_ context.Context, format string, v ...any) {
	if c := caddy.Log().Named("idempotency.redis").Check(zapcore.DebugLevel, fmt.Sprintf(format, v...)); c != nil {
		c.Write()
	}
}

// Defaults of the Redis storage.
const (
	defaultRedisURL         = "redis://127.0.0.1:6379/0"
	defaultRedisTimeout     = 2 * time.Second
	defaultRedisDialTimeout = time.Second
)

// RedisStorage keeps idempotency records in Redis, shared by every Caddy
// instance that points at it: a single node (url), a Redis Cluster
// (several addresses) or a Sentinel-managed primary (master_name and the
// Sentinel addresses). A new key costs two round trips and a replay one.
//
// Handlers with the same Redis configuration share one client and its
// connection pool, kept across config reloads. Caddy starts and reloads
// while Redis is down: requests then follow the handler's
// on_storage_error until it is back.
//
// url, addresses and the user names and passwords accept placeholders such as
// {env.REDIS_PASSWORD} or {file./run/secrets/redis}, resolved once at
// provisioning; the resolved values never appear in the config.
type RedisStorage struct {
	// The Redis server as a URL: redis://[user:password@]host[:port][/db],
	// rediss:// for TLS, or unix:///path/to/socket. Query parameters
	// configure the go-redis client (for example protocol=2 or
	// skip_verify=true). Default: redis://127.0.0.1:6379/0 when addresses
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
	// Default: "idempotency:".
	KeyPrefix string `json:"key_prefix,omitempty"`

	// The most connections per Redis node. Default: go-redis's, ten per
	// CPU.
	PoolSize int `json:"pool_size,omitempty"`

	// How long opening one connection may take. Default: 1s.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`

	// How long one store operation may take, connecting and retries
	// included, before the request gets the on_storage_error treatment.
	// Also the read and write timeout of each command. Default: 2s.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// Keep completed records in this process too, so that replays skip
	// Redis. Off by default.
	ReplayCache *ReplayCache `json:"replay_cache,omitempty"`

	store   storage.Store
	poolKey string
}

// CaddyModule returns the Caddy module information.
func (RedisStorage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.idempotency.storage.redis",
		New: func() caddy.Module { return new(RedisStorage) },
	}
}

// Provision resolves placeholders, checks the configuration and takes the
// shared store for it. It does not contact Redis, so that an outage does
// not fail a config load or reload.
func (r *RedisStorage) Provision(caddy.Context) error {
	cfg, err := r.resolve()
	if err != nil {
		return err
	}
	key, err := storeKey("redis", cfg)
	if err != nil {
		return err
	}
	store, err := acquireStore("redis", key, func() (storage.Store, error) {
		client, err := cfg.newClient()
		if err != nil {
			return nil, err
		}
		return wrapCache(redisstore.New(client, redisstore.Options{KeyPrefix: cfg.KeyPrefix, Timeout: cfg.timeout()}), cfg.Cache), nil
	})
	if err != nil {
		return err
	}
	r.store, r.poolKey = store, key
	return nil
}

// Store implements StorageBackend.
func (r *RedisStorage) Store() storage.Store { return r.store }

// Cleanup drops this handler's reference to the shared store; the last
// one closes the client.
func (r *RedisStorage) Cleanup() error {
	if r.poolKey == "" {
		return nil
	}
	key := r.poolKey
	r.poolKey, r.store = "", nil
	return releaseStore(key)
}

// redisConfig is a RedisStorage with placeholders resolved: what the
// client is built from and, hashed, what names it in the pool. Zero
// values mean "not set"; defaults apply when the client is built. Its
// fields are exported for json.Marshal only.
type redisConfig struct {
	URL        string
	Addrs      []string
	TLS        bool
	MasterName string
	Username   string
	Password   string
	// The Sentinels' own credentials.
	SentinelUsername string
	SentinelPassword string
	KeyPrefix        string
	PoolSize         int
	DialTimeout      time.Duration
	Timeout          time.Duration
	Cache            *cache.Options
}

// resolve checks r and resolves its placeholders. Errors never quote url,
// username or password, which may hold secrets.
func (r *RedisStorage) resolve() (redisConfig, error) {
	switch {
	case r.URL != "" && len(r.Addresses) > 0:
		return redisConfig{}, errors.New("redis storage: url and addresses are mutually exclusive")
	case r.MasterName != "" && len(r.Addresses) == 0:
		return redisConfig{}, errors.New("redis storage: master_name needs addresses (the Sentinels)")
	case r.MasterName == "" && (r.SentinelUsername != "" || r.SentinelPassword != ""):
		return redisConfig{}, errors.New("redis storage: sentinel_username and sentinel_password need master_name")
	case r.ReplayCache.validate() != nil:
		return redisConfig{}, fmt.Errorf("redis storage: %w", r.ReplayCache.validate())
	case r.PoolSize < 0:
		return redisConfig{}, fmt.Errorf("redis storage: pool_size must be positive, got %d", r.PoolSize)
	case r.DialTimeout < 0:
		return redisConfig{}, fmt.Errorf("redis storage: dial_timeout must be positive, got %v", time.Duration(r.DialTimeout))
	case r.Timeout < 0:
		return redisConfig{}, fmt.Errorf("redis storage: timeout must be positive, got %v", time.Duration(r.Timeout))
	}
	// ReplaceKnown rather than ReplaceAll: a brace in a literal password
	// that is not a placeholder stays as written.
	repl := caddy.NewReplacer()
	cfg := redisConfig{
		URL:              repl.ReplaceKnown(r.URL, ""),
		MasterName:       repl.ReplaceKnown(r.MasterName, ""),
		Username:         repl.ReplaceKnown(r.Username, ""),
		Password:         repl.ReplaceKnown(r.Password, ""),
		SentinelUsername: repl.ReplaceKnown(r.SentinelUsername, ""),
		SentinelPassword: repl.ReplaceKnown(r.SentinelPassword, ""),
		KeyPrefix:        r.KeyPrefix,
		PoolSize:         r.PoolSize,
		DialTimeout:      time.Duration(r.DialTimeout),
		Timeout:          time.Duration(r.Timeout),
		Cache:            r.ReplayCache.config(),
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = redisstore.DefaultKeyPrefix
	}
	if len(r.Addresses) > 0 {
		var err error
		if cfg.Addrs, cfg.TLS, err = parseRedisAddresses(r.Addresses, repl); err != nil {
			return redisConfig{}, err
		}
	} else if cfg.URL == "" {
		if r.URL != "" {
			return redisConfig{}, errors.New("redis storage: url is empty once its placeholders are replaced")
		}
		cfg.URL = defaultRedisURL
	}
	if cfg.URL != "" {
		if err := checkRedisURL(cfg.URL, cfg.Username != "", cfg.Password != ""); err != nil {
			return redisConfig{}, err
		}
	}
	return cfg, nil
}

// checkRedisURL checks what goredis.ParseURL would say about u, and that
// the credentials are not given twice.
func checkRedisURL(u string, username, password bool) error {
	parsed, err := url.Parse(u)
	if err != nil {
		// url.Error quotes the whole URL, password included: keep only
		// the reason.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("redis storage: invalid url: %v", err)
	}
	if _, err := goredis.ParseURL(u); err != nil {
		return fmt.Errorf("redis storage: invalid url: %v", err)
	}
	if parsed.Scheme != "unix" && parsed.Hostname() == "" {
		return errors.New("redis storage: invalid url: no host")
	}
	if parsed.User != nil {
		if username && parsed.User.Username() != "" {
			return errors.New("redis storage: a user is set both in url and in username")
		}
		if _, has := parsed.User.Password(); has && password {
			return errors.New("redis storage: a password is set both in url and in password")
		}
	}
	return nil
}

// parseRedisAddresses resolves and checks addresses: host:port, or
// redis:// or rediss:// URLs of host and port only, all of one kind.
func parseRedisAddresses(entries []string, repl *caddy.Replacer) (addrs []string, useTLS bool, err error) {
	scheme := ""
	for _, entry := range entries {
		fields := strings.FieldsFunc(repl.ReplaceKnown(entry, ""), func(c rune) bool {
			return c == ',' || unicode.IsSpace(c)
		})
		if len(fields) == 0 {
			return nil, false, fmt.Errorf("redis storage: address %q is empty once its placeholders are replaced", entry)
		}
		for _, a := range fields {
			s, hostport := "", a
			if before, after, ok := strings.Cut(a, "://"); ok {
				u, err := url.Parse(a)
				if err != nil || (before != "redis" && before != "rediss") || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
					return nil, false, fmt.Errorf("redis storage: address %q must be host:port, redis://host:port or rediss://host:port", a)
				}
				s, hostport = before, strings.TrimSuffix(after, "/")
			}
			if scheme == "" {
				scheme = s
				if scheme == "" {
					scheme = "redis"
				}
			} else if (s == "rediss") != (scheme == "rediss") {
				return nil, false, errors.New("redis storage: addresses mix TLS (rediss://) and plain ones")
			}
			host, port, err := net.SplitHostPort(hostport)
			if err != nil || host == "" || port == "" {
				return nil, false, fmt.Errorf("redis storage: address %q must be host:port", a)
			}
			addrs = append(addrs, hostport)
		}
	}
	return addrs, scheme == "rediss", nil
}

// timeout is the per-operation bound, defaulted.
func (c redisConfig) timeout() time.Duration {
	if c.Timeout > 0 {
		return c.Timeout
	}
	return defaultRedisTimeout
}

// newClient builds the go-redis client. It connects lazily: building
// one never touches the network.
func (c redisConfig) newClient() (goredis.UniversalClient, error) {
	timeout := c.timeout()
	if c.URL != "" {
		opt, err := goredis.ParseURL(c.URL)
		if err != nil {
			return nil, fmt.Errorf("redis storage: invalid url: %v", err)
		}
		if c.Username != "" {
			opt.Username = c.Username
		}
		if c.Password != "" {
			opt.Password = c.Password
		}
		if c.PoolSize > 0 {
			opt.PoolSize = c.PoolSize
		}
		if c.DialTimeout > 0 || opt.DialTimeout == 0 {
			opt.DialTimeout = c.dialTimeout()
		}
		opt.ReadTimeout, opt.WriteTimeout = timeout, timeout
		opt.ContextTimeoutEnabled = true
		opt.DialerRetries = 1
		return goredis.NewClient(opt), nil
	}
	opt := &goredis.UniversalOptions{
		Addrs:            c.Addrs,
		MasterName:       c.MasterName,
		Username:         c.Username,
		Password:         c.Password,
		SentinelUsername: c.SentinelUsername,
		SentinelPassword: c.SentinelPassword,
		PoolSize:         c.PoolSize,
		DialTimeout:      c.dialTimeout(),
		ReadTimeout:      timeout,
		WriteTimeout:     timeout,
		// The store bounds each operation with a context deadline
		// (timeout); the client must honour it on the socket too.
		ContextTimeoutEnabled: true,
		// Each command is already retried (MaxRetries) on a fresh
		// connection; retrying every dial on top would multiply the time
		// a request waits while Redis is down.
		DialerRetries: 1,
	}
	if c.TLS {
		// No ServerName: each node's certificate is checked against the
		// host it is dialled as.
		opt.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return goredis.NewUniversalClient(opt), nil
}

func (c redisConfig) dialTimeout() time.Duration {
	if c.DialTimeout > 0 {
		return c.DialTimeout
	}
	return defaultRedisDialTimeout
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
//	}
func (r *RedisStorage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume the backend name
	seen := make(map[string]bool)
	if d.NextArg() {
		r.URL = d.Val()
		seen["url"] = true
		if err := checkCaddyfileURL(d, r.URL); err != nil {
			return err
		}
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	var masterErr, sentinelErr error
	err := eachOption(d, "redis storage ", seen, func(opt string) error {
		var err error
		switch opt {
		case "url":
			if seen["addresses"] {
				return d.Err("redis storage url and addresses are mutually exclusive")
			}
			if err = stringArg(d, &r.URL); err == nil {
				err = checkCaddyfileURL(d, r.URL)
			}
		case "addresses":
			if seen["url"] {
				return d.Err("redis storage url and addresses are mutually exclusive")
			}
			if r.Addresses = d.RemainingArgs(); len(r.Addresses) == 0 {
				return d.ArgErr()
			}
			if !strings.Contains(strings.Join(r.Addresses, " "), "{") {
				if _, _, err := parseRedisAddresses(r.Addresses, caddy.NewReplacer()); err != nil {
					return d.Err(err.Error())
				}
			}
		case "master_name":
			err = stringArg(d, &r.MasterName)
			masterErr = d.Err("redis storage master_name needs addresses (the Sentinels)")
		case "sentinel_username":
			err = stringArg(d, &r.SentinelUsername)
			sentinelErr = d.Errf("redis storage %s needs master_name", opt)
		case "sentinel_password":
			err = stringArg(d, &r.SentinelPassword)
			sentinelErr = d.Errf("redis storage %s needs master_name", opt)
		case "username":
			err = stringArg(d, &r.Username)
		case "password":
			err = stringArg(d, &r.Password)
		case "key_prefix":
			err = stringArg(d, &r.KeyPrefix)
		case "pool_size":
			r.PoolSize, err = intArg(d)
		case "dial_timeout":
			err = durationArg(d, &r.DialTimeout)
		case "timeout":
			err = durationArg(d, &r.Timeout)
		case "replay_cache":
			r.ReplayCache, err = parseReplayCache(d)
		default:
			return d.Errf("unrecognized redis storage option '%s'", opt)
		}
		return err
	})
	if err != nil {
		return err
	}
	if r.MasterName != "" && len(r.Addresses) == 0 {
		return masterErr
	}
	if r.MasterName == "" && sentinelErr != nil {
		return sentinelErr
	}
	return nil
}

// checkCaddyfileURL reports a malformed url at its line, unless it holds
// placeholders (checked at provisioning, once they are resolved).
func checkCaddyfileURL(d *caddyfile.Dispenser, u string) error {
	if strings.Contains(u, "{") {
		return nil
	}
	if err := checkRedisURL(u, false, false); err != nil {
		return d.Err(err.Error())
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner     = (*RedisStorage)(nil)
	_ caddy.CleanerUpper    = (*RedisStorage)(nil)
	_ caddyfile.Unmarshaler = (*RedisStorage)(nil)
	_ StorageBackend        = (*RedisStorage)(nil)
)

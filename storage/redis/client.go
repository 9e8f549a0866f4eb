package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/caddy-idempotency/caddy-idempotency/storage/opterr"
	"github.com/caddy-idempotency/caddy-idempotency/storage/redact"
)

// Client defaults, for ClientOptions fields left zero.
const (
	DefaultURL         = "redis://127.0.0.1:6379/0"
	DefaultTimeout     = 2 * time.Second
	DefaultDialTimeout = time.Second
)

// The bounds ClientOptions.Check puts on Timeout and DialTimeout. Below
// MinTimeout no Redis answers reliably, and such a value is most likely a
// unit mix-up (a JSON duration given as a bare number is nanoseconds:
// "timeout": 2 is 2ns, and would answer 503 to every request). Above
// MaxTimeout a request would hang on a Redis that does not answer for
// longer than any client waits.
const (
	MinTimeout = 10 * time.Millisecond
	MaxTimeout = time.Minute
)

// The module's bounds on go-redis's pool and buffer sizes, from the
// pool_size option and the URL's parameters alike. go-redis panics on a
// negative size (it makes channels of that many), and fills a semaphore
// with one token per connection of the pool before the client is
// returned: pool_size 2147483647 held Caddy's start-up for minutes, and a
// size above an int32 panics. MaxPoolSize is Redis's own default
// maxclients: a pool that could open more than a server accepts is a
// typo.
const (
	MaxPoolSize   = 10000
	MaxBufferSize = 16 << 20 // pipeline_read_buffer_size, pipeline_write_buffer_size
	MaxRetries    = 100      // max_retries; each is bounded by timeout besides
)

// ClientOptions describe the Redis deployment a Store talks to: a single
// node (URL, or one address), a Redis Cluster (several addresses) or a
// Sentinel-managed primary (MasterName and the Sentinels' addresses).
// NewClient builds the go-redis client from them; Check reports what is
// wrong with them. Errors never quote URL, user names or passwords, which
// may hold secrets.
type ClientOptions struct {
	// URL is redis://[user:password@]host[:port][/db], rediss:// for TLS,
	// or unix:///path; its query parameters configure the client as
	// go-redis's ParseURL reads them. A bare host:port means
	// redis://host:port. Not together with Addrs. Default, when Addrs is
	// empty too: DefaultURL.
	URL string

	// Addrs are host:port, or redis://host:port, rediss://host:port (all
	// of one kind). An entry may hold several addresses separated by
	// commas or spaces. Several addresses are a Cluster, or the Sentinels
	// with MasterName.
	Addrs []string

	// MasterName is the primary the Sentinels at Addrs monitor.
	MasterName string

	// Username and Password authenticate to the data nodes; not together
	// with a user or password in URL.
	Username, Password string

	// SentinelUsername and SentinelPassword authenticate to the Sentinels
	// themselves; they need MasterName.
	SentinelUsername, SentinelPassword string

	// PoolSize is the most connections per node (default: go-redis's).
	PoolSize int

	// DialTimeout bounds opening one connection (default
	// DefaultDialTimeout; MinTimeout to MaxTimeout).
	DialTimeout time.Duration

	// Timeout is the read and write timeout of each command (default
	// DefaultTimeout; MinTimeout to MaxTimeout); give the Store the same
	// as Options.Timeout.
	Timeout time.Duration

	// TLS configures TLS for rediss:// URLs and addresses; nil means
	// certificates are checked against the system roots and the host
	// dialled. With a redis:// URL or plain addresses it turns TLS on.
	TLS *tls.Config

	// TLSCAFile is a PEM file of the CA certificates the server's
	// certificate is checked against, instead of the system's.
	TLSCAFile string
	// TLSCertFile and TLSKeyFile are a PEM client certificate and its
	// key, for servers that require one (tls-auth-clients).
	TLSCertFile, TLSKeyFile string
	// TLSServerName is the name the server's certificate must carry,
	// when it is not the host dialled.
	TLSServerName string
}

// usesTLSFiles reports whether o asks for TLS through its file options.
func (o ClientOptions) usesTLSFiles() bool {
	return o.TLSCAFile != "" || o.TLSCertFile != "" || o.TLSKeyFile != "" || o.TLSServerName != ""
}

// Secrets returns the passwords o holds: Password, SentinelPassword and
// those of URL and Addrs (however misspelt), for Options.Secrets.
func (o ClientOptions) Secrets() []string {
	secrets := redact.Secrets(strings.Join(append([]string{o.URL}, o.Addrs...), " "))
	for _, pw := range []string{o.Password, o.SentinelPassword} {
		if pw != "" && !slices.Contains(secrets, pw) {
			secrets = append(secrets, pw)
		}
	}
	return secrets
}

// url returns o.URL with a bare host:port read as redis://host:port.
func (o ClientOptions) url() string {
	if o.URL != "" && !strings.Contains(o.URL, "://") {
		if host, port, err := net.SplitHostPort(o.URL); err == nil && host != "" && port != "" {
			return "redis://" + o.URL
		}
	}
	return o.URL
}

// Check reports what is wrong with o, without touching the network. An
// error names the options it is about (an *opterr.Error), as the Caddy
// module spells them.
func (o ClientOptions) Check() error {
	switch {
	case o.URL != "" && len(o.Addrs) > 0:
		return opterr.New(errors.New("redis storage: url and addresses are mutually exclusive"), "url", "addresses")
	case o.MasterName != "" && len(o.Addrs) == 0:
		return opterr.New(errors.New("redis storage: master_name needs addresses (the Sentinels)"), "master_name", "addresses")
	case o.MasterName == "" && o.SentinelUsername != "":
		return opterr.New(errors.New("redis storage: sentinel_username needs master_name"), "sentinel_username", "master_name")
	case o.MasterName == "" && o.SentinelPassword != "":
		return opterr.New(errors.New("redis storage: sentinel_password needs master_name"), "sentinel_password", "master_name")
	case o.PoolSize < 0 || o.PoolSize > MaxPoolSize:
		return opterr.Errorf("pool_size", "redis storage: pool_size must be between 1 and %d, got %d", MaxPoolSize, o.PoolSize)
	case o.DialTimeout != 0 && o.DialTimeout < MinTimeout:
		return opterr.Errorf("dial_timeout", "redis storage: dial_timeout must be at least %v, got %v", MinTimeout, o.DialTimeout)
	case o.DialTimeout > MaxTimeout:
		return opterr.Errorf("dial_timeout", "redis storage: dial_timeout must be at most %v, got %v", MaxTimeout, o.DialTimeout)
	case o.Timeout != 0 && o.Timeout < MinTimeout:
		return opterr.Errorf("timeout", "redis storage: timeout must be at least %v, got %v", MinTimeout, o.Timeout)
	case o.Timeout > MaxTimeout:
		return opterr.Errorf("timeout", "redis storage: timeout must be at most %v, got %v", MaxTimeout, o.Timeout)
	case (o.TLSCertFile == "") != (o.TLSKeyFile == ""):
		return opterr.New(errors.New("redis storage: tls_cert_file and tls_key_file go together"), "tls_cert_file", "tls_key_file")
	}
	if len(o.Addrs) > 0 {
		_, _, err := ParseAddresses(o.Addrs)
		return opterr.New(err, "addresses")
	}
	if o.URL != "" {
		if err := CheckURL(o.url(), o.Username != "", o.Password != ""); err != nil {
			return err
		}
		return o.checkIdleConns()
	}
	return nil
}

// checkIdleConns checks the URL's min_idle_conns against the pool it is
// part of: the pool_size option, else the URL's (CheckURL checked both).
func (o ClientOptions) checkIdleConns() error {
	parsed, err := url.Parse(o.url())
	if err != nil {
		return nil // CheckURL said so
	}
	q := parsed.Query()
	poolSize := o.PoolSize
	if poolSize == 0 {
		poolSize, _ = strconv.Atoi(lastValue(q, "pool_size"))
	}
	minIdle, _ := strconv.Atoi(lastValue(q, "min_idle_conns"))
	if poolSize > 0 && minIdle > poolSize {
		return opterr.Errorf("url", "redis storage: url parameter min_idle_conns (%d) must not be more than the pool's size (%d)", minIdle, poolSize)
	}
	return nil
}

// CheckURL checks what go-redis's ParseURL would say about u, and that a
// user or password is not given both in u and on its own (hasUsername,
// hasPassword). Its errors name their options, as Check's do.
func CheckURL(u string, hasUsername, hasPassword bool) error {
	if !strings.Contains(u, "://") {
		return opterr.New(errors.New(`redis storage: url must start with a scheme: redis://host:port, rediss://host:port or unix:///path`), "url")
	}
	parsed, err := url.Parse(u)
	if err != nil {
		// url.Error quotes the whole URL, password included: keep only
		// the reason.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return opterr.Errorf("url", "redis storage: invalid url: %s", withheld(err, u))
	}
	if err := checkParams(parsed.Query()); err != nil {
		return opterr.New(errors.New(redact.Scrub(err.Error(), redact.Secrets(u))), "url")
	}
	if _, err := goredis.ParseURL(u); err != nil {
		// go-redis quotes parts of the URL (its path, a query value).
		return opterr.Errorf("url", "redis storage: invalid url: %s", withheld(err, u))
	}
	if parsed.Scheme != "unix" && parsed.Hostname() == "" {
		return opterr.New(errors.New("redis storage: invalid url: no host"), "url")
	}
	if parsed.User != nil {
		if hasUsername && parsed.User.Username() != "" {
			return opterr.New(errors.New("redis storage: a user is set both in url and in username"), "url", "username")
		}
		if _, has := parsed.User.Password(); has && hasPassword {
			return opterr.New(errors.New("redis storage: a password is set both in url and in password"), "url", "password")
		}
	}
	return nil
}

// quoted is a quoted part of an error message.
var quoted = regexp.MustCompile(`"[^"]*"|%[0-9A-Za-z]{0,2}`)

// withheld is err's message about the URL u without what it quotes of u,
// which may be part of a password even where u does not parse as holding
// one (a '%' in a password, not escaped, is an escape error quoting the
// characters after it), and scrubbed of the passwords u holds.
func withheld(err error, u string) string {
	var escape url.EscapeError
	if errors.As(err, &escape) {
		return "a '%' is not followed by two hexadecimal digits (write a '%' in a password as %25; the url is not quoted: it may hold a password)"
	}
	return quoted.ReplaceAllString(redact.Scrub(err.Error(), redact.Secrets(u)), `"(withheld)"`)
}

// lastValue is the value of the parameter name as go-redis reads it: the
// last one given.
func lastValue(q url.Values, name string) string {
	if vs := q[name]; len(vs) > 0 {
		return vs[len(vs)-1]
	}
	return ""
}

// The parameters of a Redis URL that go-redis reads as numbers and
// durations, with the range Check holds each to: go-redis accepts any
// int, and panics on some (a negative pool_size, min_idle_conns,
// max_concurrent_dials), hangs on others (a huge pool_size), or turns a
// duration of zero or less into "none", which for a dial or a pool wait
// means a deadline in the past (every request 503s). A duration of zero or
// less is accepted where "none" means no limit (idle and lifetime limits,
// retry backoffs).
var (
	intParams = []struct {
		name   string
		lo, hi int
	}{
		{"db", 0, math.MaxInt32},
		{"pool_size", 0, MaxPoolSize},
		{"min_idle_conns", 0, MaxPoolSize},
		{"max_idle_conns", 0, MaxPoolSize},
		{"max_active_conns", 0, MaxPoolSize},
		{"max_concurrent_dials", 0, MaxPoolSize},
		{"pipeline_pool_size", -1, MaxPoolSize}, // -1: no pipeline pool
		{"pipeline_read_buffer_size", 0, MaxBufferSize},
		{"pipeline_write_buffer_size", 0, MaxBufferSize},
		{"max_retries", -1, MaxRetries}, // -1: no retries
	}
	durationParams = []struct {
		name string
		off  bool          // zero or less turns it off
		max  time.Duration // 0: none
	}{
		{"dial_timeout", false, MaxTimeout},
		{"pool_timeout", false, MaxTimeout},
		{"conn_max_idle_time", true, 0},
		{"idle_timeout", true, 0},
		{"conn_max_lifetime", true, 0},
		{"max_conn_age", true, 0},
		{"conn_max_lifetime_jitter", true, 0},
		{"min_retry_backoff", true, MaxTimeout},
		{"max_retry_backoff", true, MaxTimeout},
	}
)

// checkParams checks the query parameters of a Redis URL that go-redis
// would accept but that cannot work, or are not used; the error names the
// parameter. go-redis itself refuses the names it does not know.
func checkParams(q url.Values) error {
	for _, p := range intParams {
		s := lastValue(q, p.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < p.lo || n > p.hi {
			return fmt.Errorf("redis storage: url parameter %s must be a whole number from %d to %d, got %q", p.name, p.lo, p.hi, s)
		}
	}
	switch s := lastValue(q, "protocol"); s {
	case "", "2", "3":
	default:
		return fmt.Errorf("redis storage: url parameter protocol must be 2 or 3, got %q", s)
	}
	for _, p := range durationParams {
		s := lastValue(q, p.name)
		if s == "" {
			continue
		}
		d, ok := redisDuration(s)
		switch {
		case !ok:
			return fmt.Errorf("redis storage: url parameter %s must be a duration (1s, 500ms) or a number of seconds, got %q", p.name, s)
		case d <= 0 && p.off:
		case d <= 0:
			return fmt.Errorf("redis storage: url parameter %s must be positive, got %q (go-redis reads zero or less as no timeout, which fails every dial)", p.name, s)
		case d < MinTimeout && !strings.Contains(p.name, "backoff"):
			return fmt.Errorf("redis storage: url parameter %s must be at least %v, got %q", p.name, MinTimeout, s)
		case p.max > 0 && d > p.max:
			return fmt.Errorf("redis storage: url parameter %s must be at most %v, got %q", p.name, p.max, s)
		}
	}
	for _, name := range []string{"read_timeout", "write_timeout"} {
		if lastValue(q, name) != "" {
			return fmt.Errorf("redis storage: url parameter %s is not used: the timeout option sets the read and write timeouts", name)
		}
	}
	if s := lastValue(q, "client_name"); strings.IndexFunc(s, func(c rune) bool { return c <= ' ' || c > '~' }) >= 0 {
		// Redis refuses CLIENT SETNAME with a space: every connection would fail.
		return errors.New("redis storage: url parameter client_name must be printable ASCII without spaces")
	}
	return nil
}

// redisDuration reads a duration parameter as go-redis does: a whole
// number of seconds, or a Go duration; ok is false for neither, or a
// number of seconds that overflows a duration.
func redisDuration(s string) (d time.Duration, ok bool) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n > int64(math.MaxInt64/time.Second) {
			return 0, false
		}
		return time.Duration(n) * time.Second, true
	}
	d, err := time.ParseDuration(s)
	return d, err == nil
}

// ParseAddresses splits and checks addresses: host:port, or redis:// or
// rediss:// URLs of host and port only, all of one kind; useTLS reports
// rediss://.
func ParseAddresses(entries []string) (addrs []string, useTLS bool, err error) {
	scheme := ""
	for _, entry := range entries {
		fields := strings.FieldsFunc(entry, func(c rune) bool { return c == ',' || unicode.IsSpace(c) })
		if len(fields) == 0 {
			return nil, false, errors.New("redis storage: an address is empty")
		}
		for _, a := range fields {
			if strings.Contains(a, "@") {
				// Never quoted: it may hold a password.
				return nil, false, errors.New("redis storage: an address must be host:port, redis://host:port or rediss://host:port, without credentials (use username and password)")
			}
			s, hostport := "", a
			if before, after, ok := strings.Cut(a, "://"); ok {
				u, err := url.Parse(a)
				if err != nil || (before != "redis" && before != "rediss") || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
					return nil, false, fmt.Errorf("redis storage: address %q must be host:port, redis://host:port or rediss://host:port", redact.DSN(a))
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

// NewClient builds the go-redis client o describes. It connects lazily:
// building one never touches the network.
func NewClient(o ClientOptions) (goredis.UniversalClient, error) {
	return newClient(o, false)
}

// renewPoolSize is the most connections per node of a client that
// NewRenewClient builds: the Store sends one pipeline per node and batch
// of renewals, so one connection per node carries them, and a few more
// let a batch go out while an earlier one still waits for a slow reply.
const renewPoolSize = 4

// NewRenewClient builds a client for the Store's lease renewals
// (Options.RenewClient) to the deployment o describes: connections of its
// own, at most 4 per node whatever o.PoolSize says, so that
// renewals never queue behind reservations and completions nor wait for
// one of their pooled connections.
//
// It has no socket timeout of its own: the deadline of each batch's
// context is its connection's read and write deadline, so a reply that
// comes late, but within what the caller allows, never costs the
// connection (go-redis closes a connection whose read timed out, and the
// next batch would pay for a new one: a dial, the handshake, and only
// then its command). Commands sent without a deadline (go-redis's own,
// such as a Cluster's reload of its slot map) get o.Timeout. Like
// NewClient, it connects lazily.
func NewRenewClient(o ClientOptions) (goredis.UniversalClient, error) {
	return newClient(o, true)
}

// newClient builds the client o describes; with renew, the one
// NewRenewClient describes.
func newClient(o ClientOptions, renew bool) (goredis.UniversalClient, error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	timeout := orDefault(o.Timeout, DefaultTimeout)
	dialTimeout := orDefault(o.DialTimeout, DefaultDialTimeout)
	tlsConfig, err := o.tlsConfig()
	if err != nil {
		return nil, err
	}
	// The read and write timeouts of each command, and the pool's size
	// (0: go-redis's default).
	rwTimeout, poolSize := timeout, o.PoolSize
	var hook goredis.Hook
	if renew {
		// -1: no timeout of the client's own; the context's deadline
		// is the socket's (ContextTimeoutEnabled).
		rwTimeout, poolSize = -1, renewPoolSize
		hook = defaultDeadline(timeout)
	}
	if len(o.Addrs) == 0 {
		u := o.url()
		if u == "" {
			u = DefaultURL
		}
		opt, err := goredis.ParseURL(u)
		if err != nil {
			return nil, fmt.Errorf("redis storage: invalid url: %s", redact.Scrub(err.Error(), redact.Secrets(u)))
		}
		if o.Username != "" {
			opt.Username = o.Username
		}
		if o.Password != "" {
			opt.Password = o.Password
		}
		if poolSize > 0 {
			opt.PoolSize = poolSize
		}
		if o.DialTimeout > 0 || opt.DialTimeout == 0 {
			opt.DialTimeout = dialTimeout
		}
		if tlsConfig != nil {
			opt.TLSConfig = withServerName(tlsConfig, opt.TLSConfig, opt.Addr)
		}
		opt.ReadTimeout, opt.WriteTimeout = rwTimeout, rwTimeout
		opt.ContextTimeoutEnabled = true
		opt.DialerRetries = 1
		opt.MaintNotificationsConfig = noMaintNotifications()
		c := goredis.NewClient(opt)
		if hook != nil {
			c.AddHook(hook)
		}
		return c, nil
	}
	addrs, useTLS, _ := ParseAddresses(o.Addrs) // checked
	opt := &goredis.UniversalOptions{
		Addrs:            addrs,
		MasterName:       o.MasterName,
		Username:         o.Username,
		Password:         o.Password,
		SentinelUsername: o.SentinelUsername,
		SentinelPassword: o.SentinelPassword,
		PoolSize:         poolSize,
		DialTimeout:      dialTimeout,
		ReadTimeout:      rwTimeout,
		WriteTimeout:     rwTimeout,
		// The store bounds each operation with a context deadline
		// (timeout); the client must honour it on the socket too.
		ContextTimeoutEnabled: true,
		// Each command is already retried (MaxRetries) on a fresh
		// connection; retrying every dial on top would multiply the time
		// a request waits while Redis is down.
		DialerRetries:            1,
		MaintNotificationsConfig: noMaintNotifications(),
	}
	switch {
	case tlsConfig != nil:
		opt.TLSConfig = tlsConfig
	case useTLS:
		// No ServerName: each node's certificate is checked against the
		// host it is dialled as.
		opt.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if hook == nil {
		return goredis.NewUniversalClient(opt), nil
	}
	if opt.MasterName == "" && len(opt.Addrs) > 1 {
		// A Cluster: the hook goes on every node's client, where
		// go-redis sends its own commands (CLUSTER SLOTS) too.
		co := opt.Cluster()
		co.NewClient = func(o *goredis.Options) *goredis.Client {
			c := goredis.NewClient(o)
			c.AddHook(hook)
			return c
		}
		return goredis.NewClusterClient(co), nil
	}
	c := goredis.NewUniversalClient(opt)
	c.AddHook(hook)
	return c, nil
}

// noMaintNotifications turns off go-redis's maintenance notifications (a
// Redis Cloud feature that moves connections ahead of a server's
// upgrade). In their default mode, auto, go-redis looks the server's host
// name up when the client is built, to tell an internal address from an
// external one, waiting up to two seconds: building a client would then
// touch the network (and Caddy's start would wait on a slow resolver),
// which a store must never do before its first operation. Stores of this
// module reconnect on their own when a server goes away.
func noMaintNotifications() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// defaultDeadline is a hook that gives a command or pipeline sent without
// a context deadline the deadline d from now: the bound of a client whose
// sockets have no timeout of their own (NewRenewClient).
type defaultDeadline time.Duration

func (defaultDeadline) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (d defaultDeadline) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if _, ok := ctx.Deadline(); ok {
			return next(ctx, cmd)
		}
		ctx, cancel := context.WithTimeout(ctx, time.Duration(d))
		defer cancel()
		return next(ctx, cmd)
	}
}

func (d defaultDeadline) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if _, ok := ctx.Deadline(); ok {
			return next(ctx, cmds)
		}
		ctx, cancel := context.WithTimeout(ctx, time.Duration(d))
		defer cancel()
		return next(ctx, cmds)
	}
}

// tlsConfig builds the TLS configuration of the file options on top of
// o.TLS; nil when neither is set. It reads the files.
func (o ClientOptions) tlsConfig() (*tls.Config, error) {
	if o.TLS == nil && !o.usesTLSFiles() {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.TLS != nil {
		cfg = o.TLS.Clone()
	}
	if o.TLSCAFile != "" {
		pem, err := os.ReadFile(o.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("redis storage: tls_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis storage: tls_ca_file %s holds no PEM certificate", o.TLSCAFile)
		}
		cfg.RootCAs = pool
	}
	if o.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.TLSCertFile, o.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("redis storage: tls_cert_file and tls_key_file: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if o.TLSServerName != "" {
		cfg.ServerName = o.TLSServerName
	}
	return cfg, nil
}

// Where describes the deployment o names, for logs: addresses and
// database, never credentials.
func (o ClientOptions) Where() string {
	if len(o.Addrs) > 0 {
		addrs, useTLS, err := ParseAddresses(o.Addrs)
		if err != nil {
			return "invalid addresses"
		}
		scheme := "redis"
		if useTLS || o.TLS != nil || o.usesTLSFiles() {
			scheme = "rediss"
		}
		switch {
		case o.MasterName != "":
			return fmt.Sprintf("%s://%s (Sentinel, primary %q)", scheme, strings.Join(addrs, ","), o.MasterName)
		case len(addrs) > 1:
			return fmt.Sprintf("%s://%s (Cluster)", scheme, strings.Join(addrs, ","))
		}
		return scheme + "://" + addrs[0]
	}
	u, err := url.Parse(cmpURL(o.url()))
	if err != nil {
		return "invalid url"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	if u.Scheme == "redis" && (o.TLS != nil || o.usesTLSFiles()) {
		u.Scheme = "rediss"
	}
	return u.String()
}

func cmpURL(u string) string {
	if u == "" {
		return DefaultURL
	}
	return u
}

// withServerName returns cfg for a single-node client at addr whose URL
// may have set TLS up already (rediss://): the certificate is checked
// against the name cfg gives, else the host dialled.
func withServerName(cfg, fromURL *tls.Config, addr string) *tls.Config {
	out := cfg.Clone()
	if out.ServerName == "" && fromURL != nil {
		out.ServerName = fromURL.ServerName
	}
	if out.ServerName == "" {
		out.ServerName, _, _ = net.SplitHostPort(addr)
	}
	if out.MinVersion == 0 {
		out.MinVersion = tls.VersionTLS12
	}
	return out
}

// orDefault returns d, or def when d is zero.
func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

package postgres

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgservicefile"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/storage/opterr"
	"github.com/caddy-idempotency/caddy-idempotency/storage/redact"
)

// Connection defaults applied by NewPoolConfig.
const (
	// DefaultConnectTimeout bounds connecting when the DSN sets no
	// connect_timeout: pgx would otherwise wait two minutes for a server
	// that drops packets.
	DefaultConnectTimeout = 5 * time.Second

	// keepAliveIdle, keepAliveInterval and keepAliveCount make the kernel
	// notice a peer that vanished without closing (a partition, a crashed
	// host) on an idle pooled connection within about half a minute,
	// rather than the two hours of Linux's defaults.
	keepAliveIdle     = 15 * time.Second
	keepAliveInterval = 5 * time.Second
	keepAliveCount    = 3

	// cancelGrace is how long a statement whose context ended may take to
	// come back once the server was asked to cancel it, before its
	// connection is given up: a lock wait answers a cancel request at once,
	// a black-holed connection never answers anything.
	cancelGrace = 300 * time.Millisecond
)

// The store's statements are written for READ COMMITTED, PostgreSQL's
// default: each sees the rows committed before it started, and its ON
// CONFLICT and UPDATE act on the latest committed version of a row (see
// Store.Reserve). Under REPEATABLE READ or SERIALIZABLE, which a database
// or a role may default to (ALTER DATABASE/ROLE ... SET
// default_transaction_isolation), and which PostgreSQL-compatible
// databases such as CockroachDB use, concurrent reservations of one key
// fail with serialization errors instead. NewPoolConfig therefore sets
// the isolation in the connection's start-up packet, where it overrides
// those defaults at no cost per statement; the store also retries such
// failures, for pools made without NewPoolConfig. PgBouncer refuses
// start-up parameters it does not know: list this one in its
// track_extra_parameters (1.20 and later, which keeps it per client) or
// ignore_startup_parameters (the store then relies on its retries).
const (
	isolationParam = "default_transaction_isolation"
	readCommitted  = "read committed"
)

// DefaultMaxConns returns the pool size NewPoolConfig uses when neither
// its caller nor the DSN (pool_max_conns) sets one: the greater of 16 and
// twice the CPUs. pgx's own default, the greater of 4 and the CPUs, let
// only four new keys reserve at a time on a small machine, and new keys
// wait on durable commits (about 1 to 3 ms each) rather than on the CPU:
// measured with `make bench` on two CPUs, 16 connections served 40 to 90%
// more new keys a second than 4, and 32 or 64 no more than 16 (see
// docs/performance.md). Twice the CPUs keeps room for the concurrency a
// larger machine serves while staying far below PostgreSQL's default
// max_connections of 100 for a few instances.
func DefaultMaxConns() int { return max(16, 2*runtime.NumCPU()) }

// ErrInvalidDSN is returned by NewPoolConfig for a connection string pgx
// cannot parse. pgx's own message may quote the string, password
// included, so it is withheld (but for the parameter it names, see
// parseError).
var ErrInvalidDSN = errors.New("postgres: dsn is not a valid connection string (details withheld: they may contain the password)")

// The module's bounds on pgx's pool parameters, from the max_conns option
// and the DSN's parameters alike (see checkPoolConfig). pgxpool's health
// check is a ticker, which panics on a period of zero or less, in a
// goroutine of its own: the whole of Caddy went down with it. Its
// minimum connections are made by as many goroutines at once, each
// waiting on a channel of that size (2147483647: an allocation of 32 GiB),
// and pgx's statement caches are maps of their capacity, made per
// connection (a negative one panics).
const (
	// MaxConns bounds a pool: more connections than PostgreSQL serves
	// (its max_connections is 100 by default) from one configuration
	// of one instance is a typo.
	MaxConns = 10000
	// MinConnLifetime is the shortest pool_max_conn_lifetime but 0 (no
	// limit): a connection that expires before its first statement is
	// closed on every acquire, and requests fail for want of one.
	MinConnLifetime = time.Second
	// MinHealthCheckPeriod is the shortest pool_health_check_period:
	// shorter, the check would run without pause.
	MinHealthCheckPeriod = 100 * time.Millisecond
	// MaxConnectTimeout bounds connect_timeout (pgx multiplies its
	// seconds into a duration, which overflows past 292 years).
	MaxConnectTimeout = time.Hour
	// MaxCacheCapacity bounds statement_cache_capacity and
	// description_cache_capacity (pgx's default: 512).
	MaxCacheCapacity = 10000
)

// NewPoolConfig parses dsn (a URL or keyword/value pairs, any parameter
// pgx accepts) into a pool configuration fit for a store on the request
// path:
//
//   - maxConns, when positive, bounds the pool (else the DSN's
//     pool_max_conns, else DefaultMaxConns);
//   - connecting gives up after DefaultConnectTimeout unless the DSN sets
//     connect_timeout;
//   - TCP keepalive notices a dead peer on an idle connection within
//     about 30 seconds;
//   - every session runs at the READ COMMITTED isolation level, whatever
//     the database's, the role's or the DSN's default_transaction_isolation
//     (see isolationParam);
//   - a statement whose context ends (the store's Timeout) is cancelled
//     on the server with a cancel request, so that a statement waiting on
//     a lock cannot commit after its caller gave up, and its connection is
//     dropped if the server does not answer within a moment (a partition);
//   - the server's warning that it cancelled a commit's wait for a
//     synchronous standby (committed on the primary alone) is noted on the
//     connection, and the store's statement fails as not replicated (see
//     durability.go). A pool made otherwise does not notice it.
//
// It never connects.
func NewPoolConfig(dsn string, maxConns int) (*pgxpool.Config, error) {
	if m := urlScheme.FindStringSubmatch(dsn); m != nil && m[1] != "postgres" && m[1] != "postgresql" {
		// pgx would read the whole URL as one keyword, and connect to its
		// defaults (the local socket, the OS user) with it as a setting.
		return nil, opterr.Errorf("dsn", "postgres: dsn is a URL whose scheme is %q: it must be postgres:// or postgresql:// (or keyword=value pairs)", m[1])
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, parseError(err, dsn)
	}
	switch {
	case maxConns > MaxConns:
		return nil, opterr.Errorf("max_conns", "postgres: max_conns must be from 1 to %d, got %d", MaxConns, maxConns)
	case cfg.MaxConns > MaxConns:
		return nil, dsnParamError("pool_max_conns", "must be from 1 to %d, got %d", MaxConns, cfg.MaxConns)
	case maxConns > 0:
		cfg.MaxConns = int32(maxConns)
	case !strings.Contains(dsn, "pool_max_conns"):
		// pgxpool has applied its own default; the parsed config does
		// not say whether the DSN set one, the DSN does.
		cfg.MaxConns = int32(DefaultMaxConns())
	}
	if err := checkPoolConfig(cfg, dsn); err != nil {
		return nil, err
	}
	cc := cfg.ConnConfig
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = make(map[string]string)
	}
	cc.RuntimeParams[isolationParam] = readCommitted
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = DefaultConnectTimeout
	}
	dialer := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{
		Enable:   true,
		Idle:     keepAliveIdle,
		Interval: keepAliveInterval,
		Count:    keepAliveCount,
	}}
	// pgx bounds each dial by ConnectTimeout itself.
	cc.DialFunc = dialer.DialContext
	cc.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: cancelGrace}
	}
	cc.OnNotice = noteSyncWaitCancelled
	cfg.PrepareConn = forgetSyncWait
	return cfg, nil
}

// urlScheme matches the scheme of a DSN written as a URL; a keyword=value
// DSN starts with a keyword and its '='.
var urlScheme = regexp.MustCompile(`^\s*([A-Za-z][A-Za-z0-9+.-]*)://`)

// dsnParamError is a refusal of the DSN's parameter name.
func dsnParamError(name, format string, a ...any) error {
	return opterr.Errorf("dsn", "postgres: dsn parameter %s %s", name, fmt.Sprintf(format, a...))
}

// checkPoolConfig checks what pgx parsed from a DSN (and the pool's size
// as NewPoolConfig set it) against what pgx and pgxpool can work with:
// pgx accepts every value of the right type, and some of those panic, hang
// or cannot connect (see MaxConns). The error names the parameter.
func checkPoolConfig(cfg *pgxpool.Config, dsn string) error {
	cc := cfg.ConnConfig
	switch {
	case cfg.MinConns < 0 || cfg.MinConns > cfg.MaxConns:
		return dsnParamError("pool_min_conns", "must be from 0 to the pool's size (%d), got %d", cfg.MaxConns, cfg.MinConns)
	case cfg.MinIdleConns < 0 || cfg.MinIdleConns > cfg.MaxConns:
		return dsnParamError("pool_min_idle_conns", "must be from 0 to the pool's size (%d), got %d", cfg.MaxConns, cfg.MinIdleConns)
	case cfg.HealthCheckPeriod < MinHealthCheckPeriod:
		return dsnParamError("pool_health_check_period", "must be at least %v, got %v", MinHealthCheckPeriod, cfg.HealthCheckPeriod)
	case cfg.MaxConnLifetime < 0 || cfg.MaxConnLifetime > 0 && cfg.MaxConnLifetime < MinConnLifetime:
		return dsnParamError("pool_max_conn_lifetime", "must be 0 (no limit) or at least %v, got %v", MinConnLifetime, cfg.MaxConnLifetime)
	case cfg.MaxConnLifetimeJitter < 0:
		return dsnParamError("pool_max_conn_lifetime_jitter", "must not be negative, got %v", cfg.MaxConnLifetimeJitter)
	case cfg.MaxConnIdleTime < 0:
		return dsnParamError("pool_max_conn_idle_time", "must not be negative (0 means no limit), got %v", cfg.MaxConnIdleTime)
	case cfg.PingTimeout < 0:
		return dsnParamError("pool_ping_timeout", "must not be negative (0 means none), got %v", cfg.PingTimeout)
	case cc.ConnectTimeout < 0 || cc.ConnectTimeout > MaxConnectTimeout || connectTimeoutOverflows(dsn):
		return dsnParamError("connect_timeout", "must be from 0 to %d seconds", int(MaxConnectTimeout/time.Second))
	case cc.StatementCacheCapacity == 0 && cc.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement:
		// pgx then refuses every statement ("cannot use
		// QueryExecModeCacheStatement with disabled statement cache").
		return dsnParamError("statement_cache_capacity", "of 0 needs a default_query_exec_mode other than cache_statement (the default)")
	case cc.DescriptionCacheCapacity == 0 && cc.DefaultQueryExecMode == pgx.QueryExecModeCacheDescribe:
		return dsnParamError("description_cache_capacity", "of 0 needs a default_query_exec_mode other than cache_describe")
	case cc.StatementCacheCapacity < 0 || cc.StatementCacheCapacity > MaxCacheCapacity:
		return dsnParamError("statement_cache_capacity", "must be from 0 to %d, got %d", MaxCacheCapacity, cc.StatementCacheCapacity)
	case cc.DescriptionCacheCapacity < 0 || cc.DescriptionCacheCapacity > MaxCacheCapacity:
		return dsnParamError("description_cache_capacity", "must be from 0 to %d, got %d", MaxCacheCapacity, cc.DescriptionCacheCapacity)
	}
	for name := range cc.RuntimeParams {
		// pgxpool took the parameters it knows out; any other is sent
		// to the server as a setting, and PostgreSQL has none of this
		// name: it would refuse every connection.
		if strings.HasPrefix(name, "pool_") {
			return dsnParamError(name, "is not a parameter pgxpool knows (%s)", strings.Join(poolParams, ", "))
		}
	}
	return nil
}

// poolParams are the parameters pgxpool reads from a DSN.
var poolParams = []string{"pool_max_conns", "pool_min_conns", "pool_min_idle_conns", "pool_max_conn_lifetime",
	"pool_max_conn_lifetime_jitter", "pool_max_conn_idle_time", "pool_health_check_period", "pool_ping_timeout"}

// connectTimeoutValue finds the number of seconds connect_timeout is given
// in a DSN, a URL's query or keyword/value pairs, in PGCONNECT_TIMEOUT,
// and in a service file.
var connectTimeoutValue = regexp.MustCompile(`connect_timeout\s*=\s*'?\s*\+?(\d+)`)

// connectTimeoutOverflows reports whether a connect_timeout is more
// seconds than MaxConnectTimeout: pgx multiplies them into a duration
// that overflows, and may wrap into a range that looks right.
func connectTimeoutOverflows(dsn string) bool {
	texts := []string{dsn, "connect_timeout=" + os.Getenv("PGCONNECT_TIMEOUT"), "connect_timeout=" + serviceConnectTimeout(dsn)}
	if unescaped, err := url.QueryUnescape(dsn); err == nil {
		texts = append(texts, unescaped)
	}
	for _, text := range texts {
		for _, m := range connectTimeoutValue.FindAllStringSubmatch(text, -1) {
			if n, err := strconv.ParseInt(m[1], 10, 64); err != nil || n > int64(MaxConnectTimeout/time.Second) {
				return true
			}
		}
	}
	return false
}

// serviceKeyword finds service and servicefile in a DSN of keyword/value
// pairs.
var serviceKeyword = regexp.MustCompile(`(?:^|\s)(service|servicefile)\s*=\s*'?([^'\s]*)`)

// serviceConnectTimeout is the connect_timeout of the service the DSN
// names (its service, else PGSERVICE) in its service file (servicefile,
// else PGSERVICEFILE, else ~/.pg_service.conf), which pgx reads as it
// reads the DSN's own; "" when there is none, or nothing to read (pgx's
// ParseConfig then says why).
func serviceConnectTimeout(dsn string) string {
	service, file := os.Getenv("PGSERVICE"), os.Getenv("PGSERVICEFILE")
	if file == "" {
		if home, err := os.UserHomeDir(); err == nil {
			file = filepath.Join(home, ".pg_service.conf")
		}
	}
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		service = cmp.Or(q.Get("service"), service)
		file = cmp.Or(q.Get("servicefile"), file)
	} else {
		for _, m := range serviceKeyword.FindAllStringSubmatch(dsn, -1) {
			if m[1] == "service" {
				service = m[2]
			} else {
				file = m[2]
			}
		}
	}
	if service == "" || file == "" {
		return ""
	}
	sf, err := pgservicefile.ReadServicefile(file)
	if err != nil {
		return ""
	}
	svc, err := sf.GetService(service)
	if err != nil {
		return ""
	}
	return svc.Settings["connect_timeout"]
}

// dsnParams are the parameters pgx reads from a DSN whose errors parseError
// may name: pgconn's, pgx's and pgxpool's, but those that hold secrets.
var dsnParams = append([]string{"host", "port", "database", "user", "passfile", "connect_timeout", "sslmode", "sslkey",
	"sslcert", "sslcertmode", "sslrootcert", "sslnegotiation", "sslsni", "krbspn", "krbsrvname", "target_session_attrs",
	"service", "servicefile", "min_protocol_version", "max_protocol_version", "channel_binding", "require_auth",
	"statement_cache_capacity", "description_cache_capacity", "default_query_exec_mode"}, poolParams...)

// parseError is the error of NewPoolConfig for a DSN pgx could not parse:
// when pgx's reason names one of its parameters, that parameter and the
// reason, with what it quotes withheld (a misread DSN may put a password
// anywhere); else ErrInvalidDSN.
func parseError(err error, dsn string) error {
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) {
		return opterr.New(ErrInvalidDSN, "dsn")
	}
	// "cannot parse `<the DSN>`: <the reason> (<the error>)"
	msg := pce.Error()
	if i := strings.LastIndex(msg, "`: "); i >= 0 {
		msg = msg[i+len("`: "):]
	}
	for _, name := range dsnParams {
		if namesWord(msg, name) {
			reason := quotedText.ReplaceAllString(redact.Scrub(msg, append(redact.Secrets(dsn), pce.ConnString)), `"(withheld)"`)
			return opterr.Errorf("dsn", "postgres: dsn parameter %s is not valid: %s", name, reason)
		}
	}
	return opterr.New(ErrInvalidDSN, "dsn")
}

// quotedText is what an error message quotes.
var quotedText = regexp.MustCompile(`"[^"]*"|'[^']*'|` + "`[^`]*`")

// namesWord reports whether msg holds name as a word of its own.
func namesWord(msg, name string) bool {
	for i := 0; ; {
		j := strings.Index(msg[i:], name)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(name)
		if (start == 0 || !isWordByte(msg[start-1])) && (end == len(msg) || !isWordByte(msg[end])) {
			return true
		}
		i = end
	}
}

func isWordByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

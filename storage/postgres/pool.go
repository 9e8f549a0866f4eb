package postgres

import (
	"errors"
	"net"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
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
// included, so it is withheld.
var ErrInvalidDSN = errors.New("postgres: dsn is not a valid connection string (details withheld: they may contain the password)")

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
//     dropped if the server does not answer within a moment (a partition).
//
// It never connects.
func NewPoolConfig(dsn string, maxConns int) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, ErrInvalidDSN
	}
	switch {
	case maxConns > 0:
		cfg.MaxConns = int32(min(maxConns, 1<<30))
	case !strings.Contains(dsn, "pool_max_conns"):
		// pgxpool has applied its own default; the parsed config does
		// not say whether the DSN set one, the DSN does.
		cfg.MaxConns = int32(DefaultMaxConns())
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
	return cfg, nil
}

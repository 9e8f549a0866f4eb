// Package postgres is an idempotency store on PostgreSQL, for several
// Caddy instances (or any other processes) sharing one database.
//
// Records live in one table (see Schema) whose primary key (scope, key)
// decides every race. Reserve is one statement: a live record answers at
// once, read-only (replay, conflict, mismatch); otherwise an INSERT ... ON
// CONFLICT claims the key, or takes over an expired record or a lapsed
// lease, and of any number of concurrent reservers the primary key lets
// exactly one in. A new key costs two statements (Reserve, Complete), a
// replay one. Complete, Release and Renew name the lease by its token
// (fencing). All times come from the server's clock, so instances with
// skewed clocks agree on what has expired. Expired rows are deleted by a
// periodic cleanup that one instance at a time runs, under an advisory
// lock.
//
// Every session runs at READ COMMITTED, whatever the database's or the
// role's default (see NewPoolConfig), and statements PostgreSQL rolls
// back for a conflict (serialization failures, deadlocks) run again.
// Errors that mean the server could not be reached or did not answer in
// time wrap storage.ErrUnavailable; those that prove it answered do not
// (see errors.go). Keys it cannot index are refused (storage.KeyLimiter),
// and durations saturate at MaxDuration.
//
// Reserves and completions waiting at the same moment share one commit
// (batch.go), at most two batches of each kind in flight at a time; a batch never
// waits for a row another transaction holds, and a statement whose row is
// held tries again, in later batches, for at most Options.LockWait, and
// then fails for its key alone with storage.ErrBusy. A lapsed lease whose
// row was held is not taken over while its owner's renewal, which does
// wait for the row, may still land (see reserve.go). The leases of running
// requests are renewed all at once, in one statement over arrays, on
// connections of their own (storage.BatchRenewer, see renew.go).
//
// Waiting requests share one poll per key (storage.Waiter, see wait.go);
// LISTEN/NOTIFY was rejected, for the reasons given there.
//
// New never touches the network: the table is created on first use, and a
// store built while PostgreSQL is down starts working when it comes back.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Defaults used for Options fields that are zero (CleanupBatch and
// LapsedGrace: zero or negative).
const (
	DefaultTable           = "idempotency_keys"
	DefaultCleanupInterval = 5 * time.Minute
	DefaultCleanupBatch    = 1000
	DefaultLapsedGrace     = time.Hour
)

// Options configures a Store.
type Options struct {
	// Table is the table holding the records: a name, or schema.name, of
	// lower-case letters, digits and underscores (so that it means the same
	// table quoted or not). Default: idempotency_keys.
	Table string

	// CreateTable creates the table and its index on first use if they do
	// not exist. When false they must exist (see Schema).
	CreateTable bool

	// CleanupInterval is how often expired rows are deleted. Every store
	// on the same table tries; one at a time succeeds (advisory lock), the
	// others skip that round. Negative disables the periodic cleanup
	// (CleanupNow still works). Default: 5 minutes.
	CleanupInterval time.Duration

	// CleanupBatch is how many rows one cleanup transaction deletes at
	// most, so that row locks and WAL bursts stay small. Default: 1000.
	CleanupBatch int

	// LapsedGrace is how long cleanup keeps an in-flight row after its
	// lease lapsed. Such a row already counts as absent (anyone may take
	// the key over), but until somebody does, its owner may still renew,
	// complete or release it: a request that outlived its lease because
	// PostgreSQL was briefly unreachable can still record its response.
	// Default: 1 hour.
	LapsedGrace time.Duration

	// Timeout bounds each operation on the request path (Reserve, with
	// its lookup after a conflicting insert and its retries, Complete,
	// Release, Renew, Get, Delete, and creating the table on first use),
	// waiting for a pooled connection included, when the caller's context
	// has no earlier deadline. Zero leaves only the caller's context. A
	// statement that runs out of time is cancelled on the server too (see
	// NewPoolConfig). RenewBatch, which renews every lease due at once,
	// takes the caller's deadline even when it is longer, and Timeout
	// only when the caller's context has none.
	Timeout time.Duration

	// LockWait bounds how long a reservation, a completion or a release
	// waits for a row that another transaction holds (an operator's open
	// transaction, a client's concurrent retry, a stuck session) before
	// it gives up with an error wrapping storage.ErrBusy: that key's
	// request is answered at once, the statements batched with it run
	// again without it, and other keys never wait behind it. A row that
	// one of the store's own statements holds is held for a round trip
	// and a commit, milliseconds; one held far longer is held by someone
	// who will not let go within the request's Timeout. Zero or
	// negative: a quarter of Timeout, which leaves the statements
	// batched with a locked row three quarters of their time to run
	// again, but at least 50ms (so that a busy server's own commits are
	// not mistaken for a stuck row) and at most 500ms (500ms without a
	// Timeout). Waits for the table itself (a migration's lock) are not
	// bounded by it: they end with Timeout, as an outage.
	LockWait time.Duration

	// ScanTimeout bounds GetByHash and DeleteByHash, which compute the
	// key hash of every live row (a scan of the table, for an operator's
	// occasional lookup), so that a locked or huge table cannot hold the
	// admin API forever. Default: ten times Timeout, or a minute when
	// Timeout is zero.
	ScanTimeout time.Duration

	// OnNotReplicated, when set, is called for every reservation or
	// completion (op "reserve", "complete") whose commit's wait for a
	// synchronous standby was cancelled (see durability.go): it failed with
	// an error wrapping storage.ErrNotReplicated. It must not block.
	OnNotReplicated func(op string)

	// OnCleanup, when set, is called after every periodic cleanup with the
	// rows deleted and the error, ErrCleanupLocked when another store was
	// cleaning. It runs on the cleanup goroutine.
	OnCleanup func(deleted int64, err error)
}

// Lock waits the store chooses when Options.LockWait is not set (see
// there).
const (
	minLockWait = 50 * time.Millisecond
	maxLockWait = 500 * time.Millisecond
)

// lockWaitFor is the default lock wait of a store with the given Timeout.
func lockWaitFor(timeout time.Duration) time.Duration {
	if timeout <= 0 {
		return maxLockWait
	}
	return min(max(timeout/4, minLockWait), maxLockWait)
}

// renewalConns is the size of the pool of lease renewals (see
// RenewBatch): one tick's statement, the next tick's while a late one is
// still out, and the waiting renewals.
const renewalConns = 2 + maxWaitingRenewals

// maxWaitingRenewals bounds the waiting renewals (renewLocked), each
// queued on rows locked from outside while their owners' requests run:
// so many locks held by other transactions at once, each begun at
// another tick, keep their leases; beyond that, a lease whose row stays
// locked for longer than its length lapses (docs/storage-postgres.md).
const maxWaitingRenewals = 4

// Store is a storage.Store on a PostgreSQL table. Create it with New and
// release it with Close.
type Store struct {
	pool  *pgxpool.Pool
	table string // sanitized, ready to interpolate
	opts  Options
	sql   statements

	// renewals is the pool of RenewBatch alone, so that renewals never
	// wait behind reserves and completions for a connection;
	// renewalRoundTrips counts the pipelines it sent.
	renewals          *pgxpool.Pool
	renewalRoundTrips atomic.Int64

	// renewing holds the leases in a renewal on its way, waitingRenewals
	// counts the waiting renewals running (see RenewBatch).
	renewing        renewals
	waitingRenewals atomic.Int32

	// polls holds a place for each waiter poll's read under way (Wait).
	polls chan struct{}

	// schemaAttempt is the DDL run in progress, if any (guarded by
	// schemaMu); schemaReady skips the DDL once it succeeded.
	schemaMu      sync.Mutex
	schemaAttempt *attempt
	schemaReady   atomic.Bool

	// ddlLock and cleanupLock are advisory lock keys derived from the
	// table name, so that stores on other tables never block each other.
	ddlLock, cleanupLock int64

	// fallbacks counts Reserve calls that had to read the record in a
	// second statement; serializationFailures and deadlocks the Reserve
	// rounds PostgreSQL rolled back for a conflict (see reserve.go).
	fallbacks, serializationFailures, deadlocks atomic.Int64

	// syncWaitsCancelled counts the reservations and completions whose
	// wait for a synchronous standby was cancelled (see durability.go).
	syncWaitsCancelled atomic.Int64

	// watches shares one poll per key among the waiters (see wait.go).
	watches watches

	// reserves and completes batch the statements waiting at the same
	// moment into one commit (see batch.go); lastAnswer is when the server
	// last answered a batch (UnixNano).
	reserves, completes batcher
	lastAnswer          atomic.Int64

	// lockedSeen holds off the takeover of keys whose row a reserve found
	// locked (see Store.sawLocked).
	lockedSeen    lockedKeys
	lockedAnswers atomic.Int64 // reserve statements that found their row locked

	closed atomic.Bool // set by Close
	pinned bool        // the pool starts its sessions at READ COMMITTED

	// secrets are the passwords of the pool's connection string, which
	// every error is scrubbed of (see fail).
	secrets []string

	closeOnce   sync.Once
	life        context.Context    // ends with Close: the background work's (cleanup, a waiting renewal)
	stop        context.CancelFunc // ends life
	cleanupDone chan struct{}      // closed when it has returned
}

var _ storage.Store = (*Store)(nil)

// ErrCleanupLocked is returned by CleanupNow when another store (usually
// another instance) is cleaning the table: its run covers this one.
var ErrCleanupLocked = errors.New("postgres cleanup: another instance holds the cleanup lock")

// New returns a Store on pool and starts its cleanup goroutine. The store
// owns pool from then on: Close closes it. It also makes a second pool of
// two connections from pool's configuration, for lease renewals alone
// (see RenewBatch). New does not connect. With CreateTable the table is
// created on first use, and again on the next use if that fails; without,
// a missing table is an error of every operation.
func New(pool *pgxpool.Pool, opts Options) (*Store, error) {
	if pool == nil {
		return nil, errors.New("postgres: nil pool")
	}
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	table, err := sanitizeTable(opts.Table)
	if err != nil {
		return nil, err
	}
	if opts.CleanupInterval == 0 {
		opts.CleanupInterval = DefaultCleanupInterval
	}
	if opts.CleanupBatch <= 0 {
		opts.CleanupBatch = DefaultCleanupBatch
	}
	if opts.LapsedGrace <= 0 {
		opts.LapsedGrace = DefaultLapsedGrace
	}
	if opts.ScanTimeout <= 0 {
		opts.ScanTimeout = statementTimeout
		if opts.Timeout > 0 {
			opts.ScanTimeout = 10 * min(opts.Timeout, MaxDuration/10)
		}
	}
	if opts.LockWait <= 0 {
		opts.LockWait = lockWaitFor(opts.Timeout)
	}
	rcfg := pool.Config()
	rcfg.MaxConns, rcfg.MinConns, rcfg.MinIdleConns = renewalConns, 0, 0
	renewals, err := pgxpool.NewWithConfig(context.Background(), rcfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: the pool of lease renewals: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &Store{
		pool:        pool,
		renewals:    renewals,
		table:       table,
		opts:        opts,
		sql:         newStatements(table, opts.LockWait),
		ddlLock:     lockKey("ddl", table),
		cleanupLock: lockKey("cleanup", table),
		life:        ctx,
		stop:        stop,
		cleanupDone: make(chan struct{}),
		pinned:      pins(pool),
		secrets:     secretsOf(pool.Config().ConnConfig),
	}
	// Two batches of each kind in flight at a time at most (batch.go),
	// and never more than half the pool each, so that reserves and
	// completions together never ask for more connections than it has
	// (a batch holds one while it runs); their statements never wait for
	// a locked row, so a batch never holds up the statements queued
	// behind it.
	limit := min(maxBatches, max(1, int(pool.Config().MaxConns)/2))
	s.reserves.s, s.reserves.limit = s, limit
	s.completes.s, s.completes.limit = s, limit
	// The waiters' pollers read at most a quarter of the pool at once:
	// a burst of keys waited on (one poller each) never takes the
	// connections the reserves and completions need.
	s.polls = make(chan struct{}, max(1, int(pool.Config().MaxConns)/4))
	go s.cleanupLoop(ctx)
	return s, nil
}

// Close stops the cleanup goroutine, waiting for a run in progress to give
// up, and closes the pool. It is idempotent and returns nil.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.stop()
		<-s.cleanupDone
		s.pool.Close()
		s.renewals.Close()
	})
	return nil
}

// Ping implements storage.Pinger: it checks that the server answers and,
// in one statement that reads no row, that the table and every column the
// store uses exist (with CreateTable, once the table is created), so that
// a table missing, or made by an older version, is named at start-up and
// by the admin API rather than by every request.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	if err := s.ensureSchema(ctx); err != nil {
		return s.fail(ctx, "ping", err)
	}
	if _, err := s.pool.Exec(ctx, s.sql.columns); err != nil {
		return s.fail(ctx, "ping", err)
	}
	return nil
}

// Check implements storage.Checker: Ping without creating the table,
// and with the question Ping's DDL would answer by failing: whether the
// server takes writes. With CreateTable, a table or column that is
// missing is fine: the first use creates it.
func (s *Store) Check(ctx context.Context) error {
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	_, err := s.pool.Exec(ctx, s.sql.columns)
	var pgErr *pgconn.PgError
	if err != nil && s.opts.CreateTable && errors.As(err, &pgErr) && (pgErr.Code == undefinedTable || pgErr.Code == undefinedColumn) {
		err = nil
	}
	if err != nil {
		return s.fail(ctx, "check", err)
	}
	var readOnly bool
	if err := s.pool.QueryRow(ctx, `SELECT current_setting('transaction_read_only') = 'on'`).Scan(&readOnly); err != nil {
		return s.fail(ctx, "check", err)
	}
	if readOnly {
		return fmt.Errorf("postgres check: %w: %w", storage.ErrUnavailable, ErrReadOnly)
	}
	return nil
}

var _ storage.Checker = (*Store)(nil)

// Pool returns the store's connection pool, for its statistics. It is
// closed by Close; do not close it yourself.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Table returns the sanitized (quoted) table name the store uses.
func (s *Store) Table() string { return s.table }

// tablePart is one part of a table name. Lower case only: PostgreSQL folds
// unquoted names to lower case, so a quoted mixed-case name would not be
// the table an operator created by hand.
var tablePart = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// maxIdentifier is PostgreSQL's NAMEDATALEN-1: longer names are truncated
// by the server, which would make two configured names one table.
const maxIdentifier = 63

// sanitizeTable validates a name or schema.name and returns it quoted.
func sanitizeTable(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("postgres: table %q: want name or schema.name", name)
	}
	for _, p := range parts {
		if !tablePart.MatchString(p) || len(p) > maxIdentifier {
			return "", fmt.Errorf("postgres: table %q: each part must be 1-%d lower-case letters, digits or underscores, not starting with a digit", name, maxIdentifier)
		}
	}
	return pgx.Identifier(parts).Sanitize(), nil
}

// opContext applies the store's operation timeout to ctx.
func (s *Store) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return withTimeout(ctx, s.opts.Timeout)
}

// scanContext applies the store's timeout for scans of the table to ctx.
func (s *Store) scanContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return withTimeout(ctx, s.opts.ScanTimeout)
}

// withTimeout bounds ctx by d from now, unless d is not positive or ctx
// ends sooner anyway.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return ctx, func() {}
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// lockKey derives an advisory lock key for purpose on table. Advisory
// locks live in one key space per database, shared with any other
// application; a 64-bit hash with a product prefix keeps collisions out.
func lockKey(purpose, table string) int64 {
	h := fnv.New64a()
	h.Write([]byte("caddy-idempotency/" + purpose + "/" + table))
	return int64(h.Sum64())
}

package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// What keeps a reservation across a failover is the server's, not the
// store's: a commit is acknowledged once it is in the primary's WAL, and
// a standby promoted after the primary died has it only if the commit
// waited for that standby (synchronous_standby_names, with
// synchronous_commit on, remote_write or remote_apply). The store reports
// those settings, as its sessions see them, at start-up and in the admin
// API, so that an operator sees whether the guarantee survives a
// promotion (docs/storage-postgres.md, Failover).

var _ storage.DurabilityReporter = (*Store)(nil)

// Durability is what the server a store is connected to says about
// keeping the records across a failover.
type Durability struct {
	// Server is the address of the server that answered: of a multi-host
	// DSN, the host the pool is connected to.
	Server string `json:"server"`
	// InRecovery is pg_is_in_recovery(): the server is a standby, which
	// refuses every write.
	InRecovery bool `json:"in_recovery"`
	// TransactionReadOnly and DefaultTransactionReadOnly are the store's
	// session's transaction_read_only and default_transaction_read_only:
	// true on a standby, or when the database or role defaults to
	// read-only transactions; the store's writes then fail.
	TransactionReadOnly        bool `json:"transaction_read_only"`
	DefaultTransactionReadOnly bool `json:"default_transaction_read_only"`
	// SynchronousCommit is the store's session's synchronous_commit: what
	// the commit of a reservation or a completion waits for (off, local,
	// remote_write, on, remote_apply). Lease renewals commit with off
	// whatever it says (see RenewBatch).
	SynchronousCommit string `json:"synchronous_commit"`
	// SynchronousStandbyNames is the standbys a commit waits for; empty
	// when replication is asynchronous.
	SynchronousStandbyNames string `json:"synchronous_standby_names"`
	// Fsync is the server's fsync: off, a crash of the server may lose or
	// corrupt what was committed.
	Fsync string `json:"fsync"`
	// Synchronous reports whether a commit waits until a synchronous
	// standby has it (standby names set, and synchronous_commit on,
	// remote_write or remote_apply): then a reservation the store was
	// told of is on the standby a failover promotes.
	Synchronous bool `json:"synchronous"`
	// Standbys are the standbys streaming from this server
	// (pg_stat_replication).
	Standbys []Standby `json:"standbys"`
	// SyncWaitsCancelled counts the reservations and completions of the
	// store, since it started, whose commit's wait for a synchronous
	// standby its timeout cancelled: committed on the primary alone, they
	// failed as not replicated (see durability.go below).
	SyncWaitsCancelled int64 `json:"sync_waits_cancelled"`
}

// Standby is a standby streaming from the server.
type Standby struct {
	// Name is its application_name.
	Name string `json:"name"`
	// SyncState is async, potential, sync or quorum; empty when the
	// store's role may not see it (it needs pg_read_all_stats).
	SyncState string `json:"sync_state"`
}

// ErrReadOnly (which wraps storage.ErrReadOnly) is wrapped, with
// storage.ErrUnavailable, by the errors of a store connected to a server
// that refuses writes: a standby, a
// primary demoted by a failover, or a primary whose database or role
// defaults to read-only transactions (default_transaction_read_only,
// which target_session_attrs=read-write skips as it skips a standby). A
// refused statement does not say which, so the error names both. The
// store drops the pool's connections when it meets one, so that the next
// statements connect afresh.
var ErrReadOnly = fmt.Errorf("%w: connected to a read-only server: the records cannot be written there; "+
	"a standby (in recovery, or an old primary after a failover): list every host in the DSN with target_session_attrs=read-write "+
	"(host=a,b ... target_session_attrs=read-write, or postgres://a,b/db?target_session_attrs=read-write) so that connections go to the primary; "+
	"a primary whose database or role sets default_transaction_read_only on: turn it off; the pool reconnects", storage.ErrReadOnly)

// durabilitySQL reads the facts in one statement. Both arrays come from
// one scan of pg_stat_replication, in the same order.
const durabilitySQL = `SELECT pg_is_in_recovery(),
	current_setting('transaction_read_only') = 'on',
	current_setting('default_transaction_read_only') = 'on',
	current_setting('synchronous_commit'),
	current_setting('synchronous_standby_names'),
	current_setting('fsync'),
	coalesce(array_agg(coalesce(r.application_name, '') ORDER BY r.pid) FILTER (WHERE r.pid IS NOT NULL), '{}'),
	coalesce(array_agg(coalesce(r.sync_state, '') ORDER BY r.pid) FILTER (WHERE r.pid IS NOT NULL), '{}')
FROM (SELECT 1) AS one LEFT JOIN pg_stat_replication AS r ON true`

// Facts asks the server the store's pool is connected to what protects
// the records across a failover. When it refuses writes, the facts come
// with an error wrapping ErrReadOnly, and the pool's connections are
// dropped (see ErrReadOnly).
func (s *Store) Facts(ctx context.Context) (Durability, error) {
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	var d Durability
	c, err := s.acquire(ctx)
	if err != nil {
		return d, s.fail(ctx, "durability", err)
	}
	defer c.Release()
	d.Server = c.Conn().PgConn().Conn().RemoteAddr().String()
	var names, states []string
	err = c.QueryRow(ctx, durabilitySQL).Scan(&d.InRecovery, &d.TransactionReadOnly, &d.DefaultTransactionReadOnly,
		&d.SynchronousCommit, &d.SynchronousStandbyNames, &d.Fsync, &names, &states)
	if err != nil {
		return Durability{}, s.fail(ctx, "durability", err)
	}
	d.Standbys = make([]Standby, len(names))
	for i := range names {
		d.Standbys[i] = Standby{Name: names[i], SyncState: states[i]}
	}
	switch d.SynchronousCommit {
	case "on", "remote_write", "remote_apply":
		d.Synchronous = d.SynchronousStandbyNames != ""
	}
	d.SyncWaitsCancelled = s.syncWaitsCancelled.Load()
	if d.InRecovery || d.TransactionReadOnly {
		s.dropConnections()
		return d, fmt.Errorf("postgres durability: %w: %w (server %s)", storage.ErrUnavailable, ErrReadOnly, d.Server)
	}
	if d.Synchronous && !d.syncStandbyStreams() {
		return d, fmt.Errorf("postgres durability: %w: %w: commits wait for a synchronous standby (synchronous_standby_names %q) and none is streaming from %s: "+
			"each reservation waits the storage's timeout, then fails as a store error (on_storage_error)", storage.ErrUnavailable, storage.ErrNotReplicated, d.SynchronousStandbyNames, d.Server)
	}
	return d, d.risks()
}

// risks says what the server may lose of the records without a fault of
// the store's: with fsync off a crash may lose or corrupt what was
// committed, with synchronous_commit off (for the store's sessions) a
// crash loses the last commits, reservations the store was told of among
// them. nil when there is nothing to say. The start-up line warns with
// it.
func (d Durability) risks() error {
	var out []string
	if d.Fsync == "off" {
		out = append(out, "fsync is off: a crash of the server may lose or corrupt the records (and a retry of a request they recorded then runs again); turn fsync on")
	}
	if d.SynchronousCommit == "off" {
		out = append(out, "synchronous_commit is off for the store's sessions: a commit is acknowledged before it is on disk, and a crash of the server loses the last reservations and records (a retry then runs again); set it to on (or local) for the store's role or database")
	}
	if len(out) == 0 {
		return nil
	}
	return fmt.Errorf("postgres durability (server %s): %s", d.Server, strings.Join(out, "; "))
}

// syncStandbyStreams reports whether a standby the commits can wait for
// streams: one in sync (or quorum) state, or any when the store's role
// may not see the states.
func (d Durability) syncStandbyStreams() bool {
	for _, sb := range d.Standbys {
		if sb.SyncState == "sync" || sb.SyncState == "quorum" || sb.SyncState == "" {
			return true
		}
	}
	return false
}

// Durability implements storage.DurabilityReporter: the Facts.
func (s *Store) Durability(ctx context.Context) (any, error) {
	d, err := s.Facts(ctx)
	if d.SynchronousCommit == "" {
		return nil, err // the server did not answer
	}
	return d, err
}

// A commit that waits for a synchronous standby waits for as long as the
// standby is away: PostgreSQL has no setting that bounds that wait on the
// server (statement_timeout does not cover it: a statement's timer is
// stopped before its commit), and the only way to end it is to cancel it
// (a cancel request, the store's Timeout; pg_cancel_backend; a session
// terminated). A cancelled wait does not undo the commit: the server has
// already committed it locally, warns (SQLSTATE 01000, "canceling wait
// for synchronous replication ... The transaction has already committed
// locally, but might not have been replicated to the standby") and
// answers success. A standby promoted after that may not have the write.
//
// Not cancelling was considered, and rejected: the request would wait for
// as long as the standby is away, holding a server connection and the
// key's row lock all along (a connection the client closes leaves its
// backend waiting still), so that a cut-off standby under load would
// exhaust max_connections. So the store cancels the wait at its Timeout,
// as every statement, and reads the warning: pool connections made by
// NewPoolConfig note it (noteSyncWaitCancelled, their OnNotice), and the
// statement whose commit it followed fails with errSyncWaitCancelled,
// which wraps storage.ErrNotReplicated and storage.ErrUnavailable, as a
// Redis reservation short of its replicas does: a reservation then
// follows on_storage_error (fail_open runs on it: it holds its key on the
// primary), and a completion is sent again, by the caller's aftercare,
// until a commit of it is acknowledged (see confirm).

// syncWaitCancelledKey marks, in a connection's custom data, that the
// server warned that it cancelled a commit's wait for a synchronous
// standby since the connection was acquired.
const syncWaitCancelledKey = "caddy-idempotency/sync-wait-cancelled"

// errSyncWaitCancelled is the error of a statement whose commit's wait
// for a synchronous standby was cancelled.
var errSyncWaitCancelled = fmt.Errorf("%w: %w: the commit's wait for a synchronous standby was cancelled (the store's timeout) and it committed on the primary alone: "+
	"a standby promoted now may not have it", storage.ErrUnavailable, storage.ErrNotReplicated)

// noteSyncWaitCancelled is the OnNotice of the pools NewPoolConfig makes:
// it marks the connection when the server cancelled a commit's wait for
// a synchronous standby. Other notices are dropped, as pgx does without a
// handler.
func noteSyncWaitCancelled(c *pgconn.PgConn, n *pgconn.Notice) {
	if syncWaitCancelled(n) {
		c.CustomData()[syncWaitCancelledKey] = true
	}
}

// syncWaitCancelled reports whether n is PostgreSQL's warning of a
// cancelled wait for synchronous replication. Its message is translated
// (lc_messages); the function that raised it, SyncRepWaitForLSN, is not.
// The English messages stand in for a server that does not say where.
func syncWaitCancelled(n *pgconn.Notice) bool {
	if n.Code != warningCode {
		return false
	}
	return n.Routine == "SyncRepWaitForLSN" ||
		strings.HasPrefix(n.Message, "canceling wait for synchronous replication") ||
		strings.HasPrefix(n.Message, "canceling the wait for synchronous replication")
}

// warningCode is SQLSTATE 01000, warning.
const warningCode = "01000"

// forgetSyncWait clears the mark of a connection being acquired, so that
// a wait cancelled under an earlier use (a cleanup, a delete) is not
// taken for the next statement's. It is the PrepareConn of the pools
// NewPoolConfig makes.
func forgetSyncWait(_ context.Context, c *pgx.Conn) (bool, error) {
	delete(c.PgConn().CustomData(), syncWaitCancelledKey)
	return true, nil
}

// replicated is called once the result of the statements sent on c is
// read, with err, the result's error: it returns err, or
// errSyncWaitCancelled when their commit's wait for a synchronous standby
// was cancelled meanwhile (committed, on the primary alone).
func replicated(c *pgxpool.Conn, err error) error {
	data := c.Conn().PgConn().CustomData()
	if data[syncWaitCancelledKey] == nil {
		return err
	}
	delete(data, syncWaitCancelledKey)
	if err != nil {
		// The commit happened: what failed after it (the connection
		// given up after the cancel) does not make it unknown.
		return fmt.Errorf("%w (then: %v)", errSyncWaitCancelled, err)
	}
	return errSyncWaitCancelled
}

// waitedFor is err, the error of operation op, as the caller is to see
// it: a cancelled wait for a synchronous standby fails a reservation or a
// completion (and is counted: Options.OnNotReplicated), not a release or
// a renewal, whose loss in a failover costs no second run (the key stays
// in flight until its lease lapses; a renewal lost leaves the lease
// lapsing at the previous renewal's time, and the next one reaches the
// new primary), as Redis does not wait for them either.
func (s *Store) waitedFor(op string, err error) error {
	if !errors.Is(err, errSyncWaitCancelled) {
		return err
	}
	if op != "reserve" && op != "complete" {
		return nil
	}
	s.syncWaitsCancelled.Add(1)
	if s.opts.OnNotReplicated != nil {
		s.opts.OnNotReplicated(op)
	}
	return err
}

// confirm is Complete for a lease whose record is no longer in flight.
// When it is completed by that lease (an earlier Complete of it, whose
// answer was lost, or whose wait for a synchronous standby was
// cancelled), the row is rewritten unchanged, in a commit that waits for
// the standby as the completion's did: the standby has the completion
// once it acknowledges that later commit. Complete then reports
// storage.ErrLeaseLost still (the record is not the lease's to write any
// more), or the commit's errSyncWaitCancelled again; the caller's
// aftercare sends it again until the former. Any other row, or none, is
// storage.ErrLeaseLost at once.
func (s *Store) confirm(ctx context.Context, key storage.Key, token storage.Token) error {
	var tag pgconn.CommandTag
	item := &batchItem{sql: s.sql.confirm, args: []any{key.Scope, key.ID, int64(token)}, order: key.Scope + "\x00" + key.ID,
		read: func(br pgx.BatchResults) (err error) { tag, err = br.Exec(); return err }}
	err := retry(ctx, func() error { return s.alone(ctx, item) })
	if err = s.waitedFor("complete", err); err != nil {
		return s.fail(ctx, "complete", err)
	}
	if tag.RowsAffected() == 0 {
		return storage.ErrLeaseLost
	}
	return errCompletedByLease
}

// errCompletedByLease is Complete's answer when the record is already
// completed by the same lease (and, with a synchronous standby, the
// standby has it).
var errCompletedByLease = fmt.Errorf("%w: the record is completed by this lease already", storage.ErrLeaseLost)

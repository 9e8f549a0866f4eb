package postgres

import (
	"context"
	"errors"
	"fmt"

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
	// Synchronous reports whether a commit waits until a synchronous
	// standby has it (standby names set, and synchronous_commit on,
	// remote_write or remote_apply): then a reservation the store was
	// told of is on the standby a failover promotes.
	Synchronous bool `json:"synchronous"`
	// Standbys are the standbys streaming from this server
	// (pg_stat_replication).
	Standbys []Standby `json:"standbys"`
}

// Standby is a standby streaming from the server.
type Standby struct {
	// Name is its application_name.
	Name string `json:"name"`
	// SyncState is async, potential, sync or quorum; empty when the
	// store's role may not see it (it needs pg_read_all_stats).
	SyncState string `json:"sync_state"`
}

// ErrReadOnly is wrapped, with storage.ErrUnavailable, by the errors of
// a store connected to a server that refuses writes: a standby, a
// primary demoted by a failover, or a primary whose database or role
// defaults to read-only transactions (default_transaction_read_only,
// which target_session_attrs=read-write skips as it skips a standby). A
// refused statement does not say which, so the error names both. The
// store drops the pool's connections when it meets one, so that the next
// statements connect afresh.
var ErrReadOnly = errors.New("connected to a read-only server: the records cannot be written there; " +
	"a standby (in recovery, or an old primary after a failover): list every host in the DSN with target_session_attrs=read-write " +
	"(host=a,b ... target_session_attrs=read-write, or postgres://a,b/db?target_session_attrs=read-write) so that connections go to the primary; " +
	"a primary whose database or role sets default_transaction_read_only on: turn it off; the pool reconnects")

// durabilitySQL reads the facts in one statement. Both arrays come from
// one scan of pg_stat_replication, in the same order.
const durabilitySQL = `SELECT pg_is_in_recovery(),
	current_setting('transaction_read_only') = 'on',
	current_setting('default_transaction_read_only') = 'on',
	current_setting('synchronous_commit'),
	current_setting('synchronous_standby_names'),
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
		&d.SynchronousCommit, &d.SynchronousStandbyNames, &names, &states)
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
	if d.InRecovery || d.TransactionReadOnly {
		s.dropConnections()
		return d, fmt.Errorf("postgres durability: %w: %w (server %s)", storage.ErrUnavailable, ErrReadOnly, d.Server)
	}
	return d, nil
}

// Durability implements storage.DurabilityReporter: the Facts.
func (s *Store) Durability(ctx context.Context) (any, error) {
	d, err := s.Facts(ctx)
	if d.SynchronousCommit == "" {
		return nil, err // the server did not answer
	}
	return d, err
}

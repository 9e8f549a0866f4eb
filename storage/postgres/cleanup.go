package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// statementTimeout bounds each statement of a cleanup run. The statements
// are not cancelled with the run's context (see CleanupNow), so this is
// what keeps a stuck one from holding Close forever.
const statementTimeout = time.Minute

// cleanupLoop runs CleanupNow every CleanupInterval until ctx is done. It
// never runs at start-up: New must not touch the network, and every
// instance restarting at once would all try.
func (s *Store) cleanupLoop(ctx context.Context) {
	defer close(s.cleanupDone)
	if s.opts.CleanupInterval < 0 {
		return
	}
	t := time.NewTicker(s.opts.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n, err := s.CleanupNow(ctx)
			if ctx.Err() != nil {
				return // closing: the error is ours, not the database's
			}
			if s.opts.OnCleanup != nil {
				s.opts.OnCleanup(n, err)
			}
		}
	}
}

// CleanupNow deletes expired rows (and in-flight rows whose lease lapsed
// more than LapsedGrace ago) in batches of CleanupBatch, each batch its own
// transaction, until a batch comes back short or ctx is done. It returns
// how many rows it deleted, with ErrCleanupLocked when another store is
// cleaning the same table at the moment.
//
// One store at a time cleans: the run holds a session advisory lock on one
// pooled connection and runs its batches on that connection (a
// transaction-scoped lock would end with the first batch). ctx is checked
// between statements rather than cancelling one: pgx gives up on a
// cancelled statement by breaking the connection while the server goes on
// running it, holding the lock, so a Close in mid-run would keep the next
// instance from cleaning for as long as the batch takes. A batch is short,
// so stopping between batches is prompt. If giving the lock back fails,
// the connection is closed, which releases it too.
func (s *Store) CleanupNow(ctx context.Context) (deleted int64, err error) {
	if err := s.ensureSchema(ctx); err != nil {
		return 0, s.fail(ctx, "cleanup", err)
	}
	conn, err := s.acquire(ctx)
	if err != nil {
		return 0, s.fail(ctx, "cleanup", err)
	}
	// Statements outlive ctx (see above), each within statementTimeout.
	stmtCtx := context.WithoutCancel(ctx)
	exec := func(sql string, args ...any) (pgconn.CommandTag, error) {
		c, cancel := context.WithTimeout(stmtCtx, statementTimeout)
		defer cancel()
		return conn.Exec(c, sql, args...)
	}
	lock := func(sql string) (bool, error) {
		c, cancel := context.WithTimeout(stmtCtx, statementTimeout)
		defer cancel()
		var ok bool
		err := conn.QueryRow(c, sql, s.cleanupLock).Scan(&ok)
		return ok, err
	}
	locked, err := lock(s.sql.tryCleanupLock)
	if err != nil {
		// Whether the lock was taken is unknown: end the session.
		closeConn(conn)
		return 0, s.fail(ctx, "cleanup", err)
	}
	if !locked {
		conn.Release()
		return 0, ErrCleanupLocked
	}
	defer func() {
		unlocked, uerr := lock(s.sql.cleanupDone)
		switch {
		case uerr != nil:
			closeConn(conn) // the session may still hold the lock
		case !unlocked:
			// Our session no longer holds the lock it took: something
			// between us and PostgreSQL moved the statements to another
			// session, and the lock stays behind there.
			conn.Release()
			if err == nil {
				err = s.fail(ctx, "cleanup", errSessionLost)
			}
		default:
			conn.Release()
		}
	}()

	grace, batch := micros(s.opts.LapsedGrace), s.opts.CleanupBatch
	for {
		var tag pgconn.CommandTag
		err := retry(ctx, func() error {
			var err error
			tag, err = exec(s.sql.cleanupBatch, grace, batch)
			return err
		})
		if err != nil {
			return deleted, s.fail(ctx, "cleanup", err)
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return deleted, nil
		}
		if err := ctx.Err(); err != nil {
			return deleted, s.fail(ctx, "cleanup", err)
		}
	}
}

// errSessionLost explains an advisory lock that vanished from its session.
var errSessionLost = errors.New("the cleanup lock was not held by this session when released; " +
	"cleanup needs a session of its own, which a transaction-pooling proxy (PgBouncer pool_mode=transaction) does not keep: " +
	"connect to PostgreSQL directly or through a session pool")

// closeConn takes conn out of the pool and closes it, ending its session
// and with it any advisory lock the session holds.
func closeConn(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Hijack().Close(ctx)
}

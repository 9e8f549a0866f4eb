package postgres

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// pinnedKey marks, in a connection's custom data, a session the store set
// to READ COMMITTED itself.
const pinnedKey = "caddy-idempotency/read-committed"

// pinSQL makes READ COMMITTED the session's default, overriding the
// database's and the role's.
const pinSQL = `SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED`

// pins reports whether every session of pool starts at READ COMMITTED:
// its configuration asks for it in the start-up packet, as NewPoolConfig
// does.
func pins(pool *pgxpool.Pool) bool {
	return pool.Config().ConnConfig.RuntimeParams[isolationParam] == readCommitted
}

// acquire returns a pooled connection whose session runs at READ
// COMMITTED. A pool made by NewPoolConfig starts its sessions so; on any
// other pool, the store sets each session once, the first time it uses
// it, which costs one statement per connection. (The store also retries
// the serialization failures other levels cause: see retryable.)
func (s *Store) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	return acquireFrom(ctx, s.pool, s.pinned)
}

// acquireFrom is acquire on any pool of the store's (pinned: whether its
// sessions start at READ COMMITTED).
func acquireFrom(ctx context.Context, pool *pgxpool.Pool, pinned bool) (*pgxpool.Conn, error) {
	c, err := pool.Acquire(ctx)
	if err != nil || pinned {
		return c, err
	}
	data := c.Conn().PgConn().CustomData()
	if data[pinnedKey] == nil {
		if _, err := c.Exec(ctx, pinSQL); err != nil {
			c.Release()
			return nil, err
		}
		data[pinnedKey] = true
	}
	return c, nil
}

// queryRow runs a statement on a READ COMMITTED session and scans its row
// into dest.
func (s *Store) queryRow(ctx context.Context, dest []any, sql string, args ...any) error {
	c, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	return c.QueryRow(ctx, sql, args...).Scan(dest...)
}

// scanRow is queryRow for a row that scanRecord reads.
func (s *Store) scanRow(ctx context.Context, sql string, args ...any) (*storage.Record, error) {
	c, err := s.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Release()
	return scanRecord(c.QueryRow(ctx, sql, args...))
}

// execOnce runs a statement on a READ COMMITTED session.
func (s *Store) execOnce(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c, err := s.acquire(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer c.Release()
	tag, err := c.Exec(ctx, sql, args...)
	return tag, replicated(c, err)
}

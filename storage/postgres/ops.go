package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Complete implements storage.Store. The response is encoded into the row;
// the store keeps no reference to resp.
func (s *Store) Complete(ctx context.Context, key storage.Key, token storage.Token, resp *storage.Response, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("postgres complete: ttl %v is not positive", ttl)
	}
	if resp == nil {
		return errors.New("postgres complete: nil response")
	}
	headers := storage.AppendHeader(nil, resp.Header)
	detail := resp.Detail
	if len(detail) == 0 {
		detail = nil // NULL
	}
	return s.leaseOp(ctx, "complete", s.sql.complete, key, token,
		int32(resp.Status), headers, resp.Body, resp.BodyOmitted, micros(ttl), detail)
}

// Release implements storage.Store.
func (s *Store) Release(ctx context.Context, key storage.Key, token storage.Token) error {
	return s.leaseOp(ctx, "release", s.sql.release, key, token)
}

// Renew implements storage.Store.
func (s *Store) Renew(ctx context.Context, key storage.Key, token storage.Token, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("postgres renew: lease %v is not positive", lease)
	}
	return s.leaseOp(ctx, "renew", s.sql.renew, key, token, micros(lease))
}

// leaseOp runs a statement that acts on the in-flight row held by token
// (scope, key and token are its first three parameters, then args), and
// reports storage.ErrLeaseLost when it matched no row.
func (s *Store) leaseOp(ctx context.Context, op, sql string, key storage.Key, token storage.Token, args ...any) error {
	if token == 0 {
		return storage.ErrLeaseLost // zero never names a lease: save the round trip
	}
	if err := s.ensureSchema(ctx); err != nil {
		return s.fail(op, err)
	}
	tag, err := s.exec(ctx, sql, append([]any{key.Scope, key.ID, int64(token)}, args...)...)
	if err != nil {
		return s.fail(op, err)
	}
	if tag.RowsAffected() == 0 {
		return storage.ErrLeaseLost
	}
	return nil
}

// exec runs one statement under the store's timeout.
func (s *Store) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	return s.pool.Exec(ctx, sql, args...)
}

// Get implements storage.Store.
func (s *Store) Get(ctx context.Context, key storage.Key, withBody bool) (*storage.Record, error) {
	if err := s.ensureSchema(ctx); err != nil {
		return nil, s.fail("get", err)
	}
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	rec, err := scanRecord(s.pool.QueryRow(ctx, s.sql.get, key.Scope, key.ID, withBody))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, storage.ErrNotFound
	case errors.Is(err, storage.ErrCorrupt):
		return nil, fmt.Errorf("postgres get: %w", err)
	case err != nil:
		return nil, s.fail("get", err)
	}
	return rec, nil
}

// Delete implements storage.Store. Like Get, it sees live rows only: an
// expired row or a lapsed lease is already absent, and cleanup removes it.
func (s *Store) Delete(ctx context.Context, key storage.Key) error {
	if err := s.ensureSchema(ctx); err != nil {
		return s.fail("delete", err)
	}
	tag, err := s.exec(ctx, s.sql.delete, key.Scope, key.ID)
	if err != nil {
		return s.fail("delete", err)
	}
	if tag.RowsAffected() == 0 {
		return storage.ErrNotFound
	}
	return nil
}

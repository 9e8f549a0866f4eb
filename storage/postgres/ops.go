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
// the store keeps no reference to resp. A response that could not be
// replayed (storage.CheckResponse) is refused before any I/O.
func (s *Store) Complete(ctx context.Context, key storage.Key, token storage.Token, resp *storage.Response, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("postgres complete: %w: ttl %v is not positive", storage.ErrInvalid, ttl)
	}
	if err := storage.CheckResponse(resp); err != nil {
		return fmt.Errorf("postgres complete: %w", err)
	}
	headers := storage.AppendHeader(nil, resp.Header)
	detail := resp.Detail
	if len(detail) == 0 {
		detail = nil // NULL
	}
	state := int16(stateCompleted)
	if resp.OutcomeUnknown {
		state = stateOutcomeUnknown
	}
	return s.leaseOp(ctx, "complete", s.sql.complete, key, token,
		int32(resp.Status), headers, resp.Body, resp.BodyOmitted, micros(ttl), detail, state)
}

// Release implements storage.Store.
func (s *Store) Release(ctx context.Context, key storage.Key, token storage.Token) error {
	return s.leaseOp(ctx, "release", s.sql.release, key, token)
}

// Renew implements storage.Store.
func (s *Store) Renew(ctx context.Context, key storage.Key, token storage.Token, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("postgres renew: %w: lease %v is not positive", storage.ErrInvalid, lease)
	}
	return s.leaseOp(ctx, "renew", s.sql.renew, key, token, micros(lease))
}

// leaseOp runs a statement that acts on the in-flight row held by token
// (scope, key and token are its first three parameters, then args), and
// reports storage.ErrLeaseLost when it matched no row. A statement rolled
// back for a conflict changed nothing and runs again: the row it then
// finds decides, as if the statement had come a moment later.
func (s *Store) leaseOp(ctx context.Context, op, sql string, key storage.Key, token storage.Token, args ...any) error {
	if token == 0 {
		return storage.ErrLeaseLost // zero never names a lease: save the round trip
	}
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	if err := s.ensureSchema(ctx); err != nil {
		return s.fail(ctx, op, err)
	}
	var affected bool
	item := &batchItem{sql: sql, args: append([]any{key.Scope, key.ID, int64(token)}, args...), order: key.Scope + "\x00" + key.ID,
		read: func(br pgx.BatchResults) error {
			tag, err := br.Exec()
			affected = tag.RowsAffected() > 0
			return err
		}}
	// Each goes after the guard (batch.go), which bounds its wait for a
	// row another transaction holds: then its error wraps storage.ErrBusy.
	var err error
	if op == "complete" {
		// Completions waiting at the same moment share one commit
		// (batch.go); the statement never waits for a locked row, and
		// says so instead (errRowLocked).
		item.read = func(br pgx.BatchResults) error {
			var locked bool
			if err := br.QueryRow().Scan(&affected, &locked); err != nil {
				return err
			}
			if locked {
				return errRowLocked
			}
			return nil
		}
		err = s.completes.do(ctx, item)
	} else {
		err = s.alone(ctx, item)
	}
	if errors.Is(err, errBatchRolledBack) || retryable(err) {
		// A batch the server refused, or a statement rolled back for a
		// conflict, changed nothing: the statement runs on its own.
		err = retry(ctx, func() error { return s.alone(ctx, item) })
	}
	if err = s.waitedFor(op, err); err != nil {
		return s.fail(ctx, op, err)
	}
	if !affected && op == "complete" {
		// Not its in-flight row: the completion may be sent again after
		// one a synchronous standby missed (confirm), else the lease is
		// gone.
		return s.confirm(ctx, key, token)
	}
	if !affected {
		return storage.ErrLeaseLost
	}
	return nil
}

// exec runs one statement, again after a conflict (see retry).
func (s *Store) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	var tag pgconn.CommandTag
	err := retry(ctx, func() error {
		var err error
		tag, err = s.execOnce(ctx, sql, args...)
		return err
	})
	return tag, err
}

// Get implements storage.Store.
func (s *Store) Get(ctx context.Context, key storage.Key, withBody bool) (*storage.Record, error) {
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	if err := s.ensureSchema(ctx); err != nil {
		return nil, s.fail(ctx, "get", err)
	}
	var rec *storage.Record
	err := retry(ctx, func() error {
		var err error
		rec, err = s.scanRow(ctx, s.sql.get, key.Scope, key.ID, withBody)
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, storage.ErrNotFound
	case err != nil:
		return nil, s.fail(ctx, "get", err)
	}
	return rec, nil
}

// Delete implements storage.Store. Like Get, it sees live rows only: an
// expired row or a lapsed lease is already absent, and cleanup removes it.
func (s *Store) Delete(ctx context.Context, key storage.Key) error {
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	if err := s.ensureSchema(ctx); err != nil {
		return s.fail(ctx, "delete", err)
	}
	tag, err := s.exec(ctx, s.sql.delete, key.Scope, key.ID)
	if err != nil {
		return s.fail(ctx, "delete", err)
	}
	if tag.RowsAffected() == 0 {
		return storage.ErrNotFound
	}
	return nil
}

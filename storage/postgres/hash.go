package postgres

import (
	"context"
	"encoding/hex"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

var _ storage.HashFinder = (*Store)(nil)

// GetByHash implements storage.HashFinder. It computes every live row's
// key hash in the database: a scan of the table, bounded by ScanTimeout.
func (s *Store) GetByHash(ctx context.Context, hash string, withBody bool) ([]*storage.Record, error) {
	prefix, err := hex.DecodeString(hash)
	if err != nil || len(prefix) != storage.HashLen/2 || hex.EncodeToString(prefix) != hash {
		return nil, nil
	}
	ctx, cancel := s.scanContext(ctx)
	defer cancel()
	if err := s.ensureSchema(ctx); err != nil {
		return nil, s.fail(ctx, "get", err)
	}
	var out []*storage.Record
	err = s.scan(ctx, func(tx pgx.Tx) error {
		out = nil
		rows, err := tx.Query(ctx, s.sql.getByHash, prefix, withBody)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			rec, err := scanRecord(rows)
			if err != nil {
				return err
			}
			out = append(out, rec)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, s.fail(ctx, "get", err)
	}
	return out, nil
}

// DeleteByHash implements storage.HashFinder, with GetByHash's scan.
func (s *Store) DeleteByHash(ctx context.Context, hash string) (int, error) {
	return s.deleteHashed(ctx, hash, s.sql.deleteByHash)
}

// deleteHashed runs sql, a DELETE of the rows whose key hash starts with
// its $1, for hash (a malformed one names no row) in a scan's
// transaction, and returns how many rows went.
func (s *Store) deleteHashed(ctx context.Context, hash, sql string) (int, error) {
	prefix, err := hex.DecodeString(hash)
	if err != nil || len(prefix) != storage.HashLen/2 || hex.EncodeToString(prefix) != hash {
		return 0, nil
	}
	ctx, cancel := s.scanContext(ctx)
	defer cancel()
	if err := s.ensureSchema(ctx); err != nil {
		return 0, s.fail(ctx, "delete", err)
	}
	var n int64
	err = s.scan(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sql, prefix)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, s.fail(ctx, "delete", err)
	}
	return int(n), nil
}

// scan runs fn, a statement scanning the whole table, in a transaction at
// READ COMMITTED whatever the session's default: under SERIALIZABLE a
// scan conflicts with every concurrent write to the table, and retrying
// would rarely get through on a busy one. The three round trips do not
// matter for an operator's lookup.
func (s *Store) scan(ctx context.Context, fn func(pgx.Tx) error) error {
	return retry(ctx, func() error {
		return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, fn)
	})
}

// scanRecord reads a row of the get statements.
func scanRecord(row pgx.Row) (*storage.Record, error) {
	var (
		rec           storage.Record
		state         int16
		token         int64
		status        int32
		headers, body []byte
		bodyOmitted   bool
	)
	if err := row.Scan(&rec.Fingerprint, &state, &token, &rec.CreatedAt, &rec.ExpiresAt, &status, &headers, &body, &bodyOmitted); err != nil {
		return nil, err
	}
	switch state {
	case stateInFlight:
		rec.State = storage.InFlight
		rec.Token = storage.Token(token)
	case stateCompleted, stateOutcomeUnknown:
		rec.State = storage.Completed
		resp, err := response(status, headers, body, bodyOmitted)
		if err != nil {
			return nil, err
		}
		resp.OutcomeUnknown = state == stateOutcomeUnknown
		rec.Response = resp
	default:
		return nil, fmt.Errorf("%w: state %d", storage.ErrCorrupt, state)
	}
	return &rec, nil
}

var _ storage.InFlightLister = (*Store)(nil)

// ListInFlight implements storage.InFlightLister, with GetByHash's scan.
func (s *Store) ListInFlight(ctx context.Context, after string, limit int) ([]storage.HashedRecord, error) {
	if limit <= 0 {
		return nil, nil
	}
	ctx, cancel := s.scanContext(ctx)
	defer cancel()
	if err := s.ensureSchema(ctx); err != nil {
		return nil, s.fail(ctx, "get", err)
	}
	var out []storage.HashedRecord
	err := s.scan(ctx, func(tx pgx.Tx) error {
		out = nil
		rows, err := tx.Query(ctx, s.sql.listInFlight, after, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			rec := &storage.Record{State: storage.InFlight}
			var kh string
			var token int64
			if err := rows.Scan(&kh, &rec.Fingerprint, &token, &rec.CreatedAt, &rec.ExpiresAt); err != nil {
				return err
			}
			rec.Token = storage.Token(token)
			out = append(out, storage.HashedRecord{KeyHash: kh, Record: rec})
		}
		return rows.Err()
	})
	if err != nil {
		return nil, s.fail(ctx, "get", err)
	}
	return out, nil
}

var _ storage.OutcomeUnknownKeeper = (*Store)(nil)

// ListOutcomeUnknown implements storage.OutcomeUnknownKeeper, with
// GetByHash's scan.
func (s *Store) ListOutcomeUnknown(ctx context.Context, after string, limit int) ([]storage.HashedRecord, error) {
	if limit <= 0 {
		return nil, nil
	}
	ctx, cancel := s.scanContext(ctx)
	defer cancel()
	if err := s.ensureSchema(ctx); err != nil {
		return nil, s.fail(ctx, "get", err)
	}
	var out []storage.HashedRecord
	err := s.scan(ctx, func(tx pgx.Tx) error {
		out = nil
		rows, err := tx.Query(ctx, s.sql.listOutcomeUnknown, after, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			rec := &storage.Record{State: storage.Completed}
			var (
				kh      string
				status  int32
				headers []byte
			)
			if err := rows.Scan(&kh, &rec.Fingerprint, &rec.CreatedAt, &rec.ExpiresAt, &status, &headers); err != nil {
				return err
			}
			resp, err := response(status, headers, nil, false)
			if err != nil {
				return err
			}
			resp.OutcomeUnknown = true
			rec.Response = resp
			out = append(out, storage.HashedRecord{KeyHash: kh, Record: rec})
		}
		return rows.Err()
	})
	if err != nil {
		return nil, s.fail(ctx, "get", err)
	}
	return out, nil
}

// ReleaseOutcomeUnknown implements storage.OutcomeUnknownKeeper, with
// GetByHash's scan: one DELETE whose condition holds on the rows it
// locks.
func (s *Store) ReleaseOutcomeUnknown(ctx context.Context, hash string) (int, error) {
	return s.deleteHashed(ctx, hash, s.sql.releaseOutcomeUnknown)
}

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
// key hash in the database: a scan of the table.
func (s *Store) GetByHash(ctx context.Context, hash string, withBody bool) ([]*storage.Record, error) {
	prefix, err := hex.DecodeString(hash)
	if err != nil || len(prefix) != storage.HashLen/2 || hex.EncodeToString(prefix) != hash {
		return nil, nil
	}
	if err := s.ensureSchema(ctx); err != nil {
		return nil, s.fail("get", err)
	}
	rows, err := s.pool.Query(ctx, s.sql.getByHash, prefix, withBody)
	if err != nil {
		return nil, s.fail("get", err)
	}
	var out []*storage.Record
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("postgres get: %w", err)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail("get", err)
	}
	return out, nil
}

// DeleteByHash implements storage.HashFinder.
func (s *Store) DeleteByHash(ctx context.Context, hash string) (int, error) {
	prefix, err := hex.DecodeString(hash)
	if err != nil || len(prefix) != storage.HashLen/2 || hex.EncodeToString(prefix) != hash {
		return 0, nil
	}
	if err := s.ensureSchema(ctx); err != nil {
		return 0, s.fail("delete", err)
	}
	tag, err := s.pool.Exec(ctx, s.sql.deleteByHash, prefix)
	if err != nil {
		return 0, s.fail("delete", err)
	}
	return int(tag.RowsAffected()), nil
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
	case stateCompleted:
		rec.State = storage.Completed
		resp, err := response(status, headers, body, bodyOmitted)
		if err != nil {
			return nil, err
		}
		rec.Response = resp
	default:
		return nil, fmt.Errorf("%w: state %d", storage.ErrCorrupt, state)
	}
	return &rec, nil
}

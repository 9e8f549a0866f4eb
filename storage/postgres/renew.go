package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

var _ storage.BatchRenewer = (*Store)(nil)

// Renewal outcomes, as the renewBatch statement reports them.
const (
	renewed = 0
	lost    = 1
	busy    = 2
)

// RenewBatch implements storage.BatchRenewer: every lease of batch is
// renewed by one statement over arrays of scopes, keys, tokens and
// lengths, in one round trip and one commit, whatever their number. As
// Renew, it renews only an in-flight record that still holds the lease's
// token, lapsed or not, and saturates lengths at MaxDuration. A lease
// whose row another transaction holds (the request's own completion, an
// operator's open transaction) is not waited for: its Err wraps
// storage.ErrBusy, it was not renewed, and the next tick tries again.
//
// Renewals take a path of their own: a pool of two connections made in
// New from the store's pool configuration, which reserves and completions
// never use, so that a renewal never waits for a connection behind them.
// Their transactions commit with synchronous_commit off (for themselves
// only): a renewal does not wait for its WAL flush. That is safe because a
// renewal that a crash of PostgreSQL loses only leaves the lease as long as
// the last one that reached the disk, shorter than it should be: the worst
// that follows is a takeover of a request that was still running, which
// fencing makes harmless to the records (the first request's completion
// is refused), exactly as a lease that lapsed during an outage.
//
// The caller's deadline bounds the call, however long (the handler gives
// it a generous one, for thousands of leases); without one, Timeout does.
func (s *Store) RenewBatch(ctx context.Context, batch []storage.Renewal) error {
	var scopes, ids []string
	var tokens, leases []int64
	var sent []int // the index in batch of each lease sent
	for i := range batch {
		r := &batch[i]
		r.Err = nil
		switch {
		case r.Lease <= 0:
			r.Err = fmt.Errorf("postgres renew: %w: lease %v is not positive", storage.ErrInvalid, r.Lease)
		case r.Token == 0 || checkKey(r.Key) != nil:
			// No record holds such a lease (zero never names one, and
			// Reserve refuses such keys): save the round trip, and keep
			// a key PostgreSQL cannot take from failing the others.
			r.Err = storage.ErrLeaseLost
		default:
			scopes = append(scopes, r.Key.Scope)
			ids = append(ids, r.Key.ID)
			tokens = append(tokens, int64(r.Token))
			leases = append(leases, micros(r.Lease))
			sent = append(sent, i)
		}
	}
	if len(sent) == 0 {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = s.opContext(ctx)
		defer cancel()
	}
	outcomes := make([]int16, len(sent))
	err := s.ensureSchema(ctx)
	if err == nil {
		err = retry(ctx, func() error { return s.renewOnce(ctx, scopes, ids, tokens, leases, outcomes) })
	}
	if err != nil {
		err = s.fail(ctx, "renew batch", err)
		for i := range batch {
			batch[i].Err = err
		}
		return err
	}
	for j, i := range sent {
		switch outcomes[j] {
		case renewed:
		case busy:
			batch[i].Err = fmt.Errorf("postgres renew batch: %w: the lease was not renewed this time", storage.ErrBusy)
		default:
			batch[i].Err = storage.ErrLeaseLost
		}
	}
	return nil
}

// renewOnce sends the renewBatch statement, after asyncCommit, in one
// pipeline on a connection of the renewal pool, and sets each lease's
// outcome once the transaction committed.
func (s *Store) renewOnce(ctx context.Context, scopes, ids []string, tokens, leases []int64, outcomes []int16) error {
	c, err := acquireFrom(ctx, s.renewals, s.pinned)
	if err != nil {
		return err
	}
	defer c.Release()
	var pb pgx.Batch
	pb.Queue(s.sql.asyncCommit)
	pb.Queue(s.sql.renewBatch, scopes, ids, tokens, leases)
	s.renewalRoundTrips.Add(1)
	br := c.SendBatch(ctx, &pb)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return err
	}
	got := make([]int16, len(outcomes))
	for i := range got {
		got[i] = -1
	}
	rows, err := br.Query()
	if err == nil {
		var i int64
		var outcome int16
		_, err = pgx.ForEachRow(rows, []any{&i, &outcome}, func() error {
			if i < 1 || i > int64(len(got)) {
				return fmt.Errorf("%w: a renewal answered for lease %d of %d", storage.ErrCorrupt, i, len(got))
			}
			got[i-1] = outcome
			return nil
		})
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	for i, o := range got {
		if o < 0 {
			return fmt.Errorf("%w: no answer for lease %d of %d", storage.ErrCorrupt, i+1, len(got))
		}
	}
	copy(outcomes, got)
	return nil
}

// RenewalRoundTrips returns how many pipelines RenewBatch has sent to the
// server (each one statement, whatever the number of leases, and again
// only after PostgreSQL rolled it back for a conflict), so that tests and
// benchmarks can show that renewals cost one round trip per tick.
func (s *Store) RenewalRoundTrips() int64 { return s.renewalRoundTrips.Load() }

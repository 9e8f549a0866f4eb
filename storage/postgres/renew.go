package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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

// RenewBatch implements storage.BatchRenewer: the leases of batch are
// renewed by one statement over arrays of scopes, keys, tokens and
// lengths per chunk of renewChunk leases, each chunk its own round trip
// and commit, so that a batch the server is slow to take renews part of
// its leases rather than none. As Renew, it renews only an in-flight
// record that still holds the lease's token, lapsed or not, and saturates
// lengths at MaxDuration.
//
// Renewals never defeat themselves: a lease already in a renewal on its
// way (an earlier call's, slow, or a waiting renewal, below) is not sent
// again, and its Err is nil here (that renewal answers for it), so that a
// later batch never finds the rows of an earlier one locked. The call is
// bounded by the shortest lease of the batch, however short the caller's
// deadline: a renewal that lands late is harmless, and one cut off
// renews nothing.
//
// The batch statement never waits for a row: FOR NO KEY UPDATE SKIP
// LOCKED passes over a row another transaction holds (an operator's open
// transaction, the request's own completion), and those leases go to a
// waiting renewal, which does wait for their rows (one at a time, in
// key order, for as long as the owner still asks for their leases), so
// that when an outside lock goes, however long it was held, the owner's
// renewal is first in the row's queue, before any takeover (a reserve
// never queues on a row, see statements.reserve). A waiting renewal that
// gave up after a while opened a gap until the owner's next tick, in
// which a lock let go left a lapsed lease to another instance's reserve. The call waits for the waiting renewal for the
// lock wait (Options.LockWait) at most: what it renewed by then is
// renewed; the rest have an Err wrapping storage.ErrBusy, and the waiting
// renewal goes on.
//
// Renewals take a path of their own: a pool of renewalConns connections
// made in New from the store's pool configuration, which reserves and
// completions never use, so that a renewal never waits for a connection
// behind them. Their transactions commit with synchronous_commit off (for
// themselves only): a renewal does not wait for its WAL flush. That is
// safe because a renewal that a crash of PostgreSQL loses only leaves the
// lease as long as the last one that reached the disk, shorter than it
// should be: the worst that follows is a takeover of a request that was
// still running, which fencing makes harmless to the records (the first
// request's completion is refused), exactly as a lease that lapsed during
// an outage.
func (s *Store) RenewBatch(ctx context.Context, batch []storage.Renewal) error {
	var leases []*storage.Renewal
	shortest := time.Duration(0)
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
			leases = append(leases, r)
			if shortest == 0 || r.Lease < shortest {
				shortest = r.Lease
			}
		}
	}
	leases = s.renewing.take(leases)
	if len(leases) == 0 {
		return nil
	}
	defer s.renewing.let(leases)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shortest)
	defer cancel()

	err := s.ensureSchema(ctx)
	var locked []*storage.Renewal
	answered := 0
	for start := 0; err == nil && start < len(leases); start += renewChunk {
		chunk := leases[start:min(start+renewChunk, len(leases))]
		if err = retry(ctx, func() error { return s.renewOnce(ctx, s.sql.renewBatch, 0, chunk) }); err != nil {
			break
		}
		answered += len(chunk)
		for _, r := range chunk {
			if errors.Is(r.Err, errRowLocked) {
				locked = append(locked, r)
			}
		}
	}
	if err != nil {
		err = s.fail(ctx, "renew batch", err)
		for _, r := range leases[answered:] {
			r.Err = err
		}
		if answered == 0 {
			return err
		}
	}
	if len(locked) > 0 {
		s.renewLocked(locked)
	}
	return nil
}

// renewChunk is how many leases one renewal transaction renews at most.
const renewChunk = 500

// renewLocked renews the leases whose rows were locked in a waiting
// renewal, and waits for it for the lock wait at most; the leases it has
// not renewed by then have an Err wrapping storage.ErrBusy. The waiting
// renewal goes on while a RenewBatch still asks for one of its leases
// within each of their lengths (the owner's request still runs), until
// the store closes. Up to maxWaitingRenewals run at a time, each on its
// own connection (rows locked at different ticks, by different
// transactions); beyond that the leases are busy at once (the next tick
// tries again).
func (s *Store) renewLocked(locked []*storage.Renewal) {
	busy := func(rs []*storage.Renewal) {
		for _, r := range rs {
			r.Err = fmt.Errorf("postgres renew batch: %w: the lease was not renewed this time", storage.ErrBusy)
		}
	}
	if n := s.waitingRenewals.Add(1); n > maxWaitingRenewals {
		s.waitingRenewals.Add(-1)
		busy(locked)
		return
	}
	// The waiting renewal works on copies, which it owns: the caller's
	// batch is the caller's again once this call returns.
	own := make([]storage.Renewal, len(locked))
	ptrs := make([]*storage.Renewal, len(locked))
	shortest := locked[0].Lease
	for i, r := range locked {
		own[i] = storage.Renewal{Key: r.Key, Token: r.Token, Lease: r.Lease}
		ptrs[i] = &own[i]
		shortest = min(shortest, r.Lease)
	}
	answer := slices.Clone(ptrs) // in the caller's order
	// In key order, as every batch takes its rows.
	slices.SortFunc(ptrs, func(x, y *storage.Renewal) int {
		return cmp.Or(strings.Compare(x.Key.Scope, y.Key.Scope), strings.Compare(x.Key.ID, y.Key.ID))
	})
	s.renewing.hold(ptrs)
	done := make(chan error, 1)
	// This call asks for the leases while it waits: the caller's next
	// tick comes after it.
	var calling atomic.Bool
	calling.Store(true)
	defer calling.Store(false)
	go func() {
		defer s.waitingRenewals.Add(-1)
		defer s.renewing.let(ptrs)
		// Close ends it (a renewal pool with a connection out would
		// keep Close waiting), and so does a lease length in which no
		// RenewBatch asked for any of its leases.
		ctx, cancel := context.WithCancel(s.life)
		defer cancel()
		go func() {
			tick := time.NewTicker(shortest)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					if !s.renewing.askedAgain(ptrs) && !calling.Load() {
						cancel()
						return
					}
				}
			}
		}()
		done <- retry(ctx, func() error { return s.renewOnce(ctx, s.sql.renewWait(), math.MaxInt32, ptrs) })
	}()
	timer := time.NewTimer(s.opts.LockWait)
	defer timer.Stop()
	select {
	case err := <-done:
		for i, r := range locked {
			r.Err = answer[i].Err
			if err != nil {
				r.Err = fmt.Errorf("postgres renew batch: %w: the lease's row stayed locked: %w", storage.ErrBusy, err)
			}
		}
	case <-timer.C:
		busy(locked)
	}
}

// renewals counts, per lease, the renewals on their way that hold it (see
// RenewBatch): a call's, and the waiting renewal's.
type renewals struct {
	mu sync.Mutex
	m  map[renewalID]int
	// asked marks the leases a RenewBatch asked for while a renewal on
	// its way held them (see askedAgain).
	asked map[renewalID]bool
}

type renewalID struct {
	scope, key string
	token      storage.Token
}

// take returns the leases of rs not already in a renewal, and holds them.
func (rr *renewals) take(rs []*storage.Renewal) []*storage.Renewal {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.m == nil {
		rr.m = make(map[renewalID]int)
	}
	free := rs[:0]
	for _, r := range rs {
		id := renewalID{r.Key.Scope, r.Key.ID, r.Token}
		if rr.m[id] > 0 {
			if rr.asked == nil {
				rr.asked = make(map[renewalID]bool)
			}
			rr.asked[id] = true
			continue // its renewal on the way answers for it
		}
		rr.m[id]++
		free = append(free, r)
	}
	return free
}

// hold holds rs once more: the waiting renewal's leases, which the call
// that started it holds too.
func (rr *renewals) hold(rs []*storage.Renewal) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	for _, r := range rs {
		rr.m[renewalID{r.Key.Scope, r.Key.ID, r.Token}]++
	}
}

// askedAgain reports whether a RenewBatch asked for any of rs since the
// last call, and forgets that it did.
func (rr *renewals) askedAgain(rs []*storage.Renewal) bool {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	again := false
	for _, r := range rs {
		id := renewalID{r.Key.Scope, r.Key.ID, r.Token}
		again = again || rr.asked[id]
		delete(rr.asked, id)
	}
	return again
}

// let lets go of rs once.
func (rr *renewals) let(rs []*storage.Renewal) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	for _, r := range rs {
		id := renewalID{r.Key.Scope, r.Key.ID, r.Token}
		if rr.m[id]--; rr.m[id] <= 0 {
			delete(rr.m, id)
			delete(rr.asked, id) // nothing on its way to ask again
		}
	}
}

// renewOnce sends sql (renewBatch, or renewWait with lock_timeout
// lockWaitMs) for the leases rs, after asyncCommit, in one pipeline on a
// connection of the renewal pool, and sets each lease's Err once the
// transaction committed: nil, storage.ErrLeaseLost, or errRowLocked (its
// row was locked).
func (s *Store) renewOnce(ctx context.Context, sql string, lockWaitMs int64, rs []*storage.Renewal) error {
	scopes := make([]string, len(rs))
	ids := make([]string, len(rs))
	tokens := make([]int64, len(rs))
	leases := make([]int64, len(rs))
	for i, r := range rs {
		scopes[i], ids[i], tokens[i], leases[i] = r.Key.Scope, r.Key.ID, int64(r.Token), micros(r.Lease)
	}
	c, err := acquireFrom(ctx, s.renewals, s.pinned)
	if err != nil {
		return err
	}
	defer c.Release()
	var pb pgx.Batch
	pb.Queue(s.sql.asyncCommit)
	if lockWaitMs > 0 {
		pb.Queue(s.sql.setLockTimeout, fmt.Sprintf("%dms", lockWaitMs))
	}
	pb.Queue(sql, scopes, ids, tokens, leases)
	s.renewalRoundTrips.Add(1)
	br := c.SendBatch(ctx, &pb)
	for range pb.Len() - 1 {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return err
		}
	}
	got := make([]int16, len(rs))
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
	for i, o := range got {
		switch o {
		case renewed:
			rs[i].Err = nil
		case busy:
			rs[i].Err = errRowLocked
		default:
			rs[i].Err = storage.ErrLeaseLost
		}
	}
	return nil
}

// RenewalRoundTrips returns how many pipelines RenewBatch has sent to the
// server (each one statement, whatever the number of leases, and again
// only after PostgreSQL rolled it back for a conflict), so that tests and
// benchmarks can show that renewals cost one round trip per tick.
func (s *Store) RenewalRoundTrips() int64 { return s.renewalRoundTrips.Load() }

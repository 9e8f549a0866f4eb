package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// maxReserveAttempts bounds the rounds of one Reserve. A round ends
// without an answer when the key changed hands between two statements,
// which takes a competitor's whole round trip, or when PostgreSQL rolled
// a statement back for a conflict (see retryable); a few in a row mean
// something is churning the key far faster than any client retries.
const maxReserveAttempts = maxAttempts

// Reserve implements storage.Store, in one statement in the common cases.
//
// The statement (see statements.reserve) answers from the live row its
// snapshot shows, or else inserts the key or takes over an expired or
// lapsed row. The snapshot is taken when the statement starts, while ON
// CONFLICT sees the latest committed row: under READ COMMITTED, a row that
// a concurrent reserver inserted (or took over) and committed after our
// snapshot makes the insert conflict while the snapshot shows no live row,
// and the statement returns nothing. Reserve then reads the row in a new
// statement, whose snapshot has it; if the row is gone by then (released,
// deleted, lapsed), it starts over. Every Reserve therefore ends with a
// definite outcome, at the price of an extra round trip in that race,
// which only concurrent requests for the same key run into.
//
// Under REPEATABLE READ or SERIALIZABLE (a pool that does not pin READ
// COMMITTED on a database or role defaulting to them, see NewPoolConfig)
// the same race ends in a serialization failure instead, and so can
// unrelated statements under SERIALIZABLE; the statement was rolled back
// and the round starts over, with a new snapshot that shows the row.
//
// Timeout bounds the whole call, every round included.
func (s *Store) Reserve(ctx context.Context, key storage.Key, fp []byte, lease time.Duration) (storage.Reservation, error) {
	if lease <= 0 {
		return storage.Reservation{}, fmt.Errorf("postgres reserve: %w: lease %v is not positive", storage.ErrInvalid, lease)
	}
	if err := checkKey(key); err != nil {
		return storage.Reservation{}, fmt.Errorf("postgres reserve: %w", err)
	}
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	if err := s.ensureSchema(ctx); err != nil {
		return storage.Reservation{}, s.fail(ctx, "reserve", err)
	}
	if fp == nil {
		fp = []byte{} // nil would be NULL
	}
	tok := storage.NewToken()
	// A failed statement may have committed before its reply was lost:
	// the caller gets the token to release (see storage.Reservation).
	failed := func(err error) (storage.Reservation, error) {
		return storage.Reservation{Token: tok}, s.fail(ctx, "reserve", err)
	}
	var err error
	for attempt := range maxReserveAttempts {
		if attempt > 0 && retryable(err) && !retryPause(ctx, attempt) {
			return failed(err)
		}
		var row existingRow
		order := key.Scope + "\x00" + key.ID
		item := &batchItem{sql: s.sql.reserve, args: []any{key.Scope, key.ID, fp, int64(tok), micros(lease), !s.lockedSeen.holds(order)}, order: order}
		item.answer = &row
		item.follow = func(leader *batchItem) bool { return row.follow(leader, fp) }
		item.read = func(br pgx.BatchResults) error {
			if err := br.QueryRow().Scan(row.reserveDest()...); err != nil {
				return err
			}
			switch row.kind {
			case kindLocked:
				// Sent again (batch.go) until the row is let go, and
				// then it does not take a lapsed lease over.
				s.lockedAnswers.Add(1)
				s.lockedSeen.saw(order, lease/takeoverHoldOff)
				item.args[5] = false
				return errRowLocked
			case kindHeldOff:
				return errHeldOff
			}
			return nil
		}
		// The statement goes after the guard (batch.go), which bounds its
		// wait for a row another transaction holds: then its error wraps
		// storage.ErrBusy, and the call ends.
		if attempt == 0 {
			// The first round goes with the reserves waiting now, in one
			// commit (batch.go); a batch the server refused changed
			// nothing, and the statement runs on its own.
			err = s.reserves.do(ctx, item)
			if errors.Is(err, errBatchRolledBack) {
				if retryable(err) {
					s.countRetry(err) // the batch was rolled back for a conflict
				}
				err = s.alone(ctx, item)
			}
		} else {
			err = s.alone(ctx, item)
		}
		err = s.waitedFor("reserve", err)
		switch {
		case errors.Is(err, errHeldOff):
			return failed(fmt.Errorf("%w: the key's lapsed lease was locked by another transaction a moment ago; "+
				"it is not taken over while its owner's renewal may land", storage.ErrBusy))
		case err == nil && row.kind == kindAcquired:
			return storage.Reservation{Outcome: storage.Acquired, Token: tok}, nil
		case errors.Is(err, storage.ErrNotReplicated) && row.kind == kindAcquired:
			// Committed on the primary alone: the reservation holds the
			// key there, for a caller that would otherwise go on without
			// the store (storage.ErrNotReplicated); others release it.
			// (err is asked first: the batch of a statement whose caller
			// gave up may still be reading into row; one that was not
			// replicated was read whole.)
			return storage.Reservation{Outcome: storage.Acquired, Token: tok}, s.fail(ctx, "reserve", err)
		case errors.Is(err, storage.ErrNotReplicated) && row.kind == kindLive:
			// A record that was there before: a replay, a conflict or a
			// mismatch changes nothing, and must not wait on a standby
			// that is cut off (the commit waited for the lock the
			// statement took, or for another reserve of the batch).
			// Failed, the caller would go on without the store under
			// fail_open and run a completed request again.
			return s.answer(ctx, &row, fp)
		case err == nil:
			return s.answer(ctx, &row, fp)
		case retryable(err):
			s.countRetry(err)
			continue
		case !errors.Is(err, pgx.ErrNoRows):
			return failed(err)
		}

		// The visibility gap: the row exists but our snapshot predates it.
		s.fallbacks.Add(1)
		err = s.queryRow(ctx, row.dest(), s.sql.lookup, key.Scope, key.ID, fp)
		switch {
		case err == nil:
			return s.answer(ctx, &row, fp)
		case retryable(err):
			s.countRetry(err)
			continue
		case !errors.Is(err, pgx.ErrNoRows):
			return failed(err)
		}
		// Gone again: try to take it.
	}
	if retryable(err) {
		return failed(err)
	}
	return storage.Reservation{Token: tok}, fmt.Errorf("postgres reserve: the key changed hands %d times during one reservation", maxReserveAttempts)
}

// The kinds of answer of the reserve statement (its first column).
const (
	kindLive     = 0 // the live row, described
	kindAcquired = 1 // the caller acquired the key
	kindLocked   = 2 // the row is not live, and another transaction holds it
	kindHeldOff  = 3 // a lapsed lease whose row the store found locked a moment ago
)

// errHeldOff is the reserve statement's answer kindHeldOff.
var errHeldOff = errors.New("postgres: takeover held off")

// takeoverHoldOff: a lapsed lease whose row a reserve found locked is not
// taken over, by this store, until lease/takeoverHoldOff after the last
// time it found it so (lease being the reserving request's own), a
// renewal cadence (a tenth of the lease) and more: when an outside lock
// that outlived the lease goes, the owner's renewal, which waits for the
// row (renew.go), or else its next one, lands first.
const takeoverHoldOff = 4

// lockedKeys remembers, for a while, the keys whose row a reserve found
// locked (see takeoverHoldOff). It holds at most maxLockedKeys.
type lockedKeys struct {
	mu    sync.Mutex
	until map[string]time.Time
}

// maxLockedKeys bounds lockedKeys: past it, a key found locked is not
// remembered (its takeover is then held off by the owner's waiting
// renewal alone).
const maxLockedKeys = 4096

// saw notes that key's row was found locked now, and holds off its
// takeover for d.
func (l *lockedKeys) saw(key string, d time.Duration) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.until == nil {
		l.until = make(map[string]time.Time)
	}
	if len(l.until) >= maxLockedKeys {
		for k, t := range l.until {
			if !t.After(now) {
				delete(l.until, k)
			}
		}
		if len(l.until) >= maxLockedKeys {
			return
		}
	}
	l.until[key] = now.Add(d)
}

// holds reports whether the takeover of key is held off now.
func (l *lockedKeys) holds(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.until[key]
	if ok && !t.After(time.Now()) {
		delete(l.until, key)
		return false
	}
	return ok
}

// countRetry counts a Reserve round rolled back for err, a retryable
// error.
func (s *Store) countRetry(err error) {
	if serializationFailed(err) {
		s.serializationFailures.Add(1)
	} else {
		s.deadlocks.Add(1)
	}
}

// answer is what Reserve reports for the live row r, with its errors
// wrapped.
func (s *Store) answer(ctx context.Context, r *existingRow, fp []byte) (storage.Reservation, error) {
	res, err := r.reservation(fp)
	if err != nil {
		return storage.Reservation{}, s.fail(ctx, "reserve", err)
	}
	return res, nil
}

// follow fills r, a reserve's answer for fingerprint fp, from the
// committed answer of the reserve of the same key that went just before
// it (leader: see batchItem.follow), when that answer is what the
// statement would have met: with the same fingerprint, the live record
// the leader found (a replay, a conflict, a mismatch), or, where the
// leader acquired the key, its reservation in flight (a conflict). Any
// other answer (locked, taken over on a lapse, the visibility gap) and
// another fingerprint send the statement.
func (r *existingRow) follow(leader *batchItem, fp []byte) bool {
	lr, ok := leader.answer.(*existingRow)
	if !ok || !bytes.Equal(leader.args[2].([]byte), fp) {
		return false
	}
	switch lr.kind {
	case kindLive:
		*r = *lr
	case kindAcquired:
		lease := time.Duration(leader.args[4].(int64)) * time.Microsecond
		*r = existingRow{kind: kindLive, same: true, state: stateInFlight, created: lr.created, expires: lr.created.Add(lease)}
	default:
		return false
	}
	return true
}

// existingRow is a live record as the reserve and lookup statements
// describe it (see the existing column list), or, from reserve, the news
// that the caller acquired the key, or that the row was locked (kind).
type existingRow struct {
	kind        int16
	same        bool
	state       int16
	created     time.Time
	expires     time.Time
	status      int32
	headers     []byte
	body        []byte
	bodyOmitted bool
	detail      []byte
}

// dest lists where lookup's columns go.
func (r *existingRow) dest() []any {
	return []any{&r.same, &r.state, &r.created, &r.expires, &r.status, &r.headers, &r.body, &r.bodyOmitted, &r.detail}
}

// reserveDest lists where reserve's columns go: the kind of answer, then
// lookup's.
func (r *existingRow) reserveDest() []any {
	return []any{&r.kind, &r.same, &r.state, &r.created, &r.expires, &r.status, &r.headers, &r.body, &r.bodyOmitted, &r.detail}
}

// reservation answers a Reserve that found the live record r. The
// fingerprint is the caller's own (the row's is equal, or the answer is
// Mismatch), copied because callers reuse their buffers.
func (r *existingRow) reservation(fp []byte) (storage.Reservation, error) {
	if !r.same {
		if len(r.detail) == 0 {
			return storage.Reservation{Outcome: storage.Mismatch}, nil
		}
		return storage.Reservation{Outcome: storage.Mismatch, Record: &storage.Record{Detail: r.detail}}, nil
	}
	rec := &storage.Record{
		Fingerprint: bytes.Clone(fp),
		CreatedAt:   r.created,
		ExpiresAt:   r.expires,
	}
	switch r.state {
	case stateInFlight:
		// No token: a competing caller never learns the owner's lease.
		rec.State = storage.InFlight
		return storage.Reservation{Outcome: storage.Conflict, Record: rec}, nil
	case stateCompleted, stateOutcomeUnknown:
		resp, err := response(r.status, r.headers, r.body, r.bodyOmitted)
		if err != nil {
			return storage.Reservation{}, err
		}
		resp.OutcomeUnknown = r.state == stateOutcomeUnknown
		rec.State = storage.Completed
		rec.Response = resp
		if len(r.detail) > 0 {
			rec.Detail = r.detail
		}
		return storage.Reservation{Outcome: storage.Replay, Record: rec}, nil
	}
	return storage.Reservation{}, fmt.Errorf("%w: state %d", storage.ErrCorrupt, r.state)
}

// response rebuilds a recorded response from its columns: an error
// wrapping storage.ErrCorrupt when they hold what Complete never writes.
func response(status int32, headers, body []byte, omitted bool) (*storage.Response, error) {
	if !storage.ValidStatus(int(status)) {
		return nil, fmt.Errorf("%w: status %d", storage.ErrCorrupt, status)
	}
	h, err := storage.DecodeHeader(headers)
	if err != nil {
		return nil, err
	}
	if len(body) == 0 {
		body = nil
	}
	return &storage.Response{Status: int(status), Header: h, Body: body, BodyOmitted: omitted}, nil
}

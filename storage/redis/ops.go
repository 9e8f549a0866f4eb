package redis

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Reserve implements storage.Store in one round trip. A Replay carries the
// recorded response; a Conflict carries the lease's times, never its token.
func (s *Store) Reserve(ctx context.Context, key storage.Key, fp []byte, lease time.Duration) (storage.Reservation, error) {
	if lease <= 0 {
		return storage.Reservation{}, fmt.Errorf("redis reserve: %w: lease %v is not positive", storage.ErrInvalid, lease)
	}
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	tok := storage.NewToken()
	v, acked, err := s.runDurable(ctx, reserveScript, key, newReserveArgs(fp, uint64(tok), millis(lease), keepMillis(lease)))
	if err != nil {
		// The script may have run and its reply been lost: the caller
		// gets the token to release (see storage.Reservation).
		return storage.Reservation{Token: tok}, fmt.Errorf("redis reserve: %w", err)
	}
	r := reply{v: v}
	var res storage.Reservation
	n := 1 // reply length for the outcome
	switch outcome := r.int(0); outcome {
	case 1:
		res = storage.Reservation{Outcome: storage.Acquired, Token: tok}
	case 2:
		n = 2
		res = storage.Reservation{Outcome: storage.Mismatch}
		if d := r.bytes(1); len(d) > 0 {
			res.Record = &storage.Record{Detail: d}
		}
	case 3:
		// The script compared the fingerprints: the record's is fp.
		n = 3
		res = storage.Reservation{Outcome: storage.Conflict, Record: &storage.Record{
			Fingerprint: bytes.Clone(fp),
			State:       storage.InFlight,
			CreatedAt:   time.UnixMilli(r.int(1)),
			ExpiresAt:   time.UnixMilli(r.int(2)),
		}}
	case 4:
		n = 2
		created, expiry, head, body, detail, err := unpackReplay(r.str(1))
		var rec *storage.Record
		if err == nil {
			rec, err = completedRecord(bytes.Clone(fp), created, expiry, head, body, true)
		}
		r.fail(err)
		if rec != nil {
			rec.Detail = detail
		}
		res = storage.Reservation{Outcome: storage.Replay, Record: rec}
	default:
		r.fail(fmt.Errorf("%w: unknown outcome %d", storage.ErrCorrupt, outcome))
	}
	if err := r.check(n); err != nil {
		return storage.Reservation{}, fmt.Errorf("redis reserve: %w", err)
	}
	if res.Outcome == storage.Acquired && s.durability.shortfall("reserve", acked) && !s.durability.Proceed {
		// The reservation is on the primary only, as far as anyone
		// knows: the upstream runs on it only for a caller that would
		// otherwise go on without the store (storage.ErrNotReplicated);
		// others release it with the token, as after any failed Reserve.
		return storage.Reservation{Outcome: storage.Acquired, Token: tok}, fmt.Errorf("redis reserve: %w: %w", storage.ErrUnavailable, s.durability.notReplicated(acked))
	}
	return res, nil
}

// Complete implements storage.Store in one round trip. The response is
// stored as its encoded status and headers plus the raw body, so that Get
// can leave the body out without parsing anything in Lua.
func (s *Store) Complete(ctx context.Context, key storage.Key, token storage.Token, resp *storage.Response, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("redis complete: %w: ttl %v is not positive", storage.ErrInvalid, ttl)
	}
	// Refused before Redis is asked: the lease stays the caller's.
	if err := storage.CheckResponse(resp); err != nil {
		return fmt.Errorf("redis complete: %w", err)
	}
	if token == 0 {
		return storage.ErrLeaseLost
	}
	head := storage.AppendResponse(nil, &storage.Response{Status: resp.Status, Header: resp.Header, BodyOmitted: resp.BodyOmitted, OutcomeUnknown: resp.OutcomeUnknown})
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	v, acked, err := s.runDurable(ctx, completeScript, key, newCompleteArgs(uint64(token), head, resp.Body, millis(ttl), resp.Detail))
	if err != nil {
		return fmt.Errorf("redis complete: %w", err)
	}
	switch v {
	case int64(0):
		return storage.ErrLeaseLost
	case int64(1), int64(2):
	default:
		return fmt.Errorf("redis complete: %w: reply of type %T", storage.ErrCorrupt, v)
	}
	if s.durability.shortfall("complete", acked) {
		// The record is on the primary, the answer given; but a replica
		// promoted now would hold it in flight, and its lease would
		// lapse. The caller sends it again (with its WAIT, keeping the
		// lease alive) until replicas have it: see durability.go.
		return fmt.Errorf("redis complete: %w: %w", storage.ErrUnavailable, s.durability.notReplicated(acked))
	}
	if v == int64(2) {
		return errCompletedByLease
	}
	return nil
}

// errCompletedByLease is Complete's answer when the lease completed the
// record already (and replicas acknowledged it, when the store waits for
// them): the record is no longer the lease's to write.
var errCompletedByLease = fmt.Errorf("%w: the record is completed by this lease already", storage.ErrLeaseLost)

// Release implements storage.Store in one round trip.
func (s *Store) Release(ctx context.Context, key storage.Key, token storage.Token) error {
	if token == 0 {
		return storage.ErrLeaseLost
	}
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	return s.fenced(ctx, "release", releaseScript, key, uint64(token))
}

// Renew implements storage.Store in one round trip.
func (s *Store) Renew(ctx context.Context, key storage.Key, token storage.Token, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("redis renew: %w: lease %v is not positive", storage.ErrInvalid, lease)
	}
	if token == 0 {
		return storage.ErrLeaseLost
	}
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	return s.fenced(ctx, "renew", renewScript, key, uint64(token), millis(lease), keepMillis(lease))
}

// Get implements storage.Store in one round trip; without withBody the
// body never leaves Redis.
func (s *Store) Get(ctx context.Context, key storage.Key, withBody bool) (*storage.Record, error) {
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	return s.getName(ctx, s.keyName(key), withBody)
}

// getName is Get of the record under the Redis key name.
func (s *Store) getName(ctx context.Context, name string, withBody bool) (*storage.Record, error) {
	flag := "0"
	if withBody {
		flag = "1"
	}
	v, err := s.runKey(ctx, getScript, name, flag)
	if err != nil {
		return nil, fmt.Errorf("redis get: %w", err)
	}
	r := reply{v: v}
	var rec *storage.Record
	n := 1 // reply length for the state
	switch state := r.int(0); state {
	case 0:
		if err := r.check(n); err != nil {
			return nil, fmt.Errorf("redis get: %w", err)
		}
		return nil, storage.ErrNotFound
	case 1:
		n = 5
		tok, err := strconv.ParseUint(r.str(2), 10, 64)
		if err != nil {
			r.fail(fmt.Errorf("%w: token: %v", storage.ErrCorrupt, err))
		}
		rec = &storage.Record{
			Fingerprint: r.bytes(1),
			State:       storage.InFlight,
			Token:       storage.Token(tok),
			CreatedAt:   time.UnixMilli(r.int(3)),
			ExpiresAt:   time.UnixMilli(r.int(4)),
		}
	case 2:
		n = 5
		var body []byte
		if withBody {
			n, body = 6, r.bytes(5)
		}
		var err error
		rec, err = completedRecord(r.bytes(1), r.int(2), r.int(3), r.bytes(4), body, withBody)
		r.fail(err)
	default:
		r.fail(fmt.Errorf("%w: unknown state %d", storage.ErrCorrupt, state))
	}
	if err := r.check(n); err != nil {
		return nil, fmt.Errorf("redis get: %w", err)
	}
	return rec, nil
}

// Delete implements storage.Store in one round trip.
func (s *Store) Delete(ctx context.Context, key storage.Key) error {
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	return s.deleteName(ctx, s.keyName(key))
}

// deleteName is Delete of the record under the Redis key name.
func (s *Store) deleteName(ctx context.Context, name string) error {
	v, err := s.runKey(ctx, deleteScript, name)
	if err != nil {
		return fmt.Errorf("redis delete: %w", err)
	}
	switch v {
	case int64(1):
		return nil
	case int64(0):
		return storage.ErrNotFound
	}
	return fmt.Errorf("redis delete: %w: reply of type %T", storage.ErrCorrupt, v)
}

// fenced runs a script that answers 1 when the token named the lease and
// 0 when it did not.
func (s *Store) fenced(ctx context.Context, op string, script *goredis.Script, key storage.Key, args ...any) error {
	v, err := s.run(ctx, script, key, args...)
	return fencedReply(op, v, err)
}

// fencedReply is the error of a fenced script's reply v or error err.
func fencedReply(op string, v any, err error) error {
	if err != nil {
		return fmt.Errorf("redis %s: %w", op, err)
	}
	switch v {
	case int64(1):
		return nil
	case int64(0):
		return storage.ErrLeaseLost
	}
	return fmt.Errorf("redis %s: %w: reply of type %T", op, storage.ErrCorrupt, v)
}

// run runs script on key's record: EVALSHA, falling back to EVAL (which
// caches the script again) when the server does not know it. A CORRUPT
// error from the script wraps storage.ErrCorrupt; an error that means
// Redis could not be reached or answer in time wraps
// storage.ErrUnavailable (see classify).
func (s *Store) run(ctx context.Context, script *goredis.Script, key storage.Key, args ...any) (any, error) {
	return s.runKey(ctx, script, s.keyName(key), args...)
}

// runDurable is run followed by WAIT when the store has a Durability;
// acked is how many replicas acknowledged the write, -1 for no WAIT.
func (s *Store) runDurable(ctx context.Context, script *goredis.Script, key storage.Key, args []any) (v any, acked int, err error) {
	return s.exec(ctx, script, s.keyName(key), true, args)
}

// runKey is run on the record's key name.
func (s *Store) runKey(ctx context.Context, script *goredis.Script, name string, args ...any) (any, error) {
	v, _, err := s.exec(ctx, script, name, false, args)
	return v, err
}

// exec runs script on the key name through the pipeliner.
func (s *Store) exec(ctx context.Context, script *goredis.Script, name string, durable bool, args []any) (any, int, error) {
	if s.invalid != nil {
		return nil, -1, s.invalid
	}
	v, acked, err := s.pipe.do(ctx, script, []string{name}, args, durable)
	if err != nil {
		if goredis.HasErrorPrefix(err, "CORRUPT") {
			return nil, -1, fmt.Errorf("%w: %v", storage.ErrCorrupt, err)
		}
		return nil, -1, s.classify(err)
	}
	return v, acked, nil
}

// completedRecord builds a completed Record from its stored parts. The body
// aliases the reply (see the package documentation).
func completedRecord(fp []byte, created, expires int64, head, body []byte, withBody bool) (*storage.Record, error) {
	resp, err := storage.DecodeResponse(head)
	if err != nil {
		return nil, err
	}
	if len(resp.Body) > 0 {
		return nil, fmt.Errorf("%w: %d body bytes in the head", storage.ErrCorrupt, len(resp.Body))
	}
	if withBody && len(body) > 0 {
		resp.Body = body
	}
	return &storage.Record{
		Fingerprint: fp,
		State:       storage.Completed,
		Response:    resp,
		CreatedAt:   time.UnixMilli(created),
		ExpiresAt:   time.UnixMilli(expires),
	}, nil
}

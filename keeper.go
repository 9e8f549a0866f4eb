package idempotency

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// keeper owns a request's conversation with its handler's store: what a
// request says to the store (claim, await, complete, release), the lease
// it holds meanwhile, and the writes aftercare takes over when the store
// cannot take them at once. Its store calls are observed (store.go).
type keeper struct {
	store       *instrumentedStore
	lockTimeout time.Duration
	ttl         time.Duration
	logger      *zap.Logger
	aftercare   *aftercare

	// runShort: a reservation that fewer replicas acknowledged than the
	// store waits for runs (on_storage_error fail_open), see claim.
	runShort bool
}

// keeperOptions is what a keeper keeps a handler's requests with.
type keeperOptions struct {
	store       *instrumentedStore
	lockTimeout time.Duration // a lease's length
	ttl         time.Duration // how long records are kept
	logger      *zap.Logger
}

// newKeeper is the keeper of a handler's requests on o.store: leases of
// o.lockTimeout, records kept for o.ttl, writes the store cannot take at
// once retried in the background while the store is held open.
func newKeeper(o keeperOptions) *keeper {
	return &keeper{store: o.store, lockTimeout: o.lockTimeout, ttl: o.ttl, logger: o.logger,
		aftercare: &aftercare{store: o.store, hold: o.store.hold, logger: o.logger,
			backlog: metrics.aftercare.WithLabelValues(o.store.backend), abandons: metrics.abandons.WithLabelValues(o.store.backend)}}
}

// claim reserves key for a request. A reservation that an earlier
// request abandoned (its Reserve failed, yet may have been written) is
// released on the spot when it is what holds the key: the client was told
// 503 and invited to retry. Store calls outlive the client: a reservation
// made for a client that hung up mid-call must still be answered for.
func (k *keeper) claim(ctx context.Context, key storage.Key, fp []byte) (storage.Reservation, error) {
	ctx = detach(ctx)
	res, err := k.store.Reserve(ctx, key, fp, k.lockTimeout)
	if err == nil && res.Outcome == storage.Conflict && k.aftercare.reclaim(key) {
		res, err = k.store.Reserve(ctx, key, fp, k.lockTimeout)
	}
	if err != nil && k.runShort && errors.Is(err, storage.ErrNotReplicated) && res.Outcome == storage.Acquired && res.Token != 0 {
		// fail_open would pass the request on without idempotency, and
		// every retry would run again; run it on the reservation the
		// primary holds instead, as on_timeout proceed does: as
		// available, and its key still runs once there. (The store
		// counts and logs the shortfall.)
		return res, nil
	}
	if err != nil {
		k.abandon(key, res.Token, err)
	}
	return res, err
}

// maxWaitBetweenLooks bounds one Wait on a store that notifies: a waiter
// looks at the record at least this often. Looking costs a store round
// trip (a transaction on PostgreSQL), so it is not short.
const maxWaitBetweenLooks = 5 * time.Second

// await blocks while the first request with key runs, for up to wait, and
// returns what the store holds then: a Replay when it completed, Acquired
// when it released the key (this request runs instead), still Conflict on
// timeout.
func (k *keeper) await(ctx context.Context, key storage.Key, fp []byte, res storage.Reservation, wait time.Duration) (storage.Reservation, error) {
	deadline := time.Now().Add(wait)
	pause := 10 * time.Millisecond
	for res.Outcome == storage.Conflict {
		remaining := time.Until(deadline)
		if remaining <= 0 || ctx.Err() != nil {
			return res, nil
		}
		// A Waiter wakes us when the record may have changed, a lapse
		// included; the cap only bounds how long a notification that got
		// lost (a reconnect) could keep a waiter from looking again.
		if k.store.Wait(ctx, key, min(remaining, maxWaitBetweenLooks)) != nil {
			// No notifications (or they failed): poll with backoff.
			sleep(ctx, min(pause, remaining))
			pause = min(2*pause, 250*time.Millisecond)
		}
		var err error
		if res, err = k.claim(ctx, key, fp); err != nil {
			return res, err
		}
	}
	return res, nil
}

// holdLease starts renewing the lease of a request that owns key, with
// every other lease on the store (renewer.go); the lease is stopped once
// the write that settles the record is done.
func (k *keeper) holdLease(key storage.Key, token storage.Token) *lease {
	return renewerFor(k.store, k.logger).hold(key, token, k.lockTimeout)
}

// complete records resp as the answer for key; if the store fails, it
// keeps trying in the background, keeping the lease that ctx carries
// alive meanwhile.
func (k *keeper) complete(ctx context.Context, key storage.Key, token storage.Token, resp *storage.Response) {
	l := leaseFrom(ctx)
	l.ending()
	err := k.store.Complete(detach(ctx), key, token, resp, k.ttl)
	switch {
	case err == nil:
	case errors.Is(err, storage.ErrLeaseLost):
		k.logger.Warn("idempotency lease was lost before the response could be recorded; a retry may run again",
			zap.String("key_hash", key.Hash()))
	case errors.Is(err, storage.ErrNotReplicated):
		// Written on the primary, but fewer replicas (or no synchronous
		// standby) than the store waits for have it: a failover now would
		// bring the record back in flight under this lease, and a retry
		// would run again once the lease lapsed. It is sent again, its
		// lease renewed meanwhile, until they have it or a new primary
		// does. (The store counts and logs the shortfall.)
		if c := k.logger.Check(zapcore.DebugLevel, "idempotent response not replicated yet; sending it again in the background"); c != nil {
			c.Write(zap.String("backend", k.store.backend), zap.String("key_hash", key.Hash()), zap.Error(err))
		}
		k.aftercare.add(&chore{kind: choreComplete, key: key, token: token, resp: resp, ttl: k.ttl, until: k.aftercareDeadline(), lease: l.keep(), replicas: true})
	case errors.Is(err, storage.ErrInvalid):
		// Retrying a write the store refuses for what it is would only
		// keep the key in flight for longer: its lease lapses.
		k.logger.Error("the idempotency store refused the response; its key stays in flight until its lease lapses, and a retry after that runs again",
			zap.String("backend", k.store.backend), zap.String("key_hash", key.Hash()), zap.Error(err))
	default:
		k.logger.Error("recording idempotent response failed; retrying in the background",
			zap.String("backend", k.store.backend), zap.String("key_hash", key.Hash()), zap.Error(err))
		k.aftercare.add(&chore{kind: choreComplete, key: key, token: token, resp: resp, ttl: k.ttl, until: k.aftercareDeadline(), lease: l.keep()})
	}
}

// release frees key so that a retry runs again; if the store fails, it
// keeps trying in the background, keeping the lease that ctx carries
// alive meanwhile (so that retries get 409, as they would from a request
// still running, until the key is free).
func (k *keeper) release(ctx context.Context, key storage.Key, token storage.Token, why string) {
	l := leaseFrom(ctx)
	l.ending()
	err := k.store.Release(detach(ctx), key, token)
	switch {
	case err == nil:
		if c := k.logger.Check(zapcore.DebugLevel, "idempotency key released"); c != nil {
			c.Write(zap.String("key_hash", key.Hash()), zap.String("reason", why))
		}
	case errors.Is(err, storage.ErrLeaseLost):
		// Someone else holds the key now; nothing of ours to free.
	default:
		k.logger.Error("releasing idempotency key failed; retrying in the background",
			zap.String("backend", k.store.backend), zap.String("key_hash", key.Hash()), zap.String("reason", why), zap.Error(err))
		k.aftercare.add(&chore{kind: choreRelease, key: key, token: token, until: k.aftercareDeadline(), lease: l.keep()})
	}
}

// abandon removes, once the store answers again, the reservation that a
// failed Reserve may have written after all (its outcome is unknown; a
// store that was full or busy wrote nothing), so
// that the retry the client was invited to make is not met by a 409 for
// a whole lease.
func (k *keeper) abandon(key storage.Key, token storage.Token, err error) {
	if token == 0 || errors.Is(err, storage.ErrFull) || errors.Is(err, storage.ErrScopeFull) || errors.Is(err, storage.ErrBusy) {
		return
	}
	k.aftercare.add(&chore{kind: choreAbandon, key: key, token: token, until: time.Now().Add(k.lockTimeout)})
}

// aftercareDeadline is how long a write that failed after the upstream ran
// is retried, its lease renewed meanwhile: at least a lease, and a minute,
// so that a store outage a renewal cannot bridge either ends with the
// record written (the stores keep a lapsed in-flight record that nobody
// took over and still let its owner complete it).
func (k *keeper) aftercareDeadline() time.Time {
	return time.Now().Add(max(k.lockTimeout, time.Minute))
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// detachedContext is context.WithoutCancel's context, as a pointer that
// can live inside the exchange: WithoutCancel allocates, and its Value
// boxes the context again on every lookup (a store call looks up its
// span, the lease and the logger's fields several times).
//
// The context of the write that settles a record also carries its lease
// (withLease's value, without an allocation of its own).
type detachedContext struct {
	parent context.Context
	lease  *lease // nil: none of its own
}

// detach returns ctx without its cancellation and deadline, and with its
// values.
func detach(ctx context.Context) context.Context {
	if d, ok := ctx.(*detachedContext); ok {
		return d
	}
	return &detachedContext{parent: ctx}
}

func (*detachedContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*detachedContext) Done() <-chan struct{}       { return nil }
func (*detachedContext) Err() error                  { return nil }

// Value is the parent's, but for the context package's own lookup of the
// cancelable context above (context.Cause, AfterFunc): a *int key whose
// value is a context. A detached context has none, as WithoutCancel's.
func (c *detachedContext) Value(key any) any {
	if _, isLease := key.(leaseKey); isLease && c.lease != nil {
		return c.lease
	}
	v := c.parent.Value(key)
	if _, isContext := v.(context.Context); isContext {
		if _, isIntPointer := key.(*int); isIntPointer {
			return nil
		}
	}
	return v
}

func (c *detachedContext) String() string { return "idempotency.detached" }

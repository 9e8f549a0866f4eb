package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// keeper owns a handler's conversation with its store: what a request
// says to the store (claim, await, complete, release), the lease it
// holds meanwhile, and the writes aftercare takes over when the store
// cannot take them at once. Every call to the store goes through one of
// the methods named for the storage operations below, which observe it
// (latency histogram, child span) without wrapping the store, so that a
// store's optional interfaces (Waiter, HashFinder) stay visible and are
// observed like the rest. The admin API talks to a store through a keeper
// too. It knows nothing of HTTP.
type keeper struct {
	store   storage.Store
	waiter  storage.Waiter         // nil when the store cannot notify
	finder  storage.HashFinder     // nil when the store cannot find by key hash
	lister  storage.InFlightLister // nil when the store cannot list
	backend string
	latency map[string]prometheus.Observer // by op

	// A handler's keeper only (zero for the admin API's).
	lockTimeout time.Duration
	ttl         time.Duration
	logger      *zap.Logger
	aftercare   *aftercare
}

// newKeeper observes store, which the backend module named backend opened.
func newKeeper(store storage.Store, backend string) *keeper {
	initMetrics()
	k := &keeper{store: store, backend: backend, latency: make(map[string]prometheus.Observer, len(storeOps))}
	k.waiter, _ = store.(storage.Waiter)
	k.finder, _ = store.(storage.HashFinder)
	k.lister, _ = store.(storage.InFlightLister)
	for _, op := range storeOps {
		k.latency[op] = metrics.storeDuration.WithLabelValues(backend, op)
	}
	return k
}

// forHandler makes k the keeper of a handler's requests: leases of
// lockTimeout, records kept for ttl, writes the store cannot take at once
// retried in the background while hold keeps the store open.
func (k *keeper) forHandler(lockTimeout, ttl time.Duration, logger *zap.Logger, hold func() (func(), bool)) *keeper {
	k.lockTimeout, k.ttl, k.logger = lockTimeout, ttl, logger
	k.aftercare = &aftercare{store: k, hold: hold, logger: logger,
		backlog: metrics.aftercare.WithLabelValues(k.backend), abandons: metrics.abandons.WithLabelValues(k.backend)}
	return k
}

// The store's operations, one call each, observed. Lease renewal and
// aftercare call these; requests go through the conversation below.

// begin starts observing op.
func (k *keeper) begin(ctx context.Context, op string) (time.Time, trace.Span) {
	return time.Now(), startStoreSpan(ctx, op, k.backend)
}

// end records op, begun at start, with its error.
func (k *keeper) end(op string, start time.Time, span trace.Span, err error) {
	k.latency[op].Observe(time.Since(start).Seconds())
	endStoreSpan(span, err)
}

// Reserve is storage.Store.Reserve, observed.
func (k *keeper) Reserve(ctx context.Context, key storage.Key, fp []byte, lease time.Duration) (storage.Reservation, error) {
	start, span := k.begin(ctx, "reserve")
	res, err := k.store.Reserve(ctx, key, fp, lease)
	k.end("reserve", start, span, err)
	return res, err
}

// Complete is storage.Store.Complete, observed.
func (k *keeper) Complete(ctx context.Context, key storage.Key, token storage.Token, resp *storage.Response, ttl time.Duration) error {
	start, span := k.begin(ctx, "complete")
	err := k.store.Complete(ctx, key, token, resp, ttl)
	k.end("complete", start, span, err)
	return err
}

// Release is storage.Store.Release, observed.
func (k *keeper) Release(ctx context.Context, key storage.Key, token storage.Token) error {
	start, span := k.begin(ctx, "release")
	err := k.store.Release(ctx, key, token)
	k.end("release", start, span, err)
	return err
}

// Renew is storage.Store.Renew, observed.
func (k *keeper) Renew(ctx context.Context, key storage.Key, token storage.Token, lease time.Duration) error {
	start, span := k.begin(ctx, "renew")
	err := k.store.Renew(ctx, key, token, lease)
	k.end("renew", start, span, err)
	return err
}

// Get is storage.Store.Get, observed.
func (k *keeper) Get(ctx context.Context, key storage.Key, withBody bool) (*storage.Record, error) {
	start, span := k.begin(ctx, "get")
	rec, err := k.store.Get(ctx, key, withBody)
	k.end("get", start, span, err)
	return rec, err
}

// Delete is storage.Store.Delete, observed.
func (k *keeper) Delete(ctx context.Context, key storage.Key) error {
	start, span := k.begin(ctx, "delete")
	err := k.store.Delete(ctx, key)
	k.end("delete", start, span, err)
	return err
}

// errCannotWait: the store does not notify (no storage.Waiter).
var errCannotWait = errors.New("the store does not notify waiters")

// Wait is storage.Waiter.Wait, observed; errCannotWait when the store
// does not notify.
func (k *keeper) Wait(ctx context.Context, key storage.Key, timeout time.Duration) error {
	if k.waiter == nil {
		return errCannotWait
	}
	start, span := k.begin(ctx, "wait")
	err := k.waiter.Wait(ctx, key, timeout)
	k.end("wait", start, span, err)
	return err
}

// GetByHash is storage.HashFinder.GetByHash, observed as a get; nothing
// found when the store cannot look records up by key hash.
func (k *keeper) GetByHash(ctx context.Context, keyHash string, withBody bool) ([]*storage.Record, error) {
	if k.finder == nil {
		return nil, nil
	}
	start, span := k.begin(ctx, "get")
	recs, err := k.finder.GetByHash(ctx, keyHash, withBody)
	k.end("get", start, span, err)
	return recs, err
}

// DeleteByHash is storage.HashFinder.DeleteByHash, observed as a delete.
func (k *keeper) DeleteByHash(ctx context.Context, keyHash string) (int, error) {
	if k.finder == nil {
		return 0, nil
	}
	start, span := k.begin(ctx, "delete")
	n, err := k.finder.DeleteByHash(ctx, keyHash)
	k.end("delete", start, span, err)
	return n, err
}

// ListInFlight is storage.InFlightLister.ListInFlight, observed as a
// get; nothing when the store cannot list.
func (k *keeper) ListInFlight(ctx context.Context, after string, limit int) ([]storage.HashedRecord, error) {
	if k.lister == nil {
		return nil, nil
	}
	start, span := k.begin(ctx, "get")
	page, err := k.lister.ListInFlight(ctx, after, limit)
	k.end("get", start, span, err)
	return page, err
}

// The conversation of a request.

// claim reserves key for a request. A reservation that an earlier
// request abandoned (its Reserve failed, yet may have been written) is
// released on the spot when it is what holds the key: the client was told
// 503 and invited to retry. Store calls outlive the client: a reservation
// made for a client that hung up mid-call must still be answered for.
func (k *keeper) claim(ctx context.Context, key storage.Key, fp []byte) (storage.Reservation, error) {
	ctx = context.WithoutCancel(ctx)
	res, err := k.Reserve(ctx, key, fp, k.lockTimeout)
	if err == nil && res.Outcome == storage.Conflict && k.aftercare.reclaim(key) {
		res, err = k.Reserve(ctx, key, fp, k.lockTimeout)
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
		if k.Wait(ctx, key, min(remaining, maxWaitBetweenLooks)) != nil {
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
	return renewerFor(k).hold(key, token, k.lockTimeout)
}

// complete records resp as the answer for key; if the store fails, it
// keeps trying in the background, keeping the lease that ctx carries
// alive meanwhile.
func (k *keeper) complete(ctx context.Context, key storage.Key, token storage.Token, resp *storage.Response) {
	l := leaseFrom(ctx)
	l.settle()
	err := k.Complete(context.WithoutCancel(ctx), key, token, resp, k.ttl)
	switch {
	case err == nil:
	case errors.Is(err, storage.ErrLeaseLost):
		k.logger.Warn("idempotency lease was lost before the response could be recorded; a retry may run again",
			zap.String("key_hash", key.Hash()))
	case errors.Is(err, storage.ErrInvalid):
		// Retrying a write the store refuses for what it is would only
		// keep the key in flight for longer: its lease lapses.
		k.logger.Error("the idempotency store refused the response; its key stays in flight until its lease lapses, and a retry after that runs again",
			zap.String("backend", k.backend), zap.String("key_hash", key.Hash()), zap.Error(err))
	default:
		k.logger.Error("recording idempotent response failed; retrying in the background",
			zap.String("backend", k.backend), zap.String("key_hash", key.Hash()), zap.Error(err))
		k.aftercare.add(&chore{kind: choreComplete, key: key, token: token, resp: resp, ttl: k.ttl, until: k.aftercareDeadline(), lease: l.keep()})
	}
}

// release frees key so that a retry runs again; if the store fails, it
// keeps trying in the background, keeping the lease that ctx carries
// alive meanwhile (so that retries get 409, as they would from a request
// still running, until the key is free).
func (k *keeper) release(ctx context.Context, key storage.Key, token storage.Token, why string) {
	l := leaseFrom(ctx)
	l.settle()
	err := k.Release(context.WithoutCancel(ctx), key, token)
	switch {
	case err == nil:
		if c := k.logger.Check(zapcore.DebugLevel, "idempotency key released"); c != nil {
			c.Write(zap.String("key_hash", key.Hash()), zap.String("reason", why))
		}
	case errors.Is(err, storage.ErrLeaseLost):
		// Someone else holds the key now; nothing of ours to free.
	default:
		k.logger.Error("releasing idempotency key failed; retrying in the background",
			zap.String("backend", k.backend), zap.String("key_hash", key.Hash()), zap.String("reason", why), zap.Error(err))
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

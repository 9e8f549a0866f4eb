package idempotency

// The lease of an in-flight record, kept alive from the moment its request
// runs until the write that settles the record is done (aftercare.go
// retries that write when the store cannot take it at once).

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Renewal cadence. An attempt starts every lock_timeout/renewals, counted
// from the start of the one before whatever became of it, and gives up
// after half of that: an attempt stuck on a black-holed store (PostgreSQL
// adds a 300ms cancel grace) never delays the next, and once the store
// answers again a renewal lands within a tenth of the lease. The lease so
// outlives any interruption d (the store unreachable or stalled, or this
// process stalled) with d + 2δ < 8/10 of lock_timeout, δ being how long a
// renewal takes to reach the store: 3/4 of lock_timeout while δ is below
// a fortieth of it (docs/guarantees.md).
const (
	renewals = 10

	// maxRenewing bounds the attempts of one lease outstanding at once,
	// against a store that does not honour deadlines. An attempt of one
	// that does lasts at most its timeout and PostgreSQL's cancel grace,
	// 350ms at the floor of lock_timeout (1s): 4 outstanding at most, so
	// the bound never holds back such an attempt.
	maxRenewing = 5
)

// clock is what a lease needs of time; tests drive a fake one.
type clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) stopper
}

// stopper is a timer that AfterFunc started.
type stopper interface{ Stop() bool }

type wallClock struct{}

func (wallClock) Now() time.Time                              { return time.Now() }
func (wallClock) AfterFunc(d time.Duration, f func()) stopper { return time.AfterFunc(d, f) }

// lease keeps the lease on an in-flight record alive. It has holders: the
// request while it runs and settles its record, and the aftercare chore
// that takes over the write when the store could not take it at once.
// Renewal ends when the last holder stops, or when the store says the
// lease is lost.
// renewer is the part of a store (observed, see keeper) that renews
// leases.
type renewer interface {
	Renew(ctx context.Context, key storage.Key, token storage.Token, lease time.Duration) error
}

type lease struct {
	store   renewer
	logger  *zap.Logger
	clock   clock
	key     storage.Key
	token   storage.Token
	length  time.Duration
	every   time.Duration // cadence: attempts start this far apart
	timeout time.Duration // an attempt gives up after this

	mu        sync.Mutex
	holders   int
	timer     stopper
	renewing  int  // attempts outstanding
	lost      bool // the store said the token no longer names the lease
	settling  bool // a write that ends the lease was sent: its loss is expected
	failing   int  // attempts failed since the last success (for the log)
	throttled bool // an attempt was held back by maxRenewing (logged once)
}

// holdLease starts renewing the lease named by token on store; the caller
// holds it until it calls stop.
func holdLease(store renewer, logger *zap.Logger, key storage.Key, token storage.Token, length time.Duration) *lease {
	return holdLeaseOn(wallClock{}, store, logger, key, token, length)
}

func holdLeaseOn(c clock, store renewer, logger *zap.Logger, key storage.Key, token storage.Token, length time.Duration) *lease {
	every := length / renewals
	l := &lease{store: store, logger: logger, clock: c, key: key, token: token, length: length,
		every: every, timeout: every / 2, holders: 1}
	l.mu.Lock()
	l.timer = c.AfterFunc(every, l.renew)
	l.mu.Unlock()
	return l
}

// renew makes one attempt, having first scheduled the next one: however
// long this one takes, the next starts on time.
func (l *lease) renew() {
	l.mu.Lock()
	if l.holders == 0 || l.lost {
		l.mu.Unlock()
		return
	}
	start := l.clock.Now()
	l.timer = l.clock.AfterFunc(l.every, l.renew)
	if l.renewing >= maxRenewing {
		warn := !l.throttled
		l.throttled = true
		l.mu.Unlock()
		if warn {
			l.logger.Warn("idempotency store does not answer lease renewals within their deadline; holding back new ones",
				zap.String("key_hash", l.key.Hash()), zap.Int("outstanding", maxRenewing))
		}
		return
	}
	l.renewing++
	l.mu.Unlock()

	// Renewals go through the handler's timed store (latency metric); they
	// belong to no request's trace.
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(l.timeout))
	err := l.store.Renew(ctx, l.key, l.token, l.length)
	cancel()
	l.renewed(err)
}

// renewed takes the answer of one attempt.
func (l *lease) renewed(err error) {
	l.mu.Lock()
	l.renewing--
	if l.holders == 0 || l.lost {
		l.mu.Unlock()
		return // done with: the write that settled the record reports
	}
	failed, settling := l.failing, l.settling
	switch {
	case err == nil:
		l.failing = 0
	case errors.Is(err, storage.ErrLeaseLost):
		l.lost = true
		l.timer.Stop()
	default:
		l.failing++
	}
	l.mu.Unlock()

	kh := zap.String("key_hash", l.key.Hash())
	switch {
	case err == nil:
		if failed > 0 {
			l.logger.Info("renewed idempotency lease after failed attempts", kh, zap.Int("failed", failed))
		}
	case errors.Is(err, storage.ErrLeaseLost):
		// Deleted by an admin, or taken over after a lapse: the record is
		// someone else's now. (Once settling, the write that settles the
		// record reports what became of it.)
		if !settling {
			l.logger.Warn("idempotency lease lost while the request runs; its response will not be recorded", kh)
		}
	case failed == 0:
		l.logger.Warn("renewing idempotency lease failed; retrying", kh, zap.Duration("every", l.every), zap.Error(err))
	default:
		if c := l.logger.Check(zapcore.DebugLevel, "renewing idempotency lease failed again"); c != nil {
			c.Write(kh, zap.Int("failed", failed+1), zap.Error(err))
		}
	}
}

// settle says that the write ending the lease (Complete or Release) is
// about to be sent: renewal goes on until it is done, and a renewal that
// then finds the lease gone is no news.
func (l *lease) settle() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.settling = true
	l.mu.Unlock()
}

// keep adds a holder, for a chore that takes over the write; it returns
// l, or nil when renewal has ended already (nothing to keep alive).
func (l *lease) keep() *lease {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holders == 0 || l.lost {
		return nil
	}
	l.holders++
	return l
}

// stop drops a holder; renewal ends with the last one. An attempt already
// running finishes on its own and cannot touch the record once it is
// completed or released (fencing).
func (l *lease) stop() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holders == 0 {
		return
	}
	l.holders--
	if l.holders == 0 {
		l.timer.Stop()
	}
}

// leaseKey carries a request's lease in the context of the write that
// settles its record.
type leaseKey struct{}

func withLease(ctx context.Context, l *lease) context.Context {
	return context.WithValue(ctx, leaseKey{}, l)
}

// leaseFrom is the lease ctx carries, nil when none.
func leaseFrom(ctx context.Context) *lease {
	l, _ := ctx.Value(leaseKey{}).(*lease)
	return l
}

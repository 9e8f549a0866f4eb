package idempotency

// The lease of an in-flight record, kept alive from the moment its request
// runs until the write that settles the record is done (aftercare.go
// retries that write when the store cannot take it at once). The renewals
// themselves are the store's renewer's (renewer.go): one batch per tick
// for every lease on the store.

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// clock is what renewals need of time; tests drive a fake one.
type clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) stopper
}

// stopper is a timer that AfterFunc started.
type stopper interface{ Stop() bool }

type wallClock struct{}

func (wallClock) Now() time.Time                              { return time.Now() }
func (wallClock) AfterFunc(d time.Duration, f func()) stopper { return time.AfterFunc(d, f) }

// lease is the lease on one in-flight record. It has holders: the request
// while it runs and settles its record, and the aftercare chore that takes
// over the write when the store could not take it at once. The store's
// renewer renews it while it has holders, until the store says it is lost.
type lease struct {
	key    storage.Key
	token  storage.Token
	length time.Duration

	mu       sync.Mutex
	holders  int
	lost     bool // the store said the token no longer names the lease
	settling bool // a write that ends the lease was sent: its loss is expected
}

// alive reports whether the lease is still to be renewed.
func (l *lease) alive() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.holders > 0 && !l.lost
}

// renewed takes the store's answer to one renewal: whether the loss of
// the lease is news (a request still running lost it).
//
// Once the write that ends the lease was sent, a lost lease is expected
// (the record is completed or released where the write landed) and
// renewal goes on while the lease is held: a chore sending the write
// again holds it, and a failover may bring back a copy of the record
// still in flight under this lease (a completion the promoted replica did
// not get), whose lease must not lapse before the write reaches it. Its
// renewals are fenced by the token like any other.
func (l *lease) renewed(err error) (lostRunning bool) {
	if !errors.Is(err, storage.ErrLeaseLost) {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.settling {
		return false
	}
	news := !l.lost && l.holders > 0
	l.lost = true
	return news
}

// ending says that the write ending the lease (Complete or Release) is
// about to be sent: renewal goes on until it is done, and a renewal that
// then finds the lease gone is no news.
func (l *lease) ending() {
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

// stop drops a holder; renewal ends with the last one. A renewal already
// sent cannot touch the record once it is completed or released
// (fencing).
func (l *lease) stop() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holders > 0 {
		l.holders--
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

package idempotency

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// lease keeps the lease on an in-flight record alive while its request
// runs, renewing it every third of lock_timeout: two renewals can fail
// before it lapses.
type lease struct {
	h     *Handler
	key   storage.Key
	token storage.Token
	every time.Duration

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	lost    atomic.Bool
}

// holdLease starts renewing the lease named by token.
func (h *Handler) holdLease(key storage.Key, token storage.Token) *lease {
	l := &lease{h: h, key: key, token: token, every: time.Duration(h.LockTimeout) / 3}
	l.mu.Lock()
	l.timer = time.AfterFunc(l.every, l.renew)
	l.mu.Unlock()
	return l
}

func (l *lease) renew() {
	ctx, cancel := context.WithTimeout(context.Background(), l.every)
	err := l.h.ops.Renew(ctx, l.key, l.token, time.Duration(l.h.LockTimeout))
	cancel()
	switch {
	case errors.Is(err, storage.ErrLeaseLost):
		// Deleted by an admin, or taken over after a lapse: the record is
		// someone else's now and this request's response will not be kept.
		l.lost.Store(true)
		l.h.logger.Warn("idempotency lease lost while the request runs; its response will not be recorded",
			zap.String("key_hash", keyHash(l.key)))
		return
	case err != nil:
		l.h.logger.Warn("renewing idempotency lease", zap.String("key_hash", keyHash(l.key)), zap.Error(err))
	}
	l.mu.Lock()
	if !l.stopped {
		l.timer.Reset(l.every)
	}
	l.mu.Unlock()
}

// stop ends renewal; a renewal already running finishes on its own and
// cannot touch the record once it is completed or released.
func (l *lease) stop() {
	l.mu.Lock()
	l.stopped = true
	l.timer.Stop()
	l.mu.Unlock()
}

package idempotency

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// lease keeps the lease on an in-flight record alive while its request
// runs, renewing it every third of its length: two renewals can fail
// before it lapses.
type lease struct {
	store  storage.Store
	logger *zap.Logger
	key    storage.Key
	token  storage.Token
	length time.Duration

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
}

// holdLease starts renewing the lease named by token on store.
func holdLease(store storage.Store, logger *zap.Logger, key storage.Key, token storage.Token, length time.Duration) *lease {
	l := &lease{store: store, logger: logger, key: key, token: token, length: length}
	l.mu.Lock()
	l.timer = time.AfterFunc(length/3, l.renew)
	l.mu.Unlock()
	return l
}

func (l *lease) renew() {
	ctx, cancel := context.WithTimeout(context.Background(), l.length/3)
	err := l.store.Renew(ctx, l.key, l.token, l.length)
	cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return // finished meanwhile: the request reports what happened
	}
	switch {
	case errors.Is(err, storage.ErrLeaseLost):
		// Deleted by an admin, or taken over after a lapse: the record is
		// someone else's now and this request's response will not be kept.
		l.logger.Warn("idempotency lease lost while the request runs; its response will not be recorded",
			zap.String("key_hash", l.key.Hash()))
		return
	case err != nil:
		l.logger.Warn("renewing idempotency lease", zap.String("key_hash", l.key.Hash()), zap.Error(err))
	}
	l.timer.Reset(l.length / 3)
}

// stop ends renewal; a renewal already running finishes on its own and
// cannot touch the record once it is completed or released.
func (l *lease) stop() {
	l.mu.Lock()
	l.stopped = true
	l.timer.Stop()
	l.mu.Unlock()
}

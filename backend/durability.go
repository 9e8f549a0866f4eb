package backend

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// DurabilityResult is what a store said, when last asked, about what
// protects its records across a failover (storage.DurabilityReporter).
type DurabilityResult struct {
	// At is when it was asked; zero when never (or the store cannot
	// tell).
	At time.Time
	// Facts are the store's facts, a value encoding/json writes as an
	// object; nil when it did not answer. They may come with Err (a
	// PostgreSQL standby says what it is, and that it refuses writes).
	Facts any
	// Err is why the store cannot keep records there, or did not answer.
	Err error
}

// durability asks the store for its facts (if it can tell), records the
// result and returns it.
func (p *pooledStore) durability(ctx context.Context) DurabilityResult {
	d, ok := p.Store.(storage.DurabilityReporter)
	if !ok {
		return DurabilityResult{}
	}
	r := DurabilityResult{At: time.Now()}
	r.Facts, r.Err = d.Durability(ctx)
	if r.Facts == nil && r.Err == nil {
		return DurabilityResult{} // a wrapper around a store that cannot tell
	}
	p.mu.Lock()
	if !r.At.Before(p.lastDurability.At) { // the last one asked, as for pings
		p.lastDurability = r
	}
	p.mu.Unlock()
	return r
}

// logDurability logs what protects the records of a store just opened and
// pinged, and warns when it cannot keep them where it is connected.
func (p *pooledStore) logDurability(ctx context.Context, logger *zap.Logger, id, where string) {
	r := p.durability(ctx)
	if r.At.IsZero() {
		return
	}
	fields := []zap.Field{zap.String("backend", p.backend), zap.String("store", id), zap.String("address", where), zap.Any("durability", r.Facts)}
	switch {
	case r.Err != nil && errors.Is(r.Err, storage.ErrUnavailable):
		logger.Warn("idempotency store cannot keep records where it is connected; requests using it follow on_storage_error", append(fields, zap.Error(r.Err))...)
		return
	case r.Err != nil:
		// It can keep them, less durably than configured (a Redis
		// primary short of replicas, with on_timeout proceed).
		logger.Warn("idempotency store cannot keep records as durably as configured where it is connected; requests using it go on", append(fields, zap.Error(r.Err))...)
		return
	}
	logger.Info("idempotency store durability", fields...)
}

// LastDurability is the store's facts when last asked: at start, or by
// the last Durability.
func (s LiveStore) LastDurability() DurabilityResult {
	s.entry.mu.Lock()
	defer s.entry.mu.Unlock()
	return s.entry.lastDurability
}

// Durability asks the store now what protects its records across a
// failover (a zero result for a store that cannot tell), and records the
// result as its last.
func (s LiveStore) Durability(ctx context.Context) DurabilityResult { return s.entry.durability(ctx) }

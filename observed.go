package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// observedStore is a store whose every call is observed (latency
// histogram, child span) without wrapping it, so that its optional
// interfaces (Waiter, HashFinder, InFlightLister) stay visible and are
// observed like the rest: one method per storage operation, named after
// it. It also owns the store's hold (backend.Holder), so that whoever
// talks to the store keeps it open. The request's conversation
// (keeper.go), lease renewal (renewer.go), aftercare and the admin API
// call the store through it. It knows nothing of HTTP.
type observedStore struct {
	store   storage.Store
	waiter  storage.Waiter         // nil when the store cannot notify
	finder  storage.HashFinder     // nil when the store cannot find by key hash
	lister  storage.InFlightLister // nil when the store cannot list
	holder  backend.Holder         // nil when the store closes only with its module
	backend string
	latency map[string]prometheus.Observer // by op
}

// observe observes store, which the backend module named name opened;
// holder, when not nil, holds it open.
func observe(store storage.Store, name string, holder backend.Holder) *observedStore {
	initMetrics()
	s := &observedStore{store: store, holder: holder, backend: name, latency: make(map[string]prometheus.Observer, len(storeOps))}
	s.waiter, _ = store.(storage.Waiter)
	s.finder, _ = store.(storage.HashFinder)
	s.lister, _ = store.(storage.InFlightLister)
	for _, op := range storeOps {
		s.latency[op] = metrics.storeDuration.WithLabelValues(name, op)
	}
	return s
}

// hold keeps the store open until release is called (see
// backend.Holder); ok is false when it is closed already.
func (s *observedStore) hold() (release func(), ok bool) {
	if s.holder == nil {
		return func() {}, true
	}
	return s.holder.HoldStore()
}

// begin starts observing op.
func (s *observedStore) begin(ctx context.Context, op string) (time.Time, trace.Span) {
	return time.Now(), startStoreSpan(ctx, op, s.backend)
}

// end records op, begun at start, with its error.
func (s *observedStore) end(op string, start time.Time, span trace.Span, err error) {
	s.latency[op].Observe(time.Since(start).Seconds())
	endStoreSpan(span, err)
}

// Reserve is storage.Store.Reserve, observed.
func (s *observedStore) Reserve(ctx context.Context, key storage.Key, fp []byte, lease time.Duration) (storage.Reservation, error) {
	start, span := s.begin(ctx, "reserve")
	res, err := s.store.Reserve(ctx, key, fp, lease)
	s.end("reserve", start, span, err)
	return res, err
}

// Complete is storage.Store.Complete, observed.
func (s *observedStore) Complete(ctx context.Context, key storage.Key, token storage.Token, resp *storage.Response, ttl time.Duration) error {
	start, span := s.begin(ctx, "complete")
	err := s.store.Complete(ctx, key, token, resp, ttl)
	s.end("complete", start, span, err)
	return err
}

// Release is storage.Store.Release, observed.
func (s *observedStore) Release(ctx context.Context, key storage.Key, token storage.Token) error {
	start, span := s.begin(ctx, "release")
	err := s.store.Release(ctx, key, token)
	s.end("release", start, span, err)
	return err
}

// Renew is storage.Store.Renew, observed.
func (s *observedStore) Renew(ctx context.Context, key storage.Key, token storage.Token, lease time.Duration) error {
	start, span := s.begin(ctx, "renew")
	err := s.store.Renew(ctx, key, token, lease)
	s.end("renew", start, span, err)
	return err
}

// Get is storage.Store.Get, observed.
func (s *observedStore) Get(ctx context.Context, key storage.Key, withBody bool) (*storage.Record, error) {
	start, span := s.begin(ctx, "get")
	rec, err := s.store.Get(ctx, key, withBody)
	s.end("get", start, span, err)
	return rec, err
}

// Delete is storage.Store.Delete, observed.
func (s *observedStore) Delete(ctx context.Context, key storage.Key) error {
	start, span := s.begin(ctx, "delete")
	err := s.store.Delete(ctx, key)
	s.end("delete", start, span, err)
	return err
}

// errCannotWait: the store does not notify (no storage.Waiter).
var errCannotWait = errors.New("the store does not notify waiters")

// Wait is storage.Waiter.Wait, observed; errCannotWait when the store
// does not notify.
func (s *observedStore) Wait(ctx context.Context, key storage.Key, timeout time.Duration) error {
	if s.waiter == nil {
		return errCannotWait
	}
	start, span := s.begin(ctx, "wait")
	err := s.waiter.Wait(ctx, key, timeout)
	s.end("wait", start, span, err)
	return err
}

// GetByHash is storage.HashFinder.GetByHash, observed as a get; nothing
// found when the store cannot look records up by key hash.
func (s *observedStore) GetByHash(ctx context.Context, keyHash string, withBody bool) ([]*storage.Record, error) {
	if s.finder == nil {
		return nil, nil
	}
	start, span := s.begin(ctx, "get")
	recs, err := s.finder.GetByHash(ctx, keyHash, withBody)
	s.end("get", start, span, err)
	return recs, err
}

// DeleteByHash is storage.HashFinder.DeleteByHash, observed as a delete.
func (s *observedStore) DeleteByHash(ctx context.Context, keyHash string) (int, error) {
	if s.finder == nil {
		return 0, nil
	}
	start, span := s.begin(ctx, "delete")
	n, err := s.finder.DeleteByHash(ctx, keyHash)
	s.end("delete", start, span, err)
	return n, err
}

// ListInFlight is storage.InFlightLister.ListInFlight, observed as a
// get; nothing when the store cannot list.
func (s *observedStore) ListInFlight(ctx context.Context, after string, limit int) ([]storage.HashedRecord, error) {
	if s.lister == nil {
		return nil, nil
	}
	start, span := s.begin(ctx, "get")
	page, err := s.lister.ListInFlight(ctx, after, limit)
	s.end("get", start, span, err)
	return page, err
}

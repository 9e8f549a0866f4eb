package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/opterr"

	// The built-in storage backends, so that `xcaddy --with` this module
	// brings them. Each is a guest module in its own package, built on the
	// same kit (package backend) as a third party's.
	_ "github.com/caddy-idempotency/caddy-idempotency/backend/memory"
	_ "github.com/caddy-idempotency/caddy-idempotency/backend/postgres"
	_ "github.com/caddy-idempotency/caddy-idempotency/backend/redis"
)

// loadStorage loads the storage backend and wires the handler to its
// store.
func (h *Handler) loadStorage(ctx caddy.Context) error {
	b, name, err := loadBackend(ctx, h)
	if err != nil {
		return err
	}
	h.backend, h.backendName = b, name
	store := b.Store()
	if kl, ok := store.(storage.KeyLimiter); ok && kl.MaxKeyLength() > 0 && h.policy.maxKeyLength > kl.MaxKeyLength() {
		// Refused at start-up, not with a 503 for every long key.
		return opterr.Errorf("max_key_length", "max_key_length %d is more than the %s store can hold: at most %d", h.policy.maxKeyLength, name, kl.MaxKeyLength())
	}
	holder, _ := b.(backend.Holder)
	h.keeper = newKeeper(keeperOptions{store: instrument(store, name, holder), lockTimeout: time.Duration(h.policy.lockTimeout), ttl: time.Duration(h.policy.ttl), logger: h.logger})
	h.waiters = new(waitRoom)
	h.keeper.runShort = h.policy.failOpen
	return nil
}

// loadBackend loads the handler's storage module, memory by default.
func loadBackend(ctx caddy.Context, h *Handler) (b backend.Backend, name string, err error) {
	var mod any
	if h.StorageRaw != nil {
		mod, err = ctx.LoadModule(h, "StorageRaw")
	} else {
		mod, err = ctx.LoadModuleByID(backend.Namespace+".memory", nil)
	}
	if err != nil {
		return nil, "", fmt.Errorf("loading idempotency storage: %w", err)
	}
	b, ok := mod.(backend.Backend)
	if !ok {
		return nil, "", fmt.Errorf("module %T is not an idempotency storage backend", mod)
	}
	return b, mod.(caddy.Module).CaddyModule().ID.Name(), nil
}

// instrumentedStore is a store whose every call is observed (latency
// histogram, child span) without wrapping it, so that its optional
// interfaces (Waiter, HashFinder, InFlightLister) stay visible and are
// measured like the rest: one method per storage operation, named after
// it. It also owns the store's hold (backend.Holder), so that whoever
// talks to the store keeps it open. The request's conversation
// (keeper.go), lease renewal (renewer.go), aftercare and the admin API
// call the store through it. It knows nothing of HTTP.
type instrumentedStore struct {
	store   storage.Store
	waiter  storage.Waiter               // nil when the store cannot notify
	finder  storage.HashFinder           // nil when the store cannot find by key hash
	lister  storage.InFlightLister       // nil when the store cannot list
	unknown storage.OutcomeUnknownKeeper // nil when the store cannot list outcome-unknown records
	holder  backend.Holder               // nil when the store closes only with its module
	backend string
	latency map[string]prometheus.Observer // by op
}

// instrument measures every call of store (its latency, a span), which
// the backend module named name opened; holder, when not nil, holds it
// open.
func instrument(store storage.Store, name string, holder backend.Holder) *instrumentedStore {
	initMetrics()
	s := &instrumentedStore{store: store, holder: holder, backend: name, latency: make(map[string]prometheus.Observer, len(storeOps))}
	s.waiter, _ = store.(storage.Waiter)
	s.finder, _ = store.(storage.HashFinder)
	s.lister, _ = store.(storage.InFlightLister)
	s.unknown, _ = store.(storage.OutcomeUnknownKeeper)
	for _, op := range storeOps {
		s.latency[op] = metrics.storeDuration.WithLabelValues(name, op)
	}
	return s
}

// hold keeps the store open until release is called (see
// backend.Holder); ok is false when it is closed already.
func (s *instrumentedStore) hold() (release func(), ok bool) {
	if s.holder == nil {
		return func() {}, true
	}
	return s.holder.HoldStore()
}

// begin starts observing op.
func (s *instrumentedStore) begin(ctx context.Context, op string) (time.Time, trace.Span) {
	return time.Now(), startStoreSpan(ctx, op, s.backend)
}

// end records op, begun at start, with its error.
func (s *instrumentedStore) end(op string, start time.Time, span trace.Span, err error) {
	s.latency[op].Observe(time.Since(start).Seconds())
	endStoreSpan(span, err)
}

// Reserve is storage.Store.Reserve, observed.
func (s *instrumentedStore) Reserve(ctx context.Context, key storage.Key, fp []byte, lease time.Duration) (storage.Reservation, error) {
	start, span := s.begin(ctx, "reserve")
	res, err := s.store.Reserve(ctx, key, fp, lease)
	s.end("reserve", start, span, err)
	return res, err
}

// Complete is storage.Store.Complete, observed.
func (s *instrumentedStore) Complete(ctx context.Context, key storage.Key, token storage.Token, resp *storage.Response, ttl time.Duration) error {
	start, span := s.begin(ctx, "complete")
	err := s.store.Complete(ctx, key, token, resp, ttl)
	s.end("complete", start, span, err)
	return err
}

// Release is storage.Store.Release, observed.
func (s *instrumentedStore) Release(ctx context.Context, key storage.Key, token storage.Token) error {
	start, span := s.begin(ctx, "release")
	err := s.store.Release(ctx, key, token)
	s.end("release", start, span, err)
	return err
}

// Renew is storage.Store.Renew, observed.
func (s *instrumentedStore) Renew(ctx context.Context, key storage.Key, token storage.Token, lease time.Duration) error {
	start, span := s.begin(ctx, "renew")
	err := s.store.Renew(ctx, key, token, lease)
	s.end("renew", start, span, err)
	return err
}

// Get is storage.Store.Get, observed.
func (s *instrumentedStore) Get(ctx context.Context, key storage.Key, withBody bool) (*storage.Record, error) {
	start, span := s.begin(ctx, "get")
	rec, err := s.store.Get(ctx, key, withBody)
	s.end("get", start, span, err)
	return rec, err
}

// Delete is storage.Store.Delete, observed.
func (s *instrumentedStore) Delete(ctx context.Context, key storage.Key) error {
	start, span := s.begin(ctx, "delete")
	err := s.store.Delete(ctx, key)
	s.end("delete", start, span, err)
	return err
}

// errCannotWait: the store does not notify (no storage.Waiter).
var errCannotWait = errors.New("the store does not notify waiters")

// Wait is storage.Waiter.Wait, observed; errCannotWait when the store
// does not notify.
func (s *instrumentedStore) Wait(ctx context.Context, key storage.Key, timeout time.Duration) error {
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
func (s *instrumentedStore) GetByHash(ctx context.Context, keyHash string, withBody bool) ([]*storage.Record, error) {
	if s.finder == nil {
		return nil, nil
	}
	start, span := s.begin(ctx, "get")
	recs, err := s.finder.GetByHash(ctx, keyHash, withBody)
	s.end("get", start, span, err)
	return recs, err
}

// DeleteByHash is storage.HashFinder.DeleteByHash, observed as a delete.
func (s *instrumentedStore) DeleteByHash(ctx context.Context, keyHash string) (int, error) {
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
func (s *instrumentedStore) ListInFlight(ctx context.Context, after string, limit int) ([]storage.HashedRecord, error) {
	if s.lister == nil {
		return nil, nil
	}
	start, span := s.begin(ctx, "get")
	page, err := s.lister.ListInFlight(ctx, after, limit)
	s.end("get", start, span, err)
	return page, err
}

// ListOutcomeUnknown is storage.OutcomeUnknownKeeper.ListOutcomeUnknown,
// observed as a get; nothing when the store cannot list them.
func (s *instrumentedStore) ListOutcomeUnknown(ctx context.Context, after string, limit int) ([]storage.HashedRecord, error) {
	if s.unknown == nil {
		return nil, nil
	}
	start, span := s.begin(ctx, "get")
	page, err := s.unknown.ListOutcomeUnknown(ctx, after, limit)
	s.end("get", start, span, err)
	return page, err
}

// ReleaseOutcomeUnknown is
// storage.OutcomeUnknownKeeper.ReleaseOutcomeUnknown, observed as a
// delete; nothing released when the store cannot.
func (s *instrumentedStore) ReleaseOutcomeUnknown(ctx context.Context, keyHash string) (int, error) {
	if s.unknown == nil {
		return 0, nil
	}
	start, span := s.begin(ctx, "delete")
	n, err := s.unknown.ReleaseOutcomeUnknown(ctx, keyHash)
	s.end("delete", start, span, err)
	return n, err
}

// tracerName names the spans this module starts.
const tracerName = "github.com/caddy-idempotency/caddy-idempotency"

// startStoreSpan starts a child span of ctx's span for the store
// operation op; nil when the request is not traced.
func startStoreSpan(ctx context.Context, op, backend string) trace.Span {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return nil
	}
	_, span := parent.TracerProvider().Tracer(tracerName).Start(ctx, "idempotency."+op,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("idempotency.backend", backend)))
	return span
}

// endStoreSpan ends a span of startStoreSpan with the operation's error.
// Outcomes callers branch on (a lost lease, no record) are not errors.
func endStoreSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil && !errors.Is(err, storage.ErrLeaseLost) && !errors.Is(err, storage.ErrNotFound) {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// The log lines of store errors under an outage: one line a second per
// store, with the number of requests it stands for, rather than one per
// request (a store down under a thousand requests a second would
// otherwise write a thousand lines a second).

// storeErrorLogEvery is how often at most a store's errors of one kind
// are logged.
const storeErrorLogEvery = time.Second

// storeErrorLog writes the log lines of the answers that say the store
// failed (outcome store_error: fail_closed's 503, fail_open's pass, a full
// store), per store and message: the first at once, with requests 1; the
// next ones held back and counted, and written as one line every
// storeErrorLogEvery, with requests (how many it stands for) and the
// fields of the last of them (its key_hash, request_id, backend and
// error). A line held back is written a second after the previous one
// even if no request follows, so that the last second of an outage is
// counted too. Each request's own outcome (access log, placeholders,
// metrics) is unchanged.
type storeErrorLog struct {
	lines backend.LineLimiter[storeErrorKey, heldLine]
}

// storeErrorKey is what lines are grouped by.
type storeErrorKey struct {
	store storage.Store
	msg   string
}

// heldLine is what a line stands for: the requests since the last line,
// and the fields of the last of them.
type heldLine struct {
	logger *zap.Logger // the last request's handler's
	level  zapcore.Level
	fields []zap.Field // the last request's
	n      int
}

// storeErrors is the process's storeErrorLog: stores are shared by the
// handlers of a configuration and across reloads.
var storeErrors = newStoreErrorLog(wallClock{}, storeErrorLogEvery)

func newStoreErrorLog(c clock, every time.Duration) *storeErrorLog {
	l := new(storeErrorLog)
	l.lines.Every = every
	l.lines.After = func(d time.Duration, f func()) { c.AfterFunc(d, f) }
	l.lines.Write = func(k storeErrorKey, h heldLine) { writeStoreErrorLine(h.logger, h.level, k.msg, h.fields, h.n) }
	return l
}

// log logs, or holds back and counts, the line msg at level with fields
// of one request whose handler uses store and logger.
func (l *storeErrorLog) log(store storage.Store, logger *zap.Logger, level zapcore.Level, msg string, fields []zap.Field) {
	l.lines.Add(storeErrorKey{store: store, msg: msg}, func(h *heldLine) {
		h.logger, h.level, h.fields = logger, level, fields
		h.n++
	})
}

func writeStoreErrorLine(logger *zap.Logger, level zapcore.Level, msg string, fields []zap.Field, n int) {
	if c := logger.Check(level, msg); c != nil {
		all := make([]zap.Field, 0, len(fields)+1)
		all = append(all, zap.Int("requests", n))
		c.Write(append(all, fields...)...)
	}
}

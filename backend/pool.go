package backend

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// stores holds one live store per distinct storage configuration. Every
// handler with that configuration shares it, and it outlives config
// reloads: Caddy provisions the new config (one more reference) before it
// cleans up the old one (one less), so the store is never closed in between
// and a memory store keeps its records.
var stores = caddy.NewUsagePool()

// pooledStore is a store in the pool. When the last handler lets go of it,
// it closes once the requests still holding it are done: on a reload that
// changes the storage configuration, requests the old config started must
// still complete or release their keys.
type pooledStore struct {
	storage.Store
	backend string
	id      string // the pool's name for it (Pooled.StoreID)

	release func() // p.unhold, made once: a hold costs no allocation

	mu         sync.Mutex
	holds      int  // holds not yet released
	destructed bool // no handler uses the store any more
	closed     bool
	lastPing   PingResult

	lastDurability DurabilityResult // see durability.go

	// stopWatch stops watch, the pings of a store that can be pinged
	// (nil for one that cannot, or is only validated); watched is closed
	// once watch has returned. The ping at start is never stopped: a
	// configuration unloaded at once (a reload right after start) still
	// reports what it found rather than the pool closed under it.
	stopWatch context.CancelFunc
	watched   chan struct{}
}

// PingResult is the outcome of a store's last ping (storage.Pinger).
type PingResult struct {
	// At is when the ping was sent; zero when the store was never pinged
	// (or cannot be).
	At time.Time
	// Took is how long the store took to answer, or to fail.
	Took time.Duration
	// Err is why it did not answer; nil when it did.
	Err error
}

// ping pings the store (if it can be), records the result and returns it.
func (p *pooledStore) ping(ctx context.Context) PingResult {
	pinger, ok := p.Store.(storage.Pinger)
	if !ok {
		return PingResult{}
	}
	start := time.Now()
	err := pinger.Ping(ctx)
	r := PingResult{At: start, Took: time.Since(start), Err: err}
	p.mu.Lock()
	if !r.At.Before(p.lastPing.At) {
		// The last one asked, not the last to answer: a ping sent before
		// an outage and answered after one sent during it is older news.
		p.lastPing = r
		if !p.closed {
			setHealth(p.backend, p.id, r)
		}
	}
	p.mu.Unlock()
	return r
}

// pingInterval is how often a store in use is pinged, traffic or not: its
// last ping (the admin API) and its health gauge follow it within that,
// so that an outage at a quiet hour pages someone before the first
// customer meets it.
const pingInterval = 5 * time.Second

// watch pings a store just opened (pingAtStart), then every pingInterval
// until ctx ends, and logs when it stops answering and when it answers
// again.
func (p *pooledStore) watch(ctx context.Context, logger *zap.Logger, id, where string) {
	defer close(p.watched)
	ok := p.pingAtStart(logger, id, where)
	t := time.NewTicker(pingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, pingInterval)
		r := p.ping(pctx)
		cancel()
		fields := []zap.Field{zap.String("backend", p.backend), zap.String("store", id), zap.String("address", where)}
		switch {
		case ctx.Err() != nil:
			return // closed under its ping: no news of the store
		case ok && r.Err != nil:
			logger.Warn("idempotency store stopped answering its pings; requests using it follow on_storage_error until it answers",
				append(fields, zap.Error(r.Err))...)
		case !ok && r.Err == nil:
			logger.Info("idempotency store answers its pings again", fields...)
		}
		ok = r.Err == nil
	}
}

// Destruct implements caddy.Destructor.
func (p *pooledStore) Destruct() error {
	p.mu.Lock()
	p.destructed = true
	idle := p.holds == 0
	p.closed = p.closed || idle
	p.mu.Unlock()
	if !idle {
		return nil // the last hold closes it
	}
	return p.close()
}

// close closes the store once its pings are stopped (the ping at start
// done, which its own timeout bounds), and forgets its health.
func (p *pooledStore) close() error {
	if p.stopWatch != nil {
		p.stopWatch()
		<-p.watched
	}
	forgetHealth(p.backend, p.id)
	return p.Close()
}

// hold implements Holder.HoldStore for the pool entry.
func (p *pooledStore) hold() (release func(), ok bool) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false
	}
	p.holds++
	p.mu.Unlock()
	return p.release, true
}

func (p *pooledStore) unhold() {
	p.mu.Lock()
	p.holds--
	last := p.holds == 0 && p.destructed
	p.closed = p.closed || last
	p.mu.Unlock()
	if !last {
		return
	}
	if err := p.close(); err != nil {
		caddy.Log().Named("http.handlers.idempotency").Error("closing idempotency store", zap.String("backend", p.backend), zap.Error(err))
	}
}

// Pooled is what a backend module embeds: its store, taken from the pool
// of live stores under a hash of its resolved configuration. It
// implements Backend, Holder and caddy.CleanerUpper; the module's
// Provision calls Acquire.
type Pooled struct {
	entry *pooledStore
	key   string
}

// Acquire takes the pooled store for config, opening it with open on
// first use; backend is the module's name. The pool key hashes
// the configuration (secrets resolved: two configurations that differ
// only in a password are two stores), so that credentials never sit in a
// pool key, a log line or an error message.
//
// A store opened here is announced in logger's log with where it is
// (address, free of credentials), and a store that implements
// storage.Pinger is pinged in the background, at once and then every
// pingInterval (watch): start-up never waits for it, but an unreachable or
// unusable store is named in a warning with its cause at once rather than
// at the first request, and its health gauge follows it without traffic.
// Once it answered, what protects its records across a failover
// (storage.DurabilityReporter) is logged, and a store that cannot keep
// them where it is connected is warned about.
//
// A configuration that Caddy validates (caddy validate) and will never
// run is checked differently: its store is asked at once, within
// startPingTimeout and without writing anything (storage.Checker), and a
// store that answered and refused fails the validation (see check).
func (b *Pooled) Acquire(logger *zap.Logger, backend Name, config any, where string, open func() (storage.Store, error)) error {
	key, err := StoreID(backend, config)
	if err != nil {
		return err
	}
	validate := validating()
	v, _, err := stores.LoadOrNew(key, func() (_ caddy.Destructor, err error) {
		// A constructor that panics would leave the pool's entry for key
		// locked (caddy.UsagePool unlocks it only when the constructor
		// returns): through the admin API, which recovers the panic, the
		// next load of the same store, GET /config/, POST /stop and
		// SIGTERM would all wait on it for ever. The configuration is
		// refused instead.
		defer func() {
			if r := recover(); r != nil {
				err = backend.Errorf("building the store panicked (a configuration its checks let through): %v", r)
			}
		}()
		s, err := open()
		if err != nil {
			return nil, err
		}
		p := &pooledStore{Store: s, backend: string(backend), id: key}
		logger.Info("idempotency store opened", zap.String("backend", p.backend), zap.String("store", key), zap.String("address", where))
		p.release = p.unhold
		if _, ok := s.(storage.Pinger); ok && !validate {
			var ctx context.Context
			ctx, p.stopWatch = context.WithCancel(context.Background())
			p.watched = make(chan struct{})
			go p.watch(ctx, logger, key, where)
		}
		return p, nil
	})
	if err != nil {
		return err
	}
	b.entry, b.key = v.(*pooledStore), key
	if validate {
		return b.entry.check(logger, key, where)
	}
	return nil
}

// validating reports whether Caddy is validating a config (caddy
// validate, caddy.Validate) rather than loading one to run. Caddy tells a
// module no other way, and the two differ for a store: a config that is
// only validated must write nothing (no table created), and may wait for
// its store's answer to fail when the store refuses it; one that runs
// starts without waiting, whatever the store says.
func validating() bool {
	pcs := make([]uintptr, 512)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		if f.Function == "github.com/caddyserver/caddy/v2.Validate" {
			return true
		}
		if !more {
			return false
		}
	}
}

// check asks the store of a configuration that is validated whether it
// could serve, without writing anything (storage.Checker, or else Ping),
// within startPingTimeout. A store that answered and refused (a wrong
// password, a database or table that does not exist, a parameter the
// server does not know, a read-only server) fails the validation with the
// warning caddy run would log; one that did not answer in time is only
// warned about, since a config may be validated where its store cannot be
// reached (CI), and caddy run starts while a store is down.
func (p *pooledStore) check(logger *zap.Logger, id, where string) error {
	ctx, cancel := context.WithTimeout(context.Background(), startPingTimeout)
	defer cancel()
	var err error
	switch s := p.Store.(type) {
	case storage.Checker:
		err = s.Check(ctx)
	case storage.Pinger:
		err = s.Ping(ctx)
	default:
		return nil
	}
	fields := []zap.Field{zap.String("backend", p.backend), zap.String("store", id), zap.String("address", where), zap.Error(err)}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, storage.ErrUnavailable) && !errors.Is(err, storage.ErrReadOnly):
		logger.Warn(fmt.Sprintf("idempotency store unreachable while validating (waited at most %s); the configuration is valid otherwise, "+
			"and caddy run starts while its store is down (requests follow on_storage_error until it answers)", startPingTimeout), fields...)
		return nil
	}
	return fmt.Errorf("%s storage at %s: idempotency store not usable: it answered with an error: %w", p.backend, where, err)
}

// StoreID is the pool's name for the store of backend with config, as
// Acquire names it (Pooled.StoreID): for an open function that needs the
// name before Acquire returns (a metric's label).
func StoreID(backend Name, config any) (string, error) {
	raw, err := json.Marshal(config)
	if err != nil {
		return "", backend.Errorf("hashing the configuration: %w", err)
	}
	sum := sha256.Sum256(raw)
	return string(backend) + ":" + hex.EncodeToString(sum[:12]), nil
}

// startPingTimeout bounds the ping of a store just opened.
const startPingTimeout = 5 * time.Second

// pingAtStart pings a store just opened and warns, once, when it does not
// answer or answers with an error (a wrong password, a missing table),
// saying which and what requests meet meanwhile. It reports whether the
// store answered.
func (p *pooledStore) pingAtStart(logger *zap.Logger, id, where string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), startPingTimeout)
	defer cancel()
	r := p.ping(ctx)
	if r.Err == nil {
		p.logDurability(ctx, logger, id, where)
		return true
	}
	fields := []zap.Field{zap.String("backend", p.backend), zap.String("store", id), zap.String("address", where), zap.Error(r.Err)}
	switch {
	case errors.Is(r.Err, storage.ErrUnavailable) && (ctx.Err() != nil || errors.Is(r.Err, context.DeadlineExceeded)):
		// No answer within the store's timeout or startPingTimeout: a
		// host that drops packets, or a server too slow.
		logger.Warn("idempotency store not reached in time; requests using it follow on_storage_error until it answers",
			append(fields, zap.Duration("waited", r.Took))...)
	case errors.Is(r.Err, storage.ErrUnavailable):
		logger.Warn("idempotency store unreachable; requests using it follow on_storage_error until it answers", fields...)
	default:
		logger.Warn("idempotency store not usable: it answered with an error; requests using it fail (503) until it is fixed", fields...)
	}
	return false
}

// Store implements Backend.
func (b *Pooled) Store() storage.Store {
	if b.entry == nil {
		return nil
	}
	return b.entry.Store
}

// StoreID returns the pool's name for the store ("redis:" and a hash of
// the configuration), as the admin API and the logs show it; empty before
// Acquire.
func (b *Pooled) StoreID() string { return b.key }

// HoldStore implements Holder.
func (b *Pooled) HoldStore() (release func(), ok bool) {
	return b.entry.hold()
}

// Cleanup drops this module's reference to the pooled store; the last one
// closes it (once the requests holding it are done). It tolerates a
// module whose Provision failed before acquiring anything.
func (b *Pooled) Cleanup() error {
	if b.key == "" {
		return nil
	}
	key := b.key
	b.key = ""
	_, err := stores.Delete(key)
	return err
}

// LiveStore is a store in the pool, as the admin API lists it.
type LiveStore struct {
	// ID is the pool's name for the store (see Pooled.StoreID).
	ID string
	// Backend is the name of the module that opened it ("redis").
	Backend string
	// Store is the store itself.
	Store storage.Store
	// Handlers is how many handlers (of every loaded configuration) use it.
	Handlers int

	entry *pooledStore
}

// LastPing is the store's last ping: at start, or the last Ping.
func (s LiveStore) LastPing() PingResult {
	s.entry.mu.Lock()
	defer s.entry.mu.Unlock()
	return s.entry.lastPing
}

// Ping pings the store now (a zero result for a store that cannot be
// pinged), and records the result as its last ping.
func (s LiveStore) Ping(ctx context.Context) PingResult { return s.entry.ping(ctx) }

// Live yields the stores in the pool by ID, every backend's alike; with
// a non-empty id, only the store of that ID.
func Live(id string) iter.Seq[LiveStore] {
	var out []LiveStore
	stores.Range(func(k, v any) bool {
		if id == "" || k.(string) == id {
			p := v.(*pooledStore)
			refs, _ := stores.References(k)
			out = append(out, LiveStore{ID: k.(string), Backend: p.backend, Store: p.Store, Handlers: refs, entry: p})
		}
		return true
	})
	slices.SortFunc(out, func(a, b LiveStore) int { return strings.Compare(a.ID, b.ID) })
	return slices.Values(out)
}

// Interface guards
var (
	_ Backend            = (*Pooled)(nil)
	_ Holder             = (*Pooled)(nil)
	_ caddy.Destructor   = (*pooledStore)(nil)
	_ storage.Store      = (*pooledStore)(nil)
	_ caddy.CleanerUpper = (*Pooled)(nil)
)

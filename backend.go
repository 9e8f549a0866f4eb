package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/cache"
)

// storageNamespace is where storage backends register.
const storageNamespace = "http.idempotency.storage"

// StorageBackend is implemented by the guest modules in namespace
// http.idempotency.storage: "memory" (the default), "redis", "postgres",
// or a third party's. Provision opens or takes the store; Store returns it
// from then until Cleanup.
//
// A new backend is one file: a module that builds a storage.Store (a
// package that passes storagetest.Run) in Provision, embedding
// pooledBackend when it lives in this package, so that handlers with the
// same configuration share one store across config reloads.
type StorageBackend interface {
	Store() storage.Store
}

// StoreHolder is implemented by backends whose store can close while a
// request still runs on it: a store shared by configurations (see
// pooledBackend) closes when the last configuration using it is unloaded,
// which on a reload is before the old configuration's requests are done.
type StoreHolder interface {
	// HoldStore keeps the store open until release is called, exactly
	// once. It fails only when the store is closed already (the request
	// reached a handler of a configuration unloaded meanwhile).
	HoldStore() (release func(), ok bool)
}

// loadBackend loads the handler's storage module, memory by default.
func loadBackend(ctx caddy.Context, h *Handler) (backend StorageBackend, name string, err error) {
	var mod any
	if h.StorageRaw != nil {
		mod, err = ctx.LoadModule(h, "StorageRaw")
	} else {
		mod, err = ctx.LoadModuleByID(storageNamespace+".memory", nil)
	}
	if err != nil {
		return nil, "", fmt.Errorf("loading idempotency storage: %w", err)
	}
	backend, ok := mod.(StorageBackend)
	if !ok {
		return nil, "", fmt.Errorf("module %T is not an idempotency storage backend", mod)
	}
	return backend, mod.(caddy.Module).CaddyModule().ID.Name(), nil
}

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

	release func() // p.unhold, made once: a hold costs no allocation

	mu         sync.Mutex
	holds      int  // holds not yet released
	destructed bool // no handler uses the store any more
	closed     bool
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
	return p.Close()
}

// hold implements StoreHolder.HoldStore for the pool entry.
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
	if err := p.Close(); err != nil {
		caddy.Log().Named("http.handlers.idempotency").Error("closing idempotency store", zap.String("backend", p.backend), zap.Error(err))
	}
}

// pooledBackend is what the built-in backends embed: their store, taken
// from the pool under a hash of their resolved configuration. It
// implements StorageBackend, StoreHolder and caddy.CleanerUpper.
type pooledBackend struct {
	entry *pooledStore
	key   string
}

// acquire takes the pooled store for config, opening it with open on first
// use. The pool key hashes the configuration (secrets resolved), so that
// credentials never sit in a pool key, a log line or an error message.
//
// A store opened here is announced in logger's log with where it is
// (address, free of credentials), and a store that reaches a server is
// pinged once in the background: start-up never waits for it, but an
// unreachable store is named in a warning at once rather than at the
// first request.
func (b *pooledBackend) acquire(logger *zap.Logger, backend string, config any, where string, open func() (storage.Store, error)) error {
	raw, err := json.Marshal(config)
	if err != nil {
		return fmt.Errorf("%s storage: hashing the configuration: %w", backend, err)
	}
	sum := sha256.Sum256(raw)
	key := backend + ":" + hex.EncodeToString(sum[:12])
	v, _, err := stores.LoadOrNew(key, func() (caddy.Destructor, error) {
		s, err := open()
		if err != nil {
			return nil, err
		}
		logger.Info("idempotency store opened", zap.String("backend", backend), zap.String("store", key), zap.String("address", where))
		if p, ok := s.(storage.Pinger); ok {
			go pingAtStart(logger, p, backend, key, where)
		}
		p := &pooledStore{Store: s, backend: backend}
		p.release = p.unhold
		return p, nil
	})
	if err != nil {
		return err
	}
	b.entry, b.key = v.(*pooledStore), key
	return nil
}

// startPingTimeout bounds the ping of a store just opened.
const startPingTimeout = 5 * time.Second

// pingAtStart pings a store just opened and warns when it does not answer.
func pingAtStart(logger *zap.Logger, p storage.Pinger, backend, id, where string) {
	ctx, cancel := context.WithTimeout(context.Background(), startPingTimeout)
	defer cancel()
	if err := p.Ping(ctx); err != nil {
		logger.Warn("idempotency store unreachable; requests using it follow on_storage_error until it answers",
			zap.String("backend", backend), zap.String("store", id), zap.String("address", where), zap.Error(err))
	}
}

// Store implements StorageBackend.
func (b *pooledBackend) Store() storage.Store {
	if b.entry == nil {
		return nil
	}
	return b.entry.Store
}

// HoldStore implements StoreHolder.
func (b *pooledBackend) HoldStore() (release func(), ok bool) {
	return b.entry.hold()
}

// Cleanup drops this module's reference to the pooled store; the last one
// closes it (once the requests holding it are done). It tolerates a
// module whose Provision failed before acquiring anything.
func (b *pooledBackend) Cleanup() error {
	if b.key == "" {
		return nil
	}
	key := b.key
	b.key = ""
	_, err := stores.Delete(key)
	return err
}

// defaultReplayCacheTTL bounds how long a cached record is served before
// the shared store is asked again.
const defaultReplayCacheTTL = 10 * time.Second

// The bounds of the replay cache's ttl. Below a second the cache saves
// next to nothing (retries come seconds apart), and such a value is most
// likely a unit mix-up (a JSON duration given as a bare number is
// nanoseconds); beyond a day an instance may go on replaying a record
// deleted elsewhere for longer than records are usually kept at all.
const (
	minReplayCacheTTL = time.Second
	maxReplayCacheTTL = 24 * time.Hour
)

// ReplayCache keeps completed records in this Caddy process in front of a
// shared store (Redis, PostgreSQL), so that repeated replays of a key cost
// no store round trip. Completed records never change, so a cached replay
// is the stored one; but a record deleted on another instance (through the
// admin API) is still replayed here until the entry's ttl ends. Off unless
// configured.
type ReplayCache struct {
	// The most records kept, oldest dropped first. Required.
	MaxEntries int `json:"max_entries,omitempty"`

	// How long a cached record is served before the store is asked again
	// (never beyond the record's own expiry). Default: 10s; 1s to 24h.
	TTL caddy.Duration `json:"ttl,omitempty"`
}

// options returns the cache's settings, nil when there is no cache.
func (rc *ReplayCache) options() *cache.Options {
	if rc == nil {
		return nil
	}
	ttl := time.Duration(rc.TTL)
	if ttl == 0 {
		ttl = defaultReplayCacheTTL
	}
	return &cache.Options{MaxEntries: rc.MaxEntries, TTL: ttl}
}

// check reports configuration errors; prefix names the backend.
func (rc *ReplayCache) check(prefix string) error {
	switch {
	case rc == nil:
		return nil
	case rc.MaxEntries <= 0:
		return fmt.Errorf("%s: replay_cache: max_entries must be positive, got %d", prefix, rc.MaxEntries)
	case rc.TTL != 0 && rc.TTL < caddy.Duration(minReplayCacheTTL):
		return fmt.Errorf("%s: replay_cache: ttl must be at least %s, got %s", prefix, minReplayCacheTTL, time.Duration(rc.TTL))
	case rc.TTL > caddy.Duration(maxReplayCacheTTL):
		return fmt.Errorf("%s: replay_cache: ttl must be at most %s, got %s", prefix, maxReplayCacheTTL, time.Duration(rc.TTL))
	}
	return nil
}

// withReplayCache puts the cache described by opts in front of s.
func withReplayCache(s storage.Store, opts *cache.Options) storage.Store {
	if opts == nil {
		return s
	}
	return cache.New(s, *opts)
}

// parseReplayCache parses `replay_cache <max_entries> [<ttl>]`; the
// values are checked by ReplayCache.check.
func parseReplayCache(d *caddyfile.Dispenser) (*ReplayCache, error) {
	args := d.RemainingArgs()
	if len(args) < 1 || len(args) > 2 {
		return nil, d.ArgErr()
	}
	rc := new(ReplayCache)
	n, err := strconv.Atoi(args[0])
	if err != nil {
		return nil, d.Errf("replay_cache: max_entries must be an integer, got '%s'", args[0])
	}
	rc.MaxEntries = n
	if len(args) == 2 {
		ttl, err := caddy.ParseDuration(args[1])
		if err != nil {
			return nil, d.Errf("replay_cache: invalid ttl '%s': %v", args[1], err)
		}
		rc.TTL = caddy.Duration(ttl)
	}
	return rc, nil
}

// builtinBackend is what every built-in backend is: a provisioned guest
// module with a Caddyfile block and a pooled store.
type builtinBackend interface {
	caddy.Module
	caddy.Provisioner
	caddy.CleanerUpper
	caddyfile.Unmarshaler
	StorageBackend
	StoreHolder
}

// Interface guards
var (
	_ builtinBackend   = (*MemoryStorage)(nil)
	_ builtinBackend   = (*RedisStorage)(nil)
	_ builtinBackend   = (*PostgresStorage)(nil)
	_ caddy.Destructor = (*pooledStore)(nil)
	_ storage.Store    = (*pooledStore)(nil)
)

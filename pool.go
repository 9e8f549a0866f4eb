package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync"

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
// it closes once the requests still running on it are done: on a reload
// that changes the storage configuration, requests the old config started
// must still complete or release their keys.
type pooledStore struct {
	storage.Store
	backend string

	mu         sync.Mutex
	running    int  // holds not yet released
	destructed bool // no handler uses the store any more
	closed     bool
}

// live maps each pooled store to its pool entry, so that a handler can
// hold the store it was given while a request runs.
var live sync.Map // storage.Store -> *pooledStore

// Destruct implements caddy.Destructor.
func (p *pooledStore) Destruct() error {
	p.mu.Lock()
	p.destructed = true
	idle := p.running == 0
	p.closed = p.closed || idle
	p.mu.Unlock()
	if !idle {
		return nil // the last hold closes it
	}
	return p.close()
}

func (p *pooledStore) close() error {
	live.Delete(p.Store)
	return p.Close()
}

// hold keeps the store open until release is called. It fails only when
// the store is closed already: the handler's config was unloaded before
// this request reached it.
func (p *pooledStore) hold() (release func(), ok bool) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false
	}
	p.running++
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		p.running--
		last := p.running == 0 && p.destructed
		p.closed = p.closed || last
		p.mu.Unlock()
		if last {
			if err := p.close(); err != nil {
				caddy.Log().Named("http.handlers.idempotency").Error("closing idempotency store", zap.String("backend", p.backend), zap.Error(err))
			}
		}
	}, true
}

// pooledFor returns the pool entry of store, or nil for a store that is
// not pooled (a third-party backend managing its own).
func pooledFor(store storage.Store) *pooledStore {
	if p, ok := live.Load(store); ok {
		return p.(*pooledStore)
	}
	return nil
}

// storeKey names a storage configuration in the pool. It hashes the
// configuration (secrets resolved) so that credentials never sit in a pool
// key, a log line or an error message.
func storeKey(backend string, config any) (string, error) {
	b, err := json.Marshal(config)
	if err != nil {
		return "", fmt.Errorf("hashing %s storage configuration: %w", backend, err)
	}
	sum := sha256.Sum256(b)
	return backend + ":" + hex.EncodeToString(sum[:12]), nil
}

// acquireStore returns the pooled store for key, opening it on first use.
// Each successful call must be paired with one releaseStore.
func acquireStore(backend, key string, open func() (storage.Store, error)) (storage.Store, error) {
	v, _, err := stores.LoadOrNew(key, func() (caddy.Destructor, error) {
		s, err := open()
		if err != nil {
			return nil, err
		}
		p := &pooledStore{Store: s, backend: backend}
		live.Store(s, p)
		return p, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*pooledStore).Store, nil
}

// releaseStore drops one reference to the pooled store for key.
func releaseStore(key string) error {
	_, err := stores.Delete(key)
	return err
}

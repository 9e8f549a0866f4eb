package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// stores holds one live store per distinct storage configuration. Every
// handler with that configuration shares it, and it outlives config
// reloads: Caddy provisions the new config (one more reference) before it
// cleans up the old one (one less), so the store is never closed in between
// and a memory store keeps its records.
var stores = caddy.NewUsagePool()

// pooledStore is a store in the pool; the last release closes it.
type pooledStore struct {
	storage.Store
	backend string
}

// Destruct implements caddy.Destructor.
func (p *pooledStore) Destruct() error { return p.Close() }

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
		return &pooledStore{Store: s, backend: backend}, nil
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

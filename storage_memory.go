package idempotency

import (
	"fmt"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

func init() {
	caddy.RegisterModule(MemoryStorage{})
}

// defaultMaxKeys bounds the memory store when max_keys is not set.
const defaultMaxKeys = 1_000_000

// MemoryStorage keeps idempotency records in this Caddy process. It is the
// default: nothing to set up, but records are not shared with other
// instances and are lost when the process exits (they survive config
// reloads). Handlers with the same max_keys share one store.
type MemoryStorage struct {
	// The most records kept at once. When the store is full, expired
	// records are dropped first; if it is still full, requests with a new
	// key get 503 (live records are never evicted). Default: 1000000.
	MaxKeys int `json:"max_keys,omitempty"`

	store   storage.Store
	poolKey string
}

// CaddyModule returns the Caddy module information.
func (MemoryStorage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.idempotency.storage.memory",
		New: func() caddy.Module { return new(MemoryStorage) },
	}
}

// Provision takes the shared memory store for this configuration.
func (m *MemoryStorage) Provision(caddy.Context) error {
	if m.MaxKeys == 0 {
		m.MaxKeys = defaultMaxKeys
	}
	if m.MaxKeys < 0 {
		return fmt.Errorf("max_keys must be positive, got %d", m.MaxKeys)
	}
	key := "memory:" + strconv.Itoa(m.MaxKeys)
	store, err := acquireStore("memory", key, func() (storage.Store, error) {
		return memory.New(memory.Options{MaxKeys: m.MaxKeys}), nil
	})
	if err != nil {
		return err
	}
	m.store, m.poolKey = store, key
	return nil
}

// Store implements StorageBackend.
func (m *MemoryStorage) Store() storage.Store { return m.store }

// Cleanup drops this handler's reference to the shared store.
func (m *MemoryStorage) Cleanup() error {
	if m.poolKey == "" {
		return nil
	}
	key := m.poolKey
	m.poolKey, m.store = "", nil
	return releaseStore(key)
}

// UnmarshalCaddyfile parses
//
//	storage memory {
//	    max_keys <n>
//	}
func (m *MemoryStorage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume the backend name
	if d.NextArg() {
		return d.ArgErr()
	}
	return eachOption(d, "", nil, func(opt string) error {
		if opt != "max_keys" {
			return d.Errf("unrecognized memory storage option '%s'", opt)
		}
		n, err := intArg(d)
		m.MaxKeys = n
		return err
	})
}

// Interface guards
var (
	_ caddy.Provisioner     = (*MemoryStorage)(nil)
	_ caddy.CleanerUpper    = (*MemoryStorage)(nil)
	_ caddyfile.Unmarshaler = (*MemoryStorage)(nil)
	_ StorageBackend        = (*MemoryStorage)(nil)
)

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

	// The most records one client (one scope) holds at once, so that no
	// client can fill the store for the others. A client at the limit
	// gets 429 for new keys until some of its records expire (they stop
	// counting when the store's janitor frees them, once a minute); other
	// clients are unaffected. Raise it for clients that legitimately send
	// more keyed requests per ttl, such as a server-to-server integration
	// under one credential. Default: 10000.
	MaxKeysPerScope int `json:"max_keys_per_scope,omitempty"`

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
	if m.MaxKeysPerScope == 0 {
		m.MaxKeysPerScope = memory.DefaultMaxKeysPerScope
	}
	if m.MaxKeys < 0 {
		return fmt.Errorf("max_keys must be positive, got %d", m.MaxKeys)
	}
	if m.MaxKeysPerScope < 0 {
		return fmt.Errorf("max_keys_per_scope must be positive, got %d", m.MaxKeysPerScope)
	}
	key := "memory:" + strconv.Itoa(m.MaxKeys)
	if m.MaxKeysPerScope != memory.DefaultMaxKeysPerScope {
		key += ":" + strconv.Itoa(m.MaxKeysPerScope)
	}
	store, err := acquireStore("memory", key, func() (storage.Store, error) {
		return memory.New(memory.Options{MaxKeys: m.MaxKeys, MaxKeysPerScope: m.MaxKeysPerScope}), nil
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
//	    max_keys_per_scope <n>
//	}
func (m *MemoryStorage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume the backend name
	if d.NextArg() {
		return d.ArgErr()
	}
	return eachOption(d, "", nil, func(opt string) error {
		var err error
		switch opt {
		case "max_keys":
			m.MaxKeys, err = intArg(d)
		case "max_keys_per_scope":
			m.MaxKeysPerScope, err = intArg(d)
		default:
			return d.Errf("unrecognized memory storage option '%s'", opt)
		}
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

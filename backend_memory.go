package idempotency

import (
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

func init() {
	caddy.RegisterModule(MemoryStorage{})
}

// MemoryStorage keeps idempotency records in this Caddy process. It is the
// default: nothing to set up, but records are not shared with other
// instances and are lost when the process exits (they survive config
// reloads). Handlers with the same settings share one store.
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

	pooledBackend
}

// CaddyModule returns the Caddy module information.
func (MemoryStorage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.idempotency.storage.memory",
		New: func() caddy.Module { return new(MemoryStorage) },
	}
}

// Provision takes the shared memory store for these settings.
func (m *MemoryStorage) Provision(ctx caddy.Context) error {
	if err := m.check(); err != nil {
		return err
	}
	opts := memory.Options{MaxKeys: m.MaxKeys, MaxKeysPerScope: m.MaxKeysPerScope}
	if opts.MaxKeys == 0 {
		opts.MaxKeys = memory.DefaultMaxKeys
	}
	if opts.MaxKeysPerScope == 0 {
		opts.MaxKeysPerScope = memory.DefaultMaxKeysPerScope
	}
	where := fmt.Sprintf("this process (max_keys %d, max_keys_per_scope %d)", opts.MaxKeys, opts.MaxKeysPerScope)
	return m.acquire(ctx.Logger(), "memory", opts, where, func() (storage.Store, error) { return memory.New(opts), nil })
}

// check reports configuration errors; zero values are the defaults.
func (m *MemoryStorage) check() error {
	switch {
	case m.MaxKeys < 0:
		return fmt.Errorf("memory storage: max_keys must be positive, got %d", m.MaxKeys)
	case m.MaxKeysPerScope < 0:
		return fmt.Errorf("memory storage: max_keys_per_scope must be positive, got %d", m.MaxKeysPerScope)
	}
	return nil
}

// UnmarshalCaddyfile parses
//
//	storage memory {
//	    max_keys <n>
//	    max_keys_per_scope <n>
//	}
func (m *MemoryStorage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume the backend name
	if err := noArgs(d); err != nil {
		return err
	}
	return eachOption(d, "memory storage ", nil, func(opt string) error {
		switch opt {
		case "max_keys":
			return intArg(d, &m.MaxKeys)
		case "max_keys_per_scope":
			return intArg(d, &m.MaxKeysPerScope)
		}
		return d.Errf("unrecognized memory storage option '%s'", opt)
	}, m.check)
}

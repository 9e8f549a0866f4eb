package memory

import (
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/backend/cfargs"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	memstore "github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

func init() {
	caddy.RegisterModule(Storage{})
}

// name is the backend's name: storage memory.
const name backend.Name = "memory"

// Storage keeps idempotency records in this Caddy process. It is the
// default: nothing to set up, but records are not shared with other
// instances and are lost when the process exits (they survive config
// reloads). Handlers with the same settings share one store.
type Storage struct {
	// The most records kept at once. When the store is full, expired
	// records are dropped first; if it is still full, requests with a new
	// key get 503 (live records are never evicted). Default: 1000000.
	MaxKeys int `json:"max_keys,omitempty"`

	// The most bytes the records take at once: each record's entry,
	// fingerprint, recorded response and request detail. Full by bytes is
	// full like max_keys (503 for new keys). A response recorded when
	// there is no room left for its body keeps its status and headers,
	// as one larger than max_response_size does. Default: 1GiB.
	MaxBytes int64 `json:"max_bytes,omitempty"`

	// One client's (one scope's) share of the store: this many records,
	// and the same fraction of max_bytes. It binds only while the store
	// holds half of max_keys or half of max_bytes: until then one client
	// may take what it needs. Past it, that client gets 429 for new keys
	// (until some of its records expire and the store's janitor frees
	// them, once a minute), and its responses are recorded without their
	// bodies; other clients are served up to their own share. So one
	// client never takes much more than half the store. Default: a tenth
	// of max_keys.
	MaxKeysPerScope int `json:"max_keys_per_scope,omitempty"`

	backend.Pooled
}

// CaddyModule returns the Caddy module information.
func (Storage) CaddyModule() caddy.ModuleInfo {
	return name.ModuleInfo(func() caddy.Module { return new(Storage) })
}

// Provision takes the shared memory store for these settings.
func (m *Storage) Provision(ctx caddy.Context) error {
	opts, err := m.compile()
	if err != nil {
		return err
	}
	where := fmt.Sprintf("this process (max_keys %d, max_bytes %s, max_keys_per_scope %d)",
		opts.MaxKeys, humanize.IBytes(uint64(opts.MaxBytes)), opts.MaxKeysPerScope)
	// Both series exist, at zero, once a store is configured.
	backend.CountRemoved(name, backend.RemovedExpired, 0)
	backend.CountRemoved(name, backend.RemovedEvicted, 0)
	return m.Acquire(ctx.Logger(), name, opts, where, func() (storage.Store, error) {
		opts.OnRemove = countRemoved
		return memstore.New(opts), nil
	})
}

// countRemoved counts what a memory store removes on its own in
// caddy_http_idempotency_records_removed_total: expired records its
// janitor and sweeps delete, refusal records evicted to make room.
func countRemoved(expired bool, n int64) {
	reason := backend.RemovedEvicted
	if expired {
		reason = backend.RemovedExpired
	}
	backend.CountRemoved(name, reason, n)
}

// Validate reports configuration errors: none once provisioned (Provision
// compiles the configuration first), else the compile error.
func (m *Storage) Validate() error { return backend.Validate(m, m.compile) }

// compile checks the configuration and returns the store's options,
// defaults filled in. It is pure; an error names its option (opterr).
func (m *Storage) compile() (memstore.Options, error) {
	switch {
	case m.MaxKeys < 0:
		return memstore.Options{}, name.OptionErrorf("max_keys", "max_keys must be positive, got %d", m.MaxKeys)
	case m.MaxKeysPerScope < 0:
		return memstore.Options{}, name.OptionErrorf("max_keys_per_scope", "max_keys_per_scope must be positive, got %d", m.MaxKeysPerScope)
	case m.MaxBytes != 0 && m.MaxBytes < minMemoryBytes:
		return memstore.Options{}, name.OptionErrorf("max_bytes", "max_bytes must be at least %s, got %d", humanize.IBytes(minMemoryBytes), m.MaxBytes)
	}
	return memstore.Options{MaxKeys: m.MaxKeys, MaxBytes: m.MaxBytes, MaxKeysPerScope: m.MaxKeysPerScope}.WithDefaults(), nil
}

// minMemoryBytes is the least max_bytes: below a megabyte a handful of
// responses fill the store, and such a value is most likely a unit
// mix-up (max_bytes is in bytes).
const minMemoryBytes = 1 << 20

// UnmarshalCaddyfile parses
//
//	storage memory {
//	    max_keys <n>
//	    max_bytes <size>
//	    max_keys_per_scope <n>
//	}
func (m *Storage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume the backend name
	if err := cfargs.NoArgs(d); err != nil {
		return err
	}
	return backend.UnmarshalBlock(d, name, nil, func(opt string) error {
		switch opt {
		case "max_keys":
			return cfargs.IntArg(d, &m.MaxKeys)
		case "max_keys_per_scope":
			return cfargs.IntArg(d, &m.MaxKeysPerScope)
		case "max_bytes":
			return cfargs.SizeArg(d, &m.MaxBytes)
		}
		return name.Unknown(d, opt, options)
	}, m.compile)
}

// options are the options of the storage memory block.
var options = []string{"max_keys", "max_keys_per_scope", "max_bytes"}

// Interface guards
var (
	_ caddy.Provisioner     = (*Storage)(nil)
	_ caddy.Validator       = (*Storage)(nil)
	_ caddyfile.Unmarshaler = (*Storage)(nil)
	_ backend.Backend       = (*Storage)(nil)
)

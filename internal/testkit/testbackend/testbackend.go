// Package testbackend is a storage backend written the way a third party
// writes one, outside the handler's package and with its public API only:
// package backend (the kit: Name, Pooled, UnmarshalBlock, Validate),
// backend/cfargs for its Caddyfile options, and a store that passes
// storagetest.Run (the memory store stands in for the new store here).
// The handler's tests load it to prove that path: configured by JSON and
// the Caddyfile, pooled across reloads, held by requests, visible to the
// admin API. Its own tests run backendtest.Run, the handler scenarios
// every backend must pass, with public packages only, as a third party's
// tests do.
package testbackend

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/backend/cfargs"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

func init() { caddy.RegisterModule(Storage{}) }

// name is the backend's name, written once: storage testfake.
const name backend.Name = "testfake"

// Storage is the module http.idempotency.storage.testfake.
type Storage struct {
	// Capacity is an option of the new backend's own: the most records
	// kept at once. Default: the store's.
	Capacity int `json:"capacity,omitempty"`

	backend.Pooled
}

// CaddyModule returns the Caddy module information.
func (Storage) CaddyModule() caddy.ModuleInfo {
	return name.ModuleInfo(func() caddy.Module { return new(Storage) })
}

// Provision takes the pooled store for this configuration.
func (s *Storage) Provision(ctx caddy.Context) error {
	opts, err := s.compile()
	if err != nil {
		return err
	}
	return s.Acquire(ctx.Logger(), name, opts, "this process", func() (storage.Store, error) {
		return memory.New(opts), nil
	})
}

// compile checks the configuration and returns the store's options.
func (s *Storage) compile() (memory.Options, error) {
	if s.Capacity < 0 {
		return memory.Options{}, name.OptionErrorf("capacity", "capacity must be positive, got %d", s.Capacity)
	}
	return memory.Options{MaxKeys: s.Capacity}, nil
}

// Validate reports the configuration's errors.
func (s *Storage) Validate() error { return backend.Validate(s, s.compile) }

// UnmarshalCaddyfile parses `storage testfake { capacity <n> }`.
func (s *Storage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the backend's name
	if err := cfargs.NoArgs(d); err != nil {
		return err
	}
	return backend.UnmarshalBlock(d, name, nil, func(opt string) error {
		if opt == "capacity" {
			return cfargs.IntArg(d, &s.Capacity)
		}
		return name.Unknown(d, opt, []string{"capacity"})
	}, s.compile)
}

// Interface guards
var (
	_ backend.Backend       = (*Storage)(nil)
	_ backend.Holder        = (*Storage)(nil)
	_ caddy.Provisioner     = (*Storage)(nil)
	_ caddy.Validator       = (*Storage)(nil)
	_ caddy.CleanerUpper    = (*Storage)(nil)
	_ caddyfile.Unmarshaler = (*Storage)(nil)
)

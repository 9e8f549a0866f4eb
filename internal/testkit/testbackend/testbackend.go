// Package testbackend is a storage backend written the way a third party
// writes one, outside the handler's package and with its public API only
// (package backend and a store that passes storagetest.Run; the memory
// store stands in for the new store here). The handler's tests load it to
// prove that path: pooled across reloads, held by requests, visible to
// the admin API.
package testbackend

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

func init() { caddy.RegisterModule(Storage{}) }

// Storage is the module http.idempotency.storage.testfake.
type Storage struct {
	// Capacity is an option of the new backend's own.
	Capacity int `json:"capacity,omitempty"`

	backend.Pooled
}

// CaddyModule returns the Caddy module information.
func (Storage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  backend.Namespace + ".testfake",
		New: func() caddy.Module { return new(Storage) },
	}
}

// Provision takes the pooled store for this configuration.
func (s *Storage) Provision(ctx caddy.Context) error {
	return s.Acquire(ctx.Logger(), "testfake", s, "this process", func() (storage.Store, error) {
		return memory.New(memory.Options{MaxKeys: s.Capacity}), nil
	})
}

// UnmarshalCaddyfile parses `storage testfake { capacity <n> }`.
func (s *Storage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the backend's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		if d.Val() != "capacity" {
			return d.Errf("unrecognized testfake storage option '%s'", d.Val())
		}
		if !d.NextArg() {
			return d.ArgErr()
		}
		n, err := strconv.Atoi(d.Val())
		if err != nil || n <= 0 {
			return d.Errf("capacity must be a positive integer, got '%s'", d.Val())
		}
		s.Capacity = n
	}
	return nil
}

// Interface guards
var (
	_ backend.Backend       = (*Storage)(nil)
	_ backend.Holder        = (*Storage)(nil)
	_ caddy.Provisioner     = (*Storage)(nil)
	_ caddy.CleanerUpper    = (*Storage)(nil)
	_ caddyfile.Unmarshaler = (*Storage)(nil)
)

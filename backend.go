package idempotency

import (
	"fmt"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/backend"

	// The built-in storage backends, so that `xcaddy --with` this module
	// brings them. Each is a guest module in its own package, built on the
	// same kit (package backend) as a third party's.
	_ "github.com/caddy-idempotency/caddy-idempotency/backend/memory"
	_ "github.com/caddy-idempotency/caddy-idempotency/backend/postgres"
	_ "github.com/caddy-idempotency/caddy-idempotency/backend/redis"
)

// loadBackend loads the handler's storage module, memory by default.
func loadBackend(ctx caddy.Context, h *Handler) (b backend.Backend, name string, err error) {
	var mod any
	if h.StorageRaw != nil {
		mod, err = ctx.LoadModule(h, "StorageRaw")
	} else {
		mod, err = ctx.LoadModuleByID(backend.Namespace+".memory", nil)
	}
	if err != nil {
		return nil, "", fmt.Errorf("loading idempotency storage: %w", err)
	}
	b, ok := mod.(backend.Backend)
	if !ok {
		return nil, "", fmt.Errorf("module %T is not an idempotency storage backend", mod)
	}
	return b, mod.(caddy.Module).CaddyModule().ID.Name(), nil
}

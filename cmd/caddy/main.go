// Command caddy is Caddy with the standard modules and this one, for
// `go run ./cmd/caddy run --config Caddyfile.example`. Production builds use
// xcaddy (see xcaddy.md).
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-idempotency/caddy-idempotency"
)

func main() {
	caddycmd.Main()
}

package inprocess_test

import (
	"fmt"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestStrictLoadsCorrectPlacements: handlers that answer only some
// requests and pass the others on (forward_auth's reverse_proxy with
// handle_response, file_server with pass_thru, a fallback handle block of
// a group) do not hide the idempotency handler after them, so strict
// must not refuse these configs.
func TestStrictLoadsCorrectPlacements(t *testing.T) {
	for _, tt := range []struct{ name, routes string }{
		{"forward_auth before idempotency", `
	forward_auth 127.0.0.1:9 {
		uri /auth
	}
	idempotency
	reverse_proxy 127.0.0.1:9`},
		{"file_server pass_thru before idempotency", `
	route {
		file_server {
			pass_thru
		}
		idempotency
		reverse_proxy 127.0.0.1:9
	}`},
		{"a fallback handle of a group before idempotency", `
	route {
		handle /api/* {
			header X-API 1
		}
		handle {
			respond "not the api" 404
		}
		idempotency
		reverse_proxy 127.0.0.1:9
	}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			port := freePort(t)
			cfg := fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	idempotency {
		strict
	}
}

http://127.0.0.1:%d {
%s
}
`, port, tt.routes)
			js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(caddyfile.Format([]byte(cfg)), map[string]any{"filename": "Caddyfile"})
			if err != nil {
				t.Fatalf("adapt: %v", err)
			}
			if err := caddy.Load(js, true); err != nil {
				t.Fatalf("strict refused a correct config: %v", err)
			}
			t.Cleanup(func() { _ = caddy.Stop() })
		})
	}
}

package e2e

import (
	"fmt"
	"testing"
)

// Nested handlers (docs/caddyfile.md, Directive order and `route`): the outermost idempotency
// handler that takes a key owns the request, but a request the outer one
// only passed through (no key) gets the inner handler's rules: a route
// that requires keys inside a site that does not still requires them.
func TestInnerRequiredAppliesUnderASiteWideIdempotencyHandler(t *testing.T) {
	up := newUpstream(t)
	inst := startCaddy(t, "caddy", site{routes: fmt.Sprintf("\tidempotency\n"+
		"\thandle /payments/* {\n\t\tidempotency {\n\t\t\trequired\n\t\t}\n\t\treverse_proxy %s\n\t}\n"+
		"\thandle {\n\t\treverse_proxy %s\n\t}\n", up.Addr, up.Addr)})
	u := inst.URL()

	r := post(u, "/payments/x", "", `{"amount":10}`)
	assertExecutions(t, up, "", 0)
	if r.status != 400 || r.problem() != "urn:caddy-idempotency:key-missing" {
		t.Fatalf("POST /payments/x without a key: %s, want 400 urn:caddy-idempotency:key-missing", describe(r))
	}

	// With a key, the outer handler owns the request: it runs once.
	if r := post(u, "/payments/x", "pay-1", `{"amount":10}`); !r.isNew() {
		t.Fatalf("POST /payments/x with a key: %s", describe(r))
	}
	if r := post(u, "/payments/x", "pay-1", `{"amount":10}`); !r.isReplayOf(1) {
		t.Fatalf("its retry: %s, want a replay", describe(r))
	}
	assertExecutions(t, up, "pay-1", 1)

	// Elsewhere keys stay optional.
	if r := post(u, "/orders", "", `{"amount":10}`); !r.isNew() {
		t.Fatalf("POST /orders without a key: %s, want it passed on", describe(r))
	}
	assertExecutions(t, up, "", 1)
}

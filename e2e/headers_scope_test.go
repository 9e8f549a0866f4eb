package e2e

import (
	"fmt"
	"slices"
	"testing"
)

// What a replay carries, and whose it is: headers that outer handlers set
// for the current request belong to that request, never to the record;
// and a scope built from several values tells every tuple of values
// apart.

// Headers set by handlers before idempotency (CORS, request ids) are set
// afresh on every request, the replay included: the recorded response
// must not bring back the first request's values.
func TestHeadersSetBeforeIdempotencyAreTheReplaysOwn(t *testing.T) {
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", site{routes: fmt.Sprintf("\troute {\n"+
				"\t\theader Access-Control-Allow-Origin {http.request.header.Origin}\n"+
				"\t\theader X-Request-Id {http.request.uuid}\n"+
				"\t\tidempotency {\n%s\n\t\t}\n"+
				"\t\treverse_proxy %s\n\t}\n", store.storage, up.Addr)})
			const key = "outer-headers"

			first := post(inst.URL(), "/orders", key, `{"amount":10}`, "Origin", "https://a.example")
			if !first.isNew() {
				t.Fatalf("first request: %s", describe(first))
			}
			firstID := first.header.Values("X-Request-Id")
			if got := first.header.Values("Access-Control-Allow-Origin"); !slices.Equal(got, []string{"https://a.example"}) || len(firstID) != 1 {
				t.Fatalf("first request: Access-Control-Allow-Origin %q, X-Request-Id %q; the header handler is not working", got, firstID)
			}

			retry := post(inst.URL(), "/orders", key, `{"amount":10}`, "Origin", "https://b.example")
			if !retry.isReplayOf(1) {
				t.Fatalf("retry: %s, want a replay", describe(retry))
			}
			if got := retry.header.Values("Access-Control-Allow-Origin"); !slices.Equal(got, []string{"https://b.example"}) {
				t.Errorf("replay to origin https://b.example: Access-Control-Allow-Origin %q, want exactly [https://b.example]", got)
			}
			if got := retry.header.Values("X-Request-Id"); len(got) != 1 || got[0] == firstID[0] {
				t.Errorf("replay: X-Request-Id %q, want one id of its own (the first response had %q)", got, firstID[0])
			}
			assertExecutions(t, up, key, 1)
		})
	}
}

// The scope's placeholders are separate values: tenant "acme corp" with
// user "bob" and tenant "acme" with user "corp bob" are two clients,
// though their values joined by a space are the same string.
func TestScopeValuesThatJoinToTheSameStringAreTwoClients(t *testing.T) {
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", site{routes: route(up, store.storage+
				"\nscope {http.request.header.X-Tenant} {http.request.header.X-User}")})
			const key, body = "same-key-two-tenants", `{"amount":10}`
			acmeCorp := []string{"X-Tenant", "acme corp", "X-User", "bob"}
			acme := []string{"X-Tenant", "acme", "X-User", "corp bob"}

			if r := post(inst.URL(), "/orders", key, body, acmeCorp...); !r.isNew() || r.execution() != 1 {
				t.Fatalf("tenant %q, user %q: %s", acmeCorp[1], acmeCorp[3], describe(r))
			}
			r := post(inst.URL(), "/orders", key, body, acme...)
			assertExecutions(t, up, key, 2)
			if !r.isNew() || r.execution() != 2 {
				t.Fatalf("tenant %q, user %q with the same key: %s, want its own execution, never the other client's response", acme[1], acme[3], describe(r))
			}
			if r := post(inst.URL(), "/orders", key, body, acmeCorp...); !r.isReplayOf(1) {
				t.Fatalf("tenant %q again: %s, want its own response", acmeCorp[1], describe(r))
			}
			if r := post(inst.URL(), "/orders", key, body, acme...); !r.isReplayOf(2) {
				t.Fatalf("tenant %q again: %s, want its own response", acme[1], describe(r))
			}
			assertExecutions(t, up, key, 2)
		})
	}
}

// A scope of the host keeps the clients of two hosts apart when the
// request's Host is rewritten after Caddy's tracing (which passes a copy of
// the request on): {http.request.host} is still the client's host there,
// and a key of tenant-b must never replay tenant-a's answer.
func TestHostScopeAfterTracingAndARewrittenHostKeepsTheHostsApart(t *testing.T) {
	up := newUpstream(t)
	inst := startCaddy(t, "caddy", site{routes: "\troute {\n" +
		"\t\ttracing {\n\t\t\tspan idempotency\n\t\t}\n" +
		"\t\trequest_header Host internal.example\n" +
		"\t\tidempotency {\n\t\t\tstorage memory\n\t\t\tscope {http.request.host}\n\t\t}\n" +
		"\t\treverse_proxy " + up.Addr + "\n\t}\n"})
	const key, body = "same-key-two-hosts", `{"amount":10}`
	if r := post(inst.URL(), "/orders", key, body, "Host", "tenant-a.example"); !r.isNew() || r.execution() != 1 {
		t.Fatalf("tenant-a: %s", describe(r))
	}
	r := post(inst.URL(), "/orders", key, body, "Host", "tenant-b.example")
	if !r.isNew() || r.execution() != 2 {
		t.Fatalf("tenant-b with tenant-a's key: %s, want its own execution, never tenant-a's response", describe(r))
	}
	if r := post(inst.URL(), "/orders", key, body, "Host", "tenant-a.example"); !r.isReplayOf(1) {
		t.Fatalf("tenant-a again: %s, want its own response", describe(r))
	}
	assertExecutions(t, up, key, 2)
}

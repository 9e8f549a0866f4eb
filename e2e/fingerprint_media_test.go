package e2e

import "testing"

// Bodies are compared by meaning only when they are declared as JSON
// (docs/caddyfile.md, Fingerprints); every other body byte for byte. A CSV
// "100" and "1e2" are two different requests, though both parse as the
// same JSON number.
func TestOnlyBodiesDeclaredAsJSONAreComparedByMeaning(t *testing.T) {
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", site{routes: route(up, store.storage)})
			u := inst.URL()

			t.Run("text/csv", func(t *testing.T) {
				csv := []string{"Content-Type", "text/csv"}
				if r := post(u, "/orders", "csv", "100", csv...); !r.isNew() {
					t.Fatalf("first CSV body: %s", describe(r))
				}
				r := post(u, "/orders", "csv", "1e2", csv...)
				assertExecutions(t, up, "csv", 1)
				if r.status != 422 || r.problem() != "urn:caddy-idempotency:key-reused" {
					t.Fatalf("CSV body 1e2 after 100 with the same key: %s, want 422 urn:caddy-idempotency:key-reused", describe(r))
				}
				if r := post(u, "/orders", "csv", "100", csv...); !r.isReplayOf(1) {
					t.Fatalf("the first CSV body again: %s, want a replay", describe(r))
				}
			})
			t.Run("application/json", func(t *testing.T) {
				if r := post(u, "/orders", "json", `{"a":100}`); !r.isNew() {
					t.Fatalf("first JSON body: %s", describe(r))
				}
				if r := post(u, "/orders", "json", `{"a":1e2}`); !r.isReplayOf(1) {
					t.Fatalf(`JSON body {"a":1e2} after {"a":100}: %s, want a replay (the same JSON)`, describe(r))
				}
				assertExecutions(t, up, "json", 1)
			})
		})
	}
}

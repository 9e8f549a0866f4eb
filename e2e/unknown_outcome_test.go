package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// Every way an upstream fails before its status, through a real caddy
// process, Caddy's reverse_proxy and real sockets, over HTTP/1.1, HTTP/2,
// h2c and HTTP/3 from the client side: a response-header timeout and a
// reset or an EOF once the upstream read the request leave the outcome
// unknown (the key is kept, every retry gets the outcome-unknown 502 and
// never runs); a refused connection sent nothing (the key is freed, the
// retry runs). Before the fix each of the first kind ran the request
// again on its retry.

const outcomeUnknownProblem = "urn:caddy-idempotency:outcome-unknown"

// failingRoutes is idempotency on store in front of three proxies of up,
// chosen by the request's X-Upstream-Fail: one whose response header
// timeout is 1s ("timeout"), one that dials refuse ("refused"), and the
// plain one (the upstream's own reset, eof and reset-body).
func failingRoutes(up *caddyproc.Upstream, refuse, store string) string {
	return fmt.Sprintf(`	idempotency {
%s
	}
	@timeout header X-Upstream-Fail timeout
	reverse_proxy @timeout %s {
		transport http {
			response_header_timeout 1s
		}
	}
	@refused header X-Upstream-Fail refused
	reverse_proxy @refused %s
	reverse_proxy %s
`, store, up.Addr, refuse, up.Addr)
}

// isOutcomeUnknown: the outcome-unknown problem, 502, not retryable.
func (r reply) isOutcomeUnknown() bool {
	return r.err == nil && r.status == 502 && r.problem() == outcomeUnknownProblem && r.header.Get("Retry-After") == ""
}

func TestUnknownOutcomesKeepTheKeyOverEveryProtocol(t *testing.T) {
	refuse, err := caddyproc.NewRefuser()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { refuse.Close() })
	for _, p := range allProtocols {
		t.Run(p.name, func(t *testing.T) {
			up := newUpstream(t)
			srv := startOver(t, p, "caddy", failingRoutes(up, refuse.Addr, "\t\tstorage memory {\n\t\t\tmax_keys 1000\n\t\t}"))
			srv.logOnFailure(t)
			c := srv.client(t, false)
			for _, tt := range []struct {
				name   string
				header []string
				status int
			}{
				{"response header timeout", append([]string{"X-Upstream-Fail", "timeout"}, delay(1500*time.Millisecond)...), 504},
				{"reset after the request", []string{"X-Upstream-Fail", "reset"}, 502},
				{"EOF after the request", []string{"X-Upstream-Fail", "eof"}, 502},
			} {
				key := "unknown-" + p.name + "-" + strings.ReplaceAll(tt.name, " ", "-")
				if r := srv.postWith(c, key, tt.header...); r.status != tt.status {
					t.Fatalf("%s: %s, want the proxy's %d", tt.name, r, tt.status)
				}
				// A retry while the timed-out upstream still works, and one
				// once it finished.
				for i := range 2 {
					if r := srv.postWith(c, key); !r.isOutcomeUnknown() {
						t.Fatalf("%s: retry %d: %s %v, want the outcome-unknown 502", tt.name, i+1, r, r.header)
					}
					testutil.Eventually(t, 10*time.Second, "the upstream to finish "+key, func() bool { return up.Finished(key) == 1 })
				}
				assertExecutions(t, up, key, 1)
			}

			key := "refused-" + p.name
			if r := srv.postWith(c, key, "X-Upstream-Fail", "refused"); r.status != 502 || r.problem() != "" {
				t.Fatalf("a refused connection: %s, want the proxy's 502", r)
			}
			if r := srv.postWith(c, key); !r.isNew() {
				t.Fatalf("the retry after a refused connection: %s, want it run", r)
			}
			if r := srv.postWith(c, key); !r.isReplayOf(1) {
				t.Fatalf("the next retry: %s, want the replay", r)
			}
			assertExecutions(t, up, key, 1)

			key = "reset-body-" + p.name
			srv.postWith(c, key, "X-Upstream-Fail", "reset-body")
			if r := srv.postWith(c, key); r.status != 201 || !r.replayed() || r.header.Get("Idempotent-Body-Omitted") != "true" {
				t.Fatalf("the retry after a reset mid-body: %s %v, want the 201 replayed without its body", r, r.header)
			}
			assertExecutions(t, up, key, 1)
		})
	}
}

// On the shared stores, the outcome-unknown record is the key's on every
// instance: a timed-out request on one, its retries on another.
func TestAnUnknownOutcomeIsKeptForEveryInstance(t *testing.T) {
	refuse, err := caddyproc.NewRefuser()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { refuse.Close() })
	for _, b := range sharedBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			up := newUpstream(t)
			one := startCaddy(t, "one", site{routes: failingRoutes(up, refuse.Addr, store.storage)})
			two := startCaddy(t, "two", site{routes: failingRoutes(up, refuse.Addr, store.storage)})
			const key = "unknown-across-instances"
			header := append([]string{"X-Upstream-Fail", "timeout"}, delay(1500*time.Millisecond)...)
			if r := post(one.URL(), "/orders", key, `{"amount":10}`, header...); r.status != 504 {
				t.Fatalf("first, on one: %s, want 504", r)
			}
			for _, inst := range []*caddyproc.Instance{two, one, two} {
				if r := post(inst.URL(), "/orders", key, `{"amount":10}`); !r.isOutcomeUnknown() {
					t.Fatalf("retry on %s: %s, want the outcome-unknown 502", inst.Name, r)
				}
			}
			testutil.Eventually(t, 10*time.Second, "the upstream to finish", func() bool { return up.Finished(key) == 1 })
			assertExecutions(t, up, key, 1)
			if r := post(two.URL(), "/orders", key, `{"amount":11}`); r.status != 422 {
				t.Fatalf("another body on two: %s, want 422", r)
			}
		})
	}
}

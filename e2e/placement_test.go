package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// The worst mistake a configuration can make with this module puts
// idempotency after the handler that answers: it never runs, and every
// retry reaches the upstream again. `caddy run` names each such handler
// (site and route) at start and on every reload, and with the global
// option `idempotency { strict }` refuses the config.

// misplacedLog is the start of the error logged for a misplaced handler.
const misplacedLog = "an idempotency handler can never run"

// placements are the three ways of misplacing the directive, and the
// right one.
func placements(up *caddyproc.Upstream) []struct {
	name, globals, routes string
	misplaced             bool
} {
	proxy := "\treverse_proxy " + up.Addr + "\n"
	return []struct {
		name, globals, routes string
		misplaced             bool
	}{
		{"order idempotency last", "order idempotency last", "\tidempotency\n" + proxy, true},
		{"order idempotency after reverse_proxy", "order idempotency after reverse_proxy", "\tidempotency\n" + proxy, true},
		{"route with reverse_proxy first", "", "\troute {\n\t" + proxy + "\t\tidempotency\n\t}\n", true},
		{"the directive's own order", "", "\tidempotency\n" + proxy, false},
	}
}

func TestMisplacedIdempotencyIsNamedAtStartAndOnEveryReload(t *testing.T) {
	up := newUpstream(t)
	for _, p := range placements(up) {
		t.Run(p.name, func(t *testing.T) {
			s := site{globals: p.globals, routes: p.routes}
			inst := startCaddy(t, "caddy", s)
			// A reload to a config that differs (an unchanged one is not
			// loaded again).
			reload(t, inst, site{globals: p.globals + "\ngrace_period 2s", routes: p.routes})
			// The log reaches us through a pipe: once the reload's last
			// line is in, every line before it is.
			testutil.Eventually(t, 30*time.Second, "the reload's log", func() bool {
				return strings.Contains(inst.Log(), `"msg":"load complete"`)
			})
			n := strings.Count(inst.Log(), misplacedLog)
			if !p.misplaced {
				if n != 0 {
					t.Fatalf("a correct config logged %d misplacement errors", n)
				}
				return
			}
			if n != 2 {
				t.Fatalf("logged the misplacement %d times, want once at start and once on the reload", n)
			}
			for _, want := range []string{`"server":"srv0"`, `"route":"routes[0]`, `"answered_by":"reverse_proxy"`} {
				if !strings.Contains(inst.Log(), want) {
					t.Errorf("the error does not name %s", want)
				}
			}
			// What the error is about: a retry runs the upstream again.
			key := "misplaced-" + strings.ReplaceAll(p.name, " ", "-")
			post(inst.URL(), "/orders", key, `{}`)
			post(inst.URL(), "/orders", key, `{}`)
			assertExecutions(t, up, key, 2)
		})
	}
}

func TestStrictRefusesAMisplacedIdempotency(t *testing.T) {
	up := newUpstream(t)
	for _, p := range placements(up) {
		t.Run(p.name, func(t *testing.T) {
			strict := site{globals: p.globals + "\nidempotency {\n\tstrict\n}", routes: p.routes}
			port, err := caddyproc.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			inst, err := caddyproc.Start(caddyBin, t.TempDir(), "strict", port, strict.config(port))
			if !p.misplaced {
				if err != nil {
					t.Fatalf("strict refused a correct config: %v", err)
				}
				inst.Stop()
				return
			}
			if err == nil {
				inst.Stop()
				t.Fatal("strict started a config whose idempotency handler can never run")
			}
			if !strings.Contains(err.Error(), "strict: idempotency handlers that can never run") {
				t.Fatalf("start failed, but not for the misplacement: %v", err)
			}

			// A reload to such a config is refused too, and the running
			// config goes on protecting requests.
			good := site{globals: "idempotency {\n\tstrict\n}", routes: "\tidempotency\n\treverse_proxy " + up.Addr + "\n"}
			running := startCaddy(t, "caddy", good)
			if err := running.Reload(strict.config(running.Port)); err == nil || !strings.Contains(err.Error(), "can never run") {
				t.Fatalf("reload to a misplaced strict config: %v, want it refused", err)
			}
			key := fmt.Sprintf("strict-%d", port)
			post(running.URL(), "/orders", key, `{}`)
			if r := post(running.URL(), "/orders", key, `{}`); !r.isReplayOf(1) {
				t.Fatalf("after the refused reload: %s, want the replay", describe(r))
			}
		})
	}
}

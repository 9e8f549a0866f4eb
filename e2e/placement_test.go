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

// misplacedLog is the start of the warning logged for a misplaced handler.
const misplacedLog = "an idempotency handler can never run"

// placements are four ways of misplacing the directive, and the right
// one.
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
		// Every request runs one of the handle blocks, and each answers.
		{"order idempotency last, handle blocks and a fallback", "order idempotency last", "\tidempotency\n\thandle /orders* {\n\t" + proxy + "\t}\n\thandle {\n\t\trespond 404\n\t}\n", true},
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
			for _, want := range []string{`"server":"srv0"`, fmt.Sprintf(`"site":"127.0.0.1:%d"`, inst.Port), `"answered_by":"reverse_proxy"`, `"fix":"`} {
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
			if !strings.Contains(err.Error(), "strict: "+misplacedLog) {
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

// TestValidateNamesMisplacementAsRunDoes: `caddy validate` provisions the
// config but starts no app; it gives the outcome `caddy run` gives, for
// each shape of misplacement: a warning naming the site, the route and the
// fix (and "Valid configuration") without strict, the same sentence as an
// error and a failing exit status with it.
func TestValidateNamesMisplacementAsRunDoes(t *testing.T) {
	up := newUpstream(t)
	proxy := "reverse_proxy " + up.Addr
	for _, tt := range []struct {
		name, globals, named, routes string
		route, fix                   string
	}{
		{name: "route with idempotency after reverse_proxy",
			routes: "route {\n" + proxy + "\nidempotency\n}",
			route:  "route", fix: "move `idempotency` before `reverse_proxy` in this route"},
		{name: "order idempotency last, handle blocks and a fallback handle", globals: "order idempotency last",
			routes: "idempotency\nhandle /orders* {\n" + proxy + "\n}\nhandle {\nrespond 404\n}",
			route:  "the site block", fix: "change the `order` line: `order idempotency before handle`"},
		{name: "order idempotency last, in handle blocks", globals: "order idempotency last",
			routes: "handle /orders* {\nidempotency\n" + proxy + "\n}\nhandle {\nrespond 404\n}",
			route:  "handle /orders*", fix: "change the `order` line: `order idempotency before reverse_proxy`"},
		{name: "invoke of a named route", named: "&(api) {\n" + proxy + "\n}\n",
			routes: "route {\ninvoke api\nidempotency\n}",
			route:  "route", fix: "move `idempotency` before `invoke api` in this route"},
		{name: "order idempotency last, reverse_proxy with a handle_response that responds", globals: "order idempotency last",
			routes: "idempotency\n" + proxy + " {\n@err status 5xx\nhandle_response @err {\nrespond 502\n}\n}",
			route:  "the site block", fix: "change the `order` line: `order idempotency before reverse_proxy`"},
		{name: "handle_errors", globals: "order idempotency last",
			routes: "error /orders* 502\nhandle_errors {\nidempotency\n" + proxy + "\n}",
			route:  "handle_errors", fix: "change the `order` line: `order idempotency before reverse_proxy`"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			port, err := caddyproc.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			cfg := func(strict bool) caddyproc.Config {
				g := tt.globals
				if strict {
					g += "\nidempotency {\n\tstrict\n}"
				}
				return caddyproc.Config{Globals: g, Sites: tt.named + fmt.Sprintf("http://:%d {\n\tbind 127.0.0.1\n%s\n}\n", port, tt.routes)}
			}
			wants := []string{
				fmt.Sprintf("%s (site 127.0.0.1:%d, %s)", misplacedLog, port, tt.route),
				"fix: " + tt.fix,
			}
			saysAll := func(what, out string) {
				t.Helper()
				for _, want := range wants {
					if !strings.Contains(out, want) {
						t.Errorf("%s does not say %q:\n%s", what, want, tail(out, 12))
					}
				}
			}
			for _, strict := range []bool{false, true} {
				c := cfg(strict)
				ok, out := caddyValidate(t, "{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n"+c.Globals+"\n}\n\n"+c.Sites, "caddyfile")
				switch {
				case !strict && !ok:
					t.Fatalf("caddy validate refused a config without strict:\n%s", tail(out, 12))
				case !strict && !strings.Contains(out, "Valid configuration"):
					t.Fatalf("caddy validate did not say Valid configuration:\n%s", tail(out, 12))
				case strict && ok:
					t.Fatalf("caddy validate accepted a misplaced idempotency with strict:\n%s", tail(out, 12))
				}
				saysAll(fmt.Sprintf("caddy validate (strict %v)", strict), out)
			}

			// caddy run: the same warning, and with strict the same refusal.
			inst, err := caddyproc.Start(caddyBin, t.TempDir(), "caddy", port, cfg(false))
			if err != nil {
				t.Fatalf("caddy run refused a config without strict: %v", err)
			}
			testutil.Eventually(t, 30*time.Second, "the misplacement warning", func() bool {
				return strings.Contains(inst.Log(), misplacedLog)
			})
			inst.Stop()
			saysAll("caddy run", inst.Log())
			inst, err = caddyproc.Start(caddyBin, t.TempDir(), "strict", port, cfg(true))
			if err == nil {
				inst.Stop()
				t.Fatal("caddy run started a misplaced idempotency with strict")
			}
			saysAll("caddy run (strict)", err.Error())
		})
	}
}

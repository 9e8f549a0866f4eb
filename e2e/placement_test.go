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
// retry reaches the upstream again. Such a config is refused by `caddy
// validate`, `caddy run` and a reload, naming the site (as the Caddyfile
// writes it) and the route. One in which the requests that reach an
// upstream skip it, and nothing after it answers the rest, is named in a
// warning, and refused with the global option `idempotency { strict }`.

// misplacedLog is the start of the sentence about a handler that can
// never run; skippedLog of one that protects no upstream.
const (
	misplacedLog = "an idempotency handler can never run"
	skippedLog   = "an idempotency handler protects no upstream"
)

// placements are four ways of putting the directive where it can never
// run, and the right one.
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

// A handler that can never run is refused at start and on a reload,
// with or without strict; the running config goes on protecting
// requests.
func TestMisplacedIdempotencyIsRefusedAtStartAndOnReload(t *testing.T) {
	up := newUpstream(t)
	good := site{routes: "\tidempotency\n\treverse_proxy " + up.Addr + "\n"}
	running := startCaddy(t, "caddy", good)
	for _, p := range placements(up) {
		for _, strict := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, strict %v", p.name, strict), func(t *testing.T) {
				s := site{globals: p.globals, routes: p.routes}
				if strict {
					s.globals += "\nidempotency {\n\tstrict\n}"
				}
				port, err := caddyproc.FreePort()
				if err != nil {
					t.Fatal(err)
				}
				inst, err := caddyproc.Start(caddyBin, t.TempDir(), "caddy", port, s.config(port))
				if !p.misplaced {
					if err != nil {
						t.Fatalf("a correct config was refused: %v", err)
					}
					inst.Stop()
					return
				}
				if err == nil {
					inst.Stop()
					t.Fatal("caddy run started a config whose idempotency handler can never run")
				}
				for _, want := range []string{misplacedLog, fmt.Sprintf("(site :%d, ", port), "answers its requests first", "fix: "} {
					if !strings.Contains(err.Error(), want) {
						t.Fatalf("start failed, but does not say %q: %v", want, err)
					}
				}
				if err := running.Reload(s.config(running.Port)); err == nil || !strings.Contains(err.Error(), misplacedLog) {
					t.Fatalf("reload to a misplaced config: %v, want it refused", err)
				}
				key := fmt.Sprintf("refused-%d-%v", port, strict)
				post(running.URL(), "/orders", key, `{}`)
				if r := post(running.URL(), "/orders", key, `{}`); !r.isReplayOf(1) {
					t.Fatalf("after the refused reload: %s, want the replay", describe(r))
				}
			})
		}
	}
}

// skippedRoutes put idempotency after a reverse_proxy that answers some
// requests, with nothing after it: the requests that reach the upstream
// skip it, the others get an empty 200 from it.
func skippedRoutes(up *caddyproc.Upstream) string {
	return "\troute {\n\t\treverse_proxy /orders* " + up.Addr + "\n\t\tidempotency\n\t}\n"
}

// A handler that the requests reaching an upstream skip is named at start
// and on every reload (and does what the warning says: a retry runs
// again); with strict, the config is refused.
func TestSkippedIdempotencyIsNamedAndRefusedWhenStrict(t *testing.T) {
	up := newUpstream(t)
	s := site{routes: skippedRoutes(up)}
	inst := startCaddy(t, "caddy", s)
	// A reload to a config that differs (an unchanged one is not loaded
	// again).
	reload(t, inst, site{globals: "grace_period 2s", routes: s.routes})
	// The log reaches us through a pipe: once the reload's last line is
	// in, every line before it is.
	testutil.Eventually(t, 30*time.Second, "the reload's log", func() bool {
		return strings.Contains(inst.Log(), `"msg":"load complete"`)
	})
	if n := strings.Count(inst.Log(), skippedLog); n != 2 {
		t.Fatalf("logged the warning %d times, want once at start and once on the reload", n)
	}
	for _, want := range []string{`"server":"srv0"`, fmt.Sprintf(`"site":":%d"`, inst.Port), `"answered_by":"reverse_proxy"`, `"fix":"`} {
		if !strings.Contains(inst.Log(), want) {
			t.Errorf("the warning does not name %s", want)
		}
	}
	key := "skipped"
	post(inst.URL(), "/orders", key, `{}`)
	post(inst.URL(), "/orders", key, `{}`)
	assertExecutions(t, up, key, 2)

	strict := site{globals: "idempotency {\n\tstrict\n}", routes: s.routes}
	if err := inst.Reload(strict.config(inst.Port)); err == nil || !strings.Contains(err.Error(), skippedLog) {
		t.Fatalf("reload to the strict config: %v, want it refused", err)
	}
	port, err := caddyproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if other, err := caddyproc.Start(caddyBin, t.TempDir(), "strict", port, strict.config(port)); err == nil {
		other.Stop()
		t.Fatal("strict started a config that the requests reaching an upstream skip")
	}
}

// TestValidateNamesMisplacementAsRunDoes: `caddy validate` provisions the
// config but starts no app; it gives the outcome `caddy run` gives, for
// each shape of a handler that can never run: the sentence naming the
// site, the route and the fix as an error, and a failing exit status,
// with or without strict. (A handler that some requests skip: a warning
// and "Valid configuration", an error with strict.)
func TestValidateNamesMisplacementAsRunDoes(t *testing.T) {
	up := newUpstream(t)
	proxy := "reverse_proxy " + up.Addr
	for _, tt := range []struct {
		name, globals, named, routes string
		route, fix                   string
		skipped                      bool
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
		{name: "skipped: reverse_proxy for some requests first", skipped: true,
			routes: "route {\nreverse_proxy /orders* " + up.Addr + "\nidempotency\n}",
			route:  "route", fix: "move `idempotency` before `reverse_proxy` in this route"},
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
			sentence := misplacedLog
			if tt.skipped {
				sentence = skippedLog
			}
			wants := []string{
				fmt.Sprintf("%s (site :%d, %s)", sentence, port, tt.route),
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
				refused := strict || !tt.skipped
				switch {
				case refused && ok:
					t.Fatalf("caddy validate (strict %v) accepted it:\n%s", strict, tail(out, 12))
				case !refused && !ok:
					t.Fatalf("caddy validate refused a skipped handler without strict:\n%s", tail(out, 12))
				case !refused && !strings.Contains(out, "Valid configuration"):
					t.Fatalf("caddy validate did not say Valid configuration:\n%s", tail(out, 12))
				}
				saysAll(fmt.Sprintf("caddy validate (strict %v)", strict), out)
			}

			// caddy run: the same sentence, and the same refusal.
			inst, err := caddyproc.Start(caddyBin, t.TempDir(), "caddy", port, cfg(false))
			if !tt.skipped {
				if err == nil {
					inst.Stop()
					t.Fatal("caddy run started a handler that can never run")
				}
				saysAll("caddy run", err.Error())
				return
			}
			if err != nil {
				t.Fatalf("caddy run refused a skipped handler without strict: %v", err)
			}
			testutil.Eventually(t, 30*time.Second, "the warning", func() bool {
				return strings.Contains(inst.Log(), sentence)
			})
			inst.Stop()
			saysAll("caddy run", inst.Log())
			inst, err = caddyproc.Start(caddyBin, t.TempDir(), "strict", port, cfg(true))
			if err == nil {
				inst.Stop()
				t.Fatal("caddy run started a skipped handler with strict")
			}
			saysAll("caddy run (strict)", err.Error())
		})
	}
}

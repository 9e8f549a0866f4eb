package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/configspace"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
)

// The configuration space through the caddy binary (issue 38): every case
// of configspace through `caddy validate`, and an admin POST /load over a
// running server, twice as a Caddyfile and once as JSON (as an operator
// re-running a reload would); the cases issue 38 found through `caddy
// adapt` and `caddy run` too, stopped with SIGTERM. Every step answers
// within stepBound, nothing panics, a refused config is refused by every
// step naming its option or parameter while the running server keeps
// serving its old config and answering its admin API, an accepted one
// answers a keyed request on the real stores (never a 503 for a
// configuration, never key-invalid for a good key), and the server stops
// on POST /stop at the end.

// stepBound is how long one step may take: a validate, a load, a request.
const stepBound = 30 * time.Second

// spaceBaseline is what the loaded server runs between cases.
const spaceBaseline = "baseline"

func spaceEnv(t *testing.T) configspace.Env {
	dsn := pgtest.Require(t)
	return configspace.Env{
		RedisURL:    "redis://" + sharedRedisAddr(t) + "/0",
		KeyPrefix:   "idempotency-e2e:" + redistest.RandomHex(6) + ":",
		PostgresDSN: dsn,
		Table:       pgtest.Table(t, dsn),
	}
}

func TestConfigSpaceThroughCaddy(t *testing.T) {
	env := spaceEnv(t)
	target := newLoadTarget(t)
	named := map[string]bool{}
	for _, c := range configspace.Named() {
		named[c.Name()] = true
	}
	for i, c := range configspace.Cases() {
		t.Run(c.Name(), func(t *testing.T) {
			site := configspace.Site{Port: 1} // validate binds nothing
			if js, ok := c.JSONConfig(env, site); ok && c.JSONOnly {
				validateCLI(t, c, "caddy.json", js, "")
			} else {
				validateCLI(t, c, "Caddyfile", c.Caddyfile(env, site), "caddyfile")
			}
			target.load(t, env, c, fmt.Sprintf("k%d", i))
			if named[c.Name()] && !c.JSONOnly {
				adaptCLI(t, env, c)
				runCLI(t, env, c)
			}
		})
	}
	target.stop(t)
}

// caddyStep runs the caddy binary with args in dir, within stepBound, and
// returns whether it exited 0 and what it printed. A panic (exit 2) or a
// step that does not end fails t.
func caddyStep(t *testing.T, dir string, args ...string) (ok bool, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), stepBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, caddyBin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+filepath.Join(dir, "data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "config-home"))
	b, err := cmd.CombinedOutput()
	out = string(b)
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("caddy %s did not end within %v:\n%s", args[0], stepBound, tail(out, 20))
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		return false, out
	case err != nil:
		t.Fatalf("caddy %s: %v (a panic exits 2):\n%s", args[0], err, panicOrTail(out))
	}
	return true, out
}

// panicOrTail is the panic in out, or its tail.
func panicOrTail(out string) string {
	if i := strings.Index(out, "panic: "); i >= 0 {
		return out[i:min(len(out), i+3000)]
	}
	return tail(out, 20)
}

// judge checks what a step made of c: accepted or refused as c wants, and
// a refusal naming its setting.
func judge(t *testing.T, c configspace.Case, step string, ok bool, out string) {
	t.Helper()
	switch {
	case !ok && c.Want == configspace.Accepted:
		t.Fatalf("%s refused %s, want it accepted:\n%s", step, c.Name(), tail(out, 10))
	case ok && c.Want == configspace.Refused:
		t.Fatalf("%s accepted %s, want it refused naming %s", step, c.Name(), c.Option)
	case !ok:
		if err := configspace.Check(c, out); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
}

// validateCLI runs `caddy validate` on config.
func validateCLI(t *testing.T, c configspace.Case, file, config, adapter string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, file), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"validate", "--config", file}
	if adapter != "" {
		args = append(args, "--adapter", adapter)
	}
	ok, out := caddyStep(t, dir, args...)
	judge(t, c, "caddy validate ("+adapter+")", ok, out)
}

// adaptCLI runs `caddy adapt` on c's Caddyfile: it refuses what the
// Caddyfile parser refuses (it checks the options it reads), never
// panics or hangs, and a refusal names the setting.
func adaptCLI(t *testing.T, env configspace.Env, c configspace.Case) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "Caddyfile"), []byte(c.Caddyfile(env, configspace.Site{Port: 1})), 0o644); err != nil {
		t.Fatal(err)
	}
	ok, out := caddyStep(t, dir, "adapt", "--config", "Caddyfile", "--adapter", "caddyfile")
	if !ok {
		judge(t, c, "caddy adapt", ok, out)
	}
}

// runCLI runs `caddy run` with c: a refused config ends the process with
// the refusal; an accepted one serves a keyed request and stops on
// SIGTERM.
func runCLI(t *testing.T, env configspace.Env, c configspace.Case) {
	t.Helper()
	port, err := caddyproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	adminPort, err := caddyproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	site := configspace.Site{Admin: fmt.Sprintf("127.0.0.1:%d", adminPort), Port: port}
	inst, err := caddyproc.Run(caddyBin, dir, "run", site.Admin, port, c.Caddyfile(env, site))
	if err != nil {
		if c.Want == configspace.Accepted {
			t.Fatalf("caddy run refused %s: %v", c.Name(), err)
		}
		if !strings.Contains(err.Error(), "exited") {
			t.Fatalf("caddy run %s: %v", c.Name(), err)
		}
		judge(t, c, "caddy run", false, err.Error())
		return
	}
	defer inst.Kill()
	if c.Want == configspace.Refused {
		t.Fatalf("caddy run accepted %s, want it refused naming %s", c.Name(), c.Option)
	}
	if c.Want == configspace.Accepted {
		checkServes(t, c, inst.URL(), "run")
	}
	if !inst.Terminate(stepBound) {
		t.Fatalf("caddy run with %s did not stop within %v of SIGTERM:\n%s", c.Name(), stepBound, tail(inst.Log(), 30))
	}
	if log := inst.Log(); strings.Contains(log, "\npanic: ") {
		t.Fatalf("caddy run with %s panicked:\n%s", c.Name(), panicOrTail(log))
	}
}

// spaceClient bounds every request of these tests. It keeps no idle
// connection: a load closes the old server's (with an EOF for the next
// request sent on one), and a request must reach the config just loaded.
var spaceClient = &http.Client{Timeout: stepBound, Transport: &http.Transport{DisableKeepAlives: true}}

// send sends the request newReq makes, again while the connection breaks
// off (EOF, a reset) within stepBound: the moment after a load, Caddy's
// old servers and its admin endpoint close the connections they had
// accepted (the admin endpoint is replaced on every load). A request that
// is not answered in time is not sent again: that is a hang.
func send(newReq func() *http.Request) (*http.Response, error) {
	deadline := time.Now().Add(stepBound)
	for {
		resp, err := spaceClient.Do(newReq())
		var timeout interface{ Timeout() bool }
		if err == nil || errors.As(err, &timeout) && timeout.Timeout() || time.Now().After(deadline) {
			return resp, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkServes sends a keyed request to base: an accepted config answers
// it with a 2xx, or with the problem the case names; never a 503 (a
// configuration that cannot work) nor key-invalid (the key is good).
func checkServes(t *testing.T, c configspace.Case, base, key string) {
	t.Helper()
	// The same key on every try: a retry is what the key is for.
	key = "space-" + key + "-" + redistest.RandomHex(4)
	resp, err := send(func() *http.Request {
		req, _ := http.NewRequest(http.MethodPost, base+"/", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		return req
	})
	if err != nil {
		t.Fatalf("a keyed request to %s: %v", c.Name(), err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case c.Problem != "":
		if !strings.Contains(string(b), `"urn:caddy-idempotency:`+c.Problem+`"`) {
			t.Fatalf("a keyed request to %s got %d %s, want the problem %s", c.Name(), resp.StatusCode, b, c.Problem)
		}
	case resp.StatusCode/100 != 2:
		t.Fatalf("a keyed request to %s got %d %s, want a 2xx", c.Name(), resp.StatusCode, b)
	}
}

// loadTarget is a running Caddy that configs are loaded into through its
// admin API.
type loadTarget struct {
	t    *testing.T
	inst *caddyproc.Instance
}

func newLoadTarget(t *testing.T) *loadTarget {
	lt := &loadTarget{t: t}
	lt.start()
	return lt
}

func (lt *loadTarget) start() {
	port, err := caddyproc.FreePort()
	if err != nil {
		lt.t.Fatal(err)
	}
	lt.inst = startCaddyOn(lt.t, "space", port, site{routes: "\trespond \"" + spaceBaseline + "\""})
}

func (lt *loadTarget) site() configspace.Site {
	return configspace.Site{Admin: lt.inst.AdminAddr, Port: lt.inst.Port}
}

// admin sends a request to the admin API within stepBound; ok is false
// when it does not answer.
func (lt *loadTarget) admin(method, path, contentType, body string) (status int, reply string, ok bool) {
	resp, err := send(func() *http.Request {
		req, _ := http.NewRequest(method, "http://"+lt.inst.AdminAddr+path, strings.NewReader(body))
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		return req
	})
	if err != nil {
		return 0, err.Error(), false
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b), true
}

// load loads c twice as a Caddyfile and once as JSON, checking each
// answer, and the server between them; then the baseline again. A server
// that stops answering is replaced for the next case.
func (lt *loadTarget) load(t *testing.T, env configspace.Env, c configspace.Case, key string) {
	t.Helper()
	wedged := true
	defer func() {
		if wedged {
			lt.inst.Kill()
			lt.start()
		}
	}()
	type form struct{ name, contentType, body string }
	var forms []form
	if !c.JSONOnly {
		forms = append(forms, form{"caddyfile", "text/caddyfile", c.Caddyfile(env, lt.site())}, form{"caddyfile again", "text/caddyfile", c.Caddyfile(env, lt.site())})
	}
	if js, ok := c.JSONConfig(env, lt.site()); ok {
		forms = append(forms, form{"json", "application/json", js})
		if c.JSONOnly {
			forms = append(forms, form{"json again", "application/json", js})
		}
	}
	for _, f := range forms {
		status, reply, ok := lt.admin(http.MethodPost, "/load", f.contentType, f.body)
		if !ok {
			t.Fatalf("POST /load (%s) of %s did not answer within %v: %s\n%s", f.name, c.Name(), stepBound, reply, tail(lt.inst.Log(), 30))
		}
		if !lt.inst.Running() {
			t.Fatalf("POST /load (%s) of %s ended Caddy:\n%s", f.name, c.Name(), panicOrTail(lt.inst.Log()))
		}
		accepted := status == http.StatusOK
		judge(t, c, "POST /load ("+f.name+")", accepted, reply)
		if accepted {
			if c.Want == configspace.Accepted {
				checkServes(t, c, lt.inst.URL(), key+"-"+strings.ReplaceAll(f.name, " ", "-"))
			}
		} else {
			lt.checkBaseline(t, "after a refused load ("+f.name+") of "+c.Name())
		}
		if status, reply, ok := lt.admin(http.MethodGet, "/config/", "", ""); !ok || status != http.StatusOK {
			t.Fatalf("GET /config/ after a load (%s) of %s: %d %s", f.name, c.Name(), status, reply)
		}
	}
	baseline := caddyproc.Config{Sites: fmt.Sprintf("http://:%d {\n\tbind 127.0.0.1\n\trespond %q\n}\n", lt.inst.Port, spaceBaseline)}
	if err := lt.inst.Reload(baseline); err != nil {
		t.Fatalf("loading the baseline after %s: %v", c.Name(), err)
	}
	lt.checkBaseline(t, "after the baseline was loaded again")
	wedged = false
}

// checkBaseline checks that the server still serves the baseline.
func (lt *loadTarget) checkBaseline(t *testing.T, when string) {
	t.Helper()
	resp, err := send(func() *http.Request {
		req, _ := http.NewRequest(http.MethodGet, lt.inst.URL()+"/", nil)
		return req
	})
	if err != nil {
		t.Fatalf("the server stopped serving %s: %v", when, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != spaceBaseline {
		t.Fatalf("the server serves %d %q %s, want its old config's %q", resp.StatusCode, b, when, spaceBaseline)
	}
}

// stop stops the server with POST /stop, which must answer and end it.
func (lt *loadTarget) stop(t *testing.T) {
	t.Helper()
	if status, reply, ok := lt.admin(http.MethodPost, "/stop", "", ""); !ok || status != http.StatusOK {
		t.Fatalf("POST /stop: %d %s", status, reply)
	}
	if !lt.inst.WaitExit(stepBound) {
		t.Fatalf("caddy did not exit within %v of POST /stop", stepBound)
	}
}

// TestRefusedStoreLoadLeavesCaddyStoppable: a load refused for its store
// (the cases issue 38 found, which panicked go-redis and pgxpool), sent
// twice, leaves a server that serves its old config, answers a load of
// another config and stops on SIGTERM; another on POST /stop.
func TestRefusedStoreLoadLeavesCaddyStoppable(t *testing.T) {
	env := spaceEnv(t)
	for _, c := range configspace.Named() {
		if c.Want != configspace.Refused || c.Place == configspace.Handler {
			continue
		}
		for _, stop := range []string{"SIGTERM", "POST /stop"} {
			t.Run(c.Name()+" then "+stop, func(t *testing.T) {
				lt := newLoadTarget(t)
				// Each step is checked and the next taken all the same, so
				// that a failure shows what it leads to (a load that
				// panicked, then a server that no longer answers).
				for i := range 2 {
					status, reply, ok := lt.admin(http.MethodPost, "/load", "text/caddyfile", c.Caddyfile(env, lt.site()))
					if !ok || status == http.StatusOK {
						t.Errorf("POST /load #%d of %s: answered %v, %d %s; want a refusal", i+1, c.Name(), ok, status, reply)
					} else if err := configspace.Check(c, reply); err != nil {
						t.Error(err)
					}
				}
				if status, reply, ok := lt.admin(http.MethodGet, "/config/", "", ""); !ok || status != http.StatusOK {
					t.Errorf("GET /config/ after refused loads of %s: %v %d %s", c.Name(), ok, status, reply)
				}
				other := configspace.Case{Place: configspace.Handler, Option: "ttl", Value: "1h", Want: configspace.Accepted}
				if status, reply, ok := lt.admin(http.MethodPost, "/load", "text/caddyfile", other.Caddyfile(env, lt.site())); !ok || status != http.StatusOK {
					t.Errorf("POST /load of another config after %s: %v %d %s", c.Name(), ok, status, reply)
				} else {
					checkServes(t, other, lt.inst.URL(), "other")
				}
				if stop == "SIGTERM" {
					if !lt.inst.Terminate(stepBound) {
						t.Fatalf("caddy did not stop within %v of SIGTERM after refused loads of %s", stepBound, c.Name())
					}
					return
				}
				lt.stop(t)
			})
		}
	}
}

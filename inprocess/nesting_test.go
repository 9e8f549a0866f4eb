package inprocess_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/model"
)

// These tests run a real Caddy in this process in front of the model's
// raw upstream (internal/testkit/model), which logs what it received and answers
// as each request's X-Model-Do says.

// modelUpstream starts the model's upstream for the test.
func modelUpstream(t *testing.T) *model.Upstream {
	t.Helper()
	up, err := model.NewUpstream(time.Now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.Close)
	return up
}

// attempt is a request to base with a key (none when ""), a body and a
// Content-Type (none when ""), the upstream told to behave as do.
type attempt struct {
	key, body, ctype, path string
	do                     string
	header                 []string
}

var attemptSeq atomic.Int64

// send sends a, numbered, and returns the answer and the attempt id the
// upstream logs it under.
func (a attempt) send(t *testing.T, base string) (*http.Response, string, string) {
	t.Helper()
	id := fmt.Sprintf("%s-%d", t.Name(), attemptSeq.Add(1))
	path := a.path
	if path == "" {
		path = "/orders/1"
	}
	req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(a.body))
	if a.key != "" {
		req.Header.Set("Idempotency-Key", a.key)
	}
	if a.ctype != "" {
		req.Header.Set("Content-Type", a.ctype)
	}
	req.Header.Set(model.HeaderReq, id)
	req.Header.Set(model.HeaderDo, a.do)
	for i := 0; i+1 < len(a.header); i += 2 {
		req.Header.Set(a.header[i], a.header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, id, err.Error()
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp, id, b.String()
}

// TestObservingNeverSwitchesOffEnforcingInEitherNesting runs every pair of
// nested handlers: the inner handler guards /orders, the outer one the
// whole site. Whichever nests in which, an observing handler changes
// nothing, and the enforcing one enforces: one run per key, the replay,
// 422 for a reused key, 400 for a missing key on a required route.
func TestObservingNeverSwitchesOffEnforcingInEitherNesting(t *testing.T) {
	storages(t, func(t *testing.T, storage string) {
		up := modelUpstream(t)
		for _, pair := range []struct{ outer, inner string }{
			{"observe", "enforce"}, {"enforce", "observe"}, {"enforce", "enforce"}, {"observe", "observe"},
		} {
			t.Run(pair.outer+" around "+pair.inner, func(t *testing.T) {
				base := loadCaddyfile(t, freePort(t), fmt.Sprintf(`
	idempotency {
		mode %s
		%s
	}
	route /orders* {
		idempotency {
			mode %s
			required
			%s
		}
		reverse_proxy %s
	}
	reverse_proxy %s`, pair.outer, storage, pair.inner, storage, up.Addr, up.Addr))
				enforcing := pair.outer == "enforce" || pair.inner == "enforce"
				key := "k-" + strings.ReplaceAll(t.Name(), "/", "-")
				runs := func() int {
					n := 0
					for _, e := range up.Executions() {
						if e.Header.Get("Idempotency-Key") == key {
							n++
						}
					}
					return n
				}
				first, _, _ := attempt{key: key, body: `{"a":1}`, ctype: "application/json"}.send(t, base)
				retry, _, _ := attempt{key: key, body: `{"a":1}`, ctype: "application/json"}.send(t, base)
				other, _, _ := attempt{key: key, body: `{"a":2}`, ctype: "application/json"}.send(t, base)
				if first == nil || retry == nil || other == nil {
					t.Fatal("no answer")
				}
				keyless, _, _ := attempt{body: `{"a":3}`, ctype: "application/json"}.send(t, base)
				if !enforcing {
					if runs() != 3 || first.StatusCode != 201 || retry.StatusCode != 201 || other.StatusCode != 201 {
						t.Fatalf("observing only: %d runs (%d %d %d), want 3 plain answers", runs(), first.StatusCode, retry.StatusCode, other.StatusCode)
					}
					return
				}
				if runs() != 1 {
					t.Errorf("the upstream ran %d times for one key, want once", runs())
				}
				if retry.StatusCode != 201 || retry.Header.Get("Idempotent-Replayed") != "true" {
					t.Errorf("retry: %d %v, want the replay", retry.StatusCode, retry.Header)
				}
				if other.StatusCode != http.StatusUnprocessableEntity {
					t.Errorf("the key reused for another body: %d, want 422", other.StatusCode)
				}
				wantKeyless := 201 // only the inner handler requires a key
				if pair.inner == "enforce" {
					wantKeyless = 400
				}
				if keyless.StatusCode != wantKeyless {
					t.Errorf("a keyless request: %d, want %d", keyless.StatusCode, wantKeyless)
				}
			})
		}
	})
}

// TestARequestThatGoesOnGetsItsWholeBody: when key_json finds no key (no
// member, null, a body that is not JSON) on a route that does not require
// one, and when observe mode meets a request enforce mode would refuse
// (invalid JSON, a malformed key), the request goes on as if the handler
// were absent: the upstream receives exactly the bytes the client sent.
func TestARequestThatGoesOnGetsItsWholeBody(t *testing.T) {
	storages(t, func(t *testing.T, storage string) {
		up := modelUpstream(t)
		for _, c := range []struct {
			name, options string
			a             attempt
		}{
			{"key_json, no member", "key_json /id", attempt{body: `{"amount":10}`, ctype: "application/json"}},
			{"key_json, null", "key_json /id", attempt{body: `{"id":null,"amount":10}`, ctype: "application/json"}},
			{"key_json, not JSON", "key_json /id", attempt{body: `id=7&amount=10`, ctype: "application/x-www-form-urlencoded"}},
			{"key_json, too deep", "key_json /id", attempt{body: strings.Repeat(`[`, 2000) + strings.Repeat(`]`, 2000), ctype: "text/plain"}},
			{"observe, invalid JSON", "mode observe", attempt{key: "obs-1", body: `{"amount":`, ctype: "application/json"}},
			{"observe, malformed key", "mode observe", attempt{key: "has space", body: `{"amount":10}`, ctype: "application/json"}},
			{"observe, no key required", "mode observe\n\t\trequired", attempt{body: `{"amount":10}`, ctype: "application/json"}},
		} {
			t.Run(c.name, func(t *testing.T) {
				base := loadCaddyfile(t, freePort(t), `
	idempotency {
		`+c.options+`
		`+storage+`
	}
	reverse_proxy `+up.Addr)
				resp, id, errText := c.a.send(t, base)
				if resp == nil || resp.StatusCode != 201 {
					t.Fatalf("got %v (%s), want the upstream's 201", resp, errText)
				}
				e := up.Settled(id, 5*time.Second)
				if e == nil || string(e.Body) != c.a.body || e.BodyErr != "" {
					t.Fatalf("the upstream received %v, want the %d bytes the client sent", e, len(c.a.body))
				}
			})
		}
	})
}

// TestAFinalStatusHTTPCannotSendLeavesTheOutcomeUnknown: an upstream
// answering `HTTP/1.1 042 x` (Go's client takes it) ran, and its answer
// cannot be recorded or sent: the client gets a 502, and the key is kept
// as an outcome-unknown record (every retry gets that answer), with the
// store answering every later request (no record it cannot read, no
// panic).
func TestAFinalStatusHTTPCannotSendLeavesTheOutcomeUnknown(t *testing.T) {
	storages(t, func(t *testing.T, storage string) {
		up := modelUpstream(t)
		base := loadCaddyfile(t, freePort(t), `
	idempotency {
		`+storage+`
	}
	reverse_proxy `+up.Addr)
		bad := attempt{key: "status-042", body: `{}`, ctype: "application/json", do: "s=42;n=20"}
		resp, _, errText := bad.send(t, base)
		if resp == nil || resp.StatusCode != http.StatusBadGateway {
			t.Errorf("an upstream answering 042: %v (%s), want 502", resp, errText)
		}
		good := attempt{key: "status-042", body: `{}`, ctype: "application/json", do: "s=201;n=20"}
		for i := range 2 {
			resp, _, body := good.send(t, base)
			wantOutcomeUnknown(t, fmt.Sprintf("request %d after the 042", i+1), resp, body, "")
		}
		if n := len(up.Executions()); n != 1 {
			t.Fatalf("the upstream ran %d times, want 1: the 042 left the outcome unknown", n)
		}
	})
}

package idempotency

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/headers"
)

// evalScope evaluates template for a request with the given headers.
func evalScope(t *testing.T, template string, header map[string]string) (string, bool) {
	t.Helper()
	st, err := newScopeTemplate(template)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("POST", "http://api.example.com/orders", nil)
	for k, v := range header {
		r.Header.Set(k, v)
	}
	repl := caddy.NewReplacer()
	caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), nil)
	return st.evaluate(repl)
}

func TestDefaultScopeIsUnchangedFromPlainSubstitution(t *testing.T) {
	// Records stored by earlier versions keep their scope: for the default
	// template the encoding is the plain substitution.
	for _, auth := range []string{"", "Bearer abc", `Basic a\b c`, "  spaced  out  "} {
		got, _ := evalScope(t, defaultScope, map[string]string{"Authorization": auth})
		repl := caddy.NewReplacer()
		r := httptest.NewRequest("POST", "http://api.example.com/orders", nil)
		r.Header.Set("Authorization", auth)
		caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), nil)
		if want := repl.ReplaceAll(defaultScope, ""); got != want {
			t.Errorf("Authorization %q: scope %q, want %q as before", auth, got, want)
		}
	}
}

func TestScopesAreInjective(t *testing.T) {
	templates := []string{
		"{http.request.header.X-A} {http.request.header.X-B}",
		"{http.request.header.X-A}{http.request.header.X-B}",
		"{http.request.header.X-A}\\x{http.request.header.X-B}",
		"t:{http.request.header.X-A}/{http.request.header.X-B}:{http.request.header.X-C}",
		"{http.request.header.X-A} - {http.request.header.X-B} {http.request.header.X-C}",
	}
	alphabet := []string{"", "a", " ", "\\", "/", ":", "-", "0", "1:", " - "}
	rng := rand.New(rand.NewPCG(1, 2))
	value := func() string {
		var b strings.Builder
		for range rng.IntN(4) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	for _, tmpl := range templates {
		seen := map[string]string{}
		for range 3000 {
			h := map[string]string{"X-A": value(), "X-B": value(), "X-C": value()}
			// Header values lose their outer whitespace on the way in.
			for k, v := range h {
				h[k] = strings.TrimSpace(v)
			}
			tuple := fmt.Sprintf("%q", []string{h["X-A"], h["X-B"], h["X-C"]})
			if !strings.Contains(tmpl, "X-C") {
				tuple = fmt.Sprintf("%q", []string{h["X-A"], h["X-B"]})
			}
			scope, _ := evalScope(t, tmpl, h)
			if prev, ok := seen[scope]; ok && prev != tuple {
				t.Fatalf("template %q: %s and %s give one scope %q", tmpl, prev, tuple, scope)
			}
			seen[scope] = tuple
		}
	}
}

func TestScopeCollisionFromTheIssueIsGone(t *testing.T) {
	tmpl := "{http.request.header.X-Tenant} {http.request.header.X-User}"
	a, _ := evalScope(t, tmpl, map[string]string{"X-Tenant": "acme corp", "X-User": "bob"})
	b, _ := evalScope(t, tmpl, map[string]string{"X-Tenant": "acme", "X-User": "corp bob"})
	if a == b {
		t.Fatalf("(acme corp, bob) and (acme, corp bob) share the scope %q", a)
	}
}

func TestBlankScope(t *testing.T) {
	if _, ok := evalScope(t, "{http.request.header.X-A} {http.request.header.X-B}", nil); ok {
		t.Error("a scope of blank values is not blank")
	}
	if _, ok := evalScope(t, "tenant {http.request.header.X-A}", nil); !ok {
		t.Error("a template with text of its own is blank")
	}
	if _, ok := evalScope(t, "{http.request.header.X-A}{http.request.header.X-B}", map[string]string{"X-B": "x"}); !ok {
		t.Error("a length-prefixed scope with a value is blank")
	}
}

// The scope reads the request's host and headers directly (scope_direct.go):
// the same values as Caddy's replacer gives.
func TestDirectScopeValuesAreTheReplacers(t *testing.T) {
	hosts := []string{"api.example.com", "api.example.com:8443", "[::1]:443", "[::1]", "::1", "127.0.0.1", "127.0.0.1:80", "", "a:b:c", "example.com:", "[fe80::1%25eth0]:443"}
	headers := [][]string{nil, {""}, {"Bearer a"}, {"a", "b"}, {" x ", "", "y,z"}}
	templates := []string{defaultScope, "{http.request.header.x-tenant} {http.request.host}", "{http.request.header.X-TENANT}{http.request.header.authorization}"}
	for _, template := range templates {
		st, err := newScopeTemplate(template)
		if err != nil {
			t.Fatal(err)
		}
		for _, host := range hosts {
			for _, values := range headers {
				r := httptest.NewRequest("POST", "http://placeholder/orders", nil)
				r.Host = host
				for _, name := range []string{"Authorization", "X-Tenant"} {
					for _, v := range values {
						r.Header.Add(name, v)
					}
				}
				repl := caddy.NewReplacer()
				r = caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), nil)
				viaReplacer, okR := st.appendScope(nil, repl, nil)
				direct, okD := st.appendScope(nil, repl, r)
				if string(direct) != string(viaReplacer) || okD != okR {
					t.Errorf("template %q, host %q, values %q: direct %q (%v), replacer %q (%v)", template, host, values, direct, okD, viaReplacer, okR)
				}
			}
		}
	}
}

// The replacer reads the request Caddy bound it to when the request
// arrived; the handler gets the request as the handlers before it passed
// it on. Caddy's tracing, forward_auth (its handle_response routes) and
// handle_errors pass on a shallow copy (r.WithContext), and a
// request_header Host after one of them changes the copy's Host, not the
// bound request's: {http.request.host} is still the client's host, and
// so must the scope be (it separates the clients of a template such as
// "{http.request.host}": tenant-a's key must never replay tenant-b's
// answer).
func TestDirectScopeHostIsTheReplacersAfterARequestCopy(t *testing.T) {
	for _, template := range []string{defaultScope, "{http.request.host}"} {
		st, err := newScopeTemplate(template)
		if err != nil {
			t.Fatal(err)
		}
		for _, host := range []string{"tenant-a.example", "tenant-a.example:8443", "[::1]:443"} {
			r := httptest.NewRequest("POST", "http://placeholder/orders", nil)
			r.Host = host
			r.Header.Set("Authorization", "Bearer a")
			repl := caddy.NewReplacer()
			r = caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), nil)
			// tracing, then request_header Host internal.example
			c := r.WithContext(context.WithValue(r.Context(), detachKey{}, "traced"))
			headers.HeaderOps{Set: http.Header{"Host": {"internal.example"}}}.ApplyToRequest(c)
			viaReplacer, _ := st.appendScope(nil, repl, nil)
			direct, _ := st.appendScope(nil, repl, c)
			if string(direct) != string(viaReplacer) {
				t.Errorf("template %q, host %q: direct scope %q, the replacer's %q", template, host, direct, viaReplacer)
			}
		}
	}
}

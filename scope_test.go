package idempotency

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/headers"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/opterr"
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

// The scope reads the request's host and headers directly (directValue):
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

// A scope's placeholders are those Caddy sets before the handler runs;
// another is a configuration error naming the scope option (issue 38: a
// typo left every keyed request with a blank scope, answered 400
// key-invalid). A misspelt header name is still a header: it is legal,
// and TestBlankScopeIsRejected shows what a request gets.
func TestScopePlaceholdersAreChecked(t *testing.T) {
	for _, tt := range []struct {
		scope string
		want  string // "" when accepted; else a part of the error
	}{
		{defaultScope, ""},
		{"{http.request.header.Authorisation}", ""},
		{"{http.request.host} {http.vars.client_ip} {http.auth.user.id}", ""},
		{"{http.request.remote.host} {http.request.remote.host/24} {http.request.tls.client.fingerprint}", ""},
		{"{http.request.cookie.sid} {http.request.uri.query.tenant} {http.request.host.labels.1} {http.request.uri.path.0}", ""},
		{"{http.regexp.tenant.1} {http.matchers.file.relative} {http.error.status_code}", ""},
		{"{env.TENANT} {file./run/secrets/tenant} {system.hostname} {time.now.year}", ""},
		{"global", ""},
		{"{nosuch.placeholder}", `namespace "nosuch"`},
		{"{host}", "{http.request.host}"},
		{"{http.request.hots}", "did you mean 'host'"},
		{"{http.reqest.host}", "{http.reqest.host} is not a placeholder Caddy sets"},
		{"{http.request.header.Host}", "use {http.request.host}"},
		{"{http.request.header.host}", "use {http.request.host}"},
		{"{http.reverse_proxy.upstream.host}", "once the next handler answered"},
		{"{http.response.status}", "once the next handler answered"},
		{"{http.idempotency.outcome}", "once the next handler answered"},
		{"{system.nosuch}", "not one of Caddy's placeholders"},
		{"{http.request.uri.path.x}", "request placeholders"},
		{"{env.}", "not a placeholder Caddy knows"},
	} {
		_, err := (&Handler{Scope: tt.scope}).compile()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("scope %s: %v, want it accepted", tt.scope, err)
		case tt.want != "" && err == nil:
			t.Errorf("scope %s: accepted, want it refused", tt.scope)
		case err != nil && (!strings.Contains(err.Error(), tt.want) || !slices.Equal(opterr.Options(err), []string{"scope"})):
			t.Errorf("scope %s: %v (options %v), want the scope option's error saying %q", tt.scope, err, opterr.Options(err), tt.want)
		}
	}
}

// replay_header cannot name a header that frames or describes the
// replayed message, and release_on cannot free a key on a success.
func TestReplayHeaderAndReleaseOnRefuseWhatBreaksAReplay(t *testing.T) {
	for _, h := range []Handler{
		{ReplayHeader: "Content-Length"}, {ReplayHeader: "transfer-encoding"}, {ReplayHeader: "Content-Encoding"},
		{ReplayHeader: "Date"}, {ReplayHeader: "Connection"}, {ReplayHeader: "Keep-Alive"}, {ReplayHeader: "Upgrade"},
		{ReleaseOn: []string{"200"}}, {ReleaseOn: []string{"5xx", "2xx"}}, {ReleaseOn: []string{"204"}},
	} {
		_, err := h.compile()
		option := "replay_header"
		if h.ReleaseOn != nil {
			option = "release_on"
		}
		if err == nil || !slices.Equal(opterr.Options(err), []string{option}) {
			t.Errorf("%+v: %v, want %s refused", h, err, option)
		}
	}
	for _, h := range []Handler{{ReplayHeader: "X-Replayed"}, {ReplayHeader: "off"}, {ReleaseOn: []string{"4xx", "5xx"}}} {
		if _, err := h.compile(); err != nil {
			t.Errorf("%+v: %v, want it accepted", h, err)
		}
	}
}

// scopeOfHost is the scope template's value for a request with Host host
// (over TLS when tls), read as the handler reads it.
func scopeOfHost(t *testing.T, template, host string, tls bool) string {
	t.Helper()
	st, err := newScopeTemplate(template)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("POST", "http://placeholder/orders", nil)
	if tls {
		r = httptest.NewRequest("POST", "https://placeholder/orders", nil)
	}
	r.Host = host
	r.Header.Set("Authorization", "Bearer a")
	repl := caddy.NewReplacer()
	r = caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), nil)
	b, _ := st.appendScope(nil, repl, r)
	return string(b)
}

// TestScopeHostsAreComparedAsHTTPComparesThem: a host is case-insensitive,
// an absolute name's trailing dot and the scheme's default port name the
// same site (RFC 9110 4.2.3, RFC 3986 6.2.2 and 6.2.3): "LocalHost",
// "localhost." and "localhost:80" are the scope of "localhost", whether
// the template reads {http.request.host} or {http.request.hostport}. Two
// sites, or two ports that are not the default, never share one.
func TestScopeHostsAreComparedAsHTTPComparesThem(t *testing.T) {
	for _, c := range []struct {
		template string
		tls      bool
		same     []string
		other    []string
	}{
		{defaultScope, false,
			[]string{"localhost", "LOCALHOST", "LocalHost", "localhost.", "LocalHost.:80", "localhost:8080"},
			[]string{"localhost2", "example.com", "localhost.example"}},
		{"{http.request.hostport} {http.request.header.Authorization}", false,
			[]string{"localhost", "LOCALHOST", "localhost.", "localhost:80", "LocalHost.:80", "localhost:", "localhost:080", "LOCALHOST:0080"},
			[]string{"localhost:443", "localhost:8080", "example.com", "localhost:0"}},
		{"{http.request.hostport} {http.request.header.Authorization}", false,
			[]string{"localhost:8080", "localhost:08080", "LocalHost:008080"},
			[]string{"localhost:80", "localhost:808"}},
		{"{http.request.hostport} {http.request.header.Authorization}", true,
			[]string{"localhost", "localhost:443", "LOCALHOST.:443"},
			[]string{"localhost:80", "localhost:8443"}},
		{defaultScope, true,
			[]string{"[::1]", "[::1]:443", "[0:0::1]", "[0:0:0:0:0:0:0:1]:8443"},
			[]string{"[::2]", "127.0.0.1"}},
		{"{http.request.hostport}", true,
			[]string{"[::1]", "[::1]:443", "[0:0::1]:443"},
			[]string{"[::1]:8443", "[::2]"}},
		{"{http.request.hostport}", false,
			[]string{"[::ABCD]:8080", "[::abcd]:8080", "[0::abcd]:8080"},
			[]string{"[::abcd]"}},
	} {
		want := scopeOfHost(t, c.template, c.same[0], c.tls)
		for _, host := range c.same[1:] {
			if got := scopeOfHost(t, c.template, host, c.tls); got != want {
				t.Errorf("%q (tls %v): Host %q has the scope %q, %q has %q", c.template, c.tls, host, got, c.same[0], want)
			}
		}
		for _, host := range c.other {
			if got := scopeOfHost(t, c.template, host, c.tls); got == want {
				t.Errorf("%q (tls %v): Host %q shares the scope %q of %q", c.template, c.tls, host, got, c.same[0])
			}
		}
	}
}

// TestScopesOfFoldedHostsAreUnchanged: a host that is already in the form
// HTTP compares (lower case, no trailing dot, no default port) keeps the
// scope it had before hosts were folded, so that an upgrade leaves every
// record written before it live; and folding it allocates nothing.
func TestScopesOfFoldedHostsAreUnchanged(t *testing.T) {
	for _, c := range []struct{ template, host, scope string }{
		{defaultScope, "api.example.com", "api.example.com Bearer a"},
		{defaultScope, "api.example.com:8443", "api.example.com Bearer a"},
		{defaultScope, "127.0.0.1:8080", "127.0.0.1 Bearer a"},
		{defaultScope, "[::1]:443", "::1 Bearer a"},
		{"{http.request.hostport} {http.request.header.Authorization}", "api.example.com:8443", "api.example.com:8443 Bearer a"},
		{"{http.request.hostport} {http.request.header.Authorization}", "api.example.com", "api.example.com Bearer a"},
		{"{http.request.hostport} {http.request.header.Authorization}", "[::1]:8443", "[::1]:8443 Bearer a"},
	} {
		if got := scopeOfHost(t, c.template, c.host, false); got != c.scope {
			t.Errorf("%q, Host %q: scope %q, want %q as before", c.template, c.host, got, c.scope)
		}
	}
	for _, host := range []string{"api.example.com", "127.0.0.1", "::1"} {
		if n := testing.AllocsPerRun(100, func() { _ = foldHost(host) }); n != 0 {
			t.Errorf("folding %q allocates %v times", host, n)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = foldHostPort("api.example.com:8443", false) }); n != 0 {
		t.Errorf("folding a host and port allocates %v times", n)
	}
}

// TestAdminScopeHashFoldsTheHost: the admin API and caddy idempotency
// hash compute the scope hash of a host given in any spelling as the
// handler does for a request with that Host.
func TestAdminScopeHashFoldsTheHost(t *testing.T) {
	want, err := adminScopeHash("", []string{"api.example.com", "Bearer a"})
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"API.Example.COM", "api.example.com."} {
		if got, _ := adminScopeHash("", []string{host, "Bearer a"}); got != want {
			t.Errorf("host %q: scope hash %s, want %s", host, got, want)
		}
	}
	st, _ := newScopeTemplate(defaultScope)
	r := httptest.NewRequest("POST", "http://placeholder/orders", nil)
	r.Host = "API.example.com:8443"
	r.Header.Set("Authorization", "Bearer a")
	repl := caddy.NewReplacer()
	r = caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), nil)
	if got, _, _ := st.hash(repl, r, ""); got != want {
		t.Errorf("the handler's scope hash %s, the admin API's %s", got, want)
	}
}

// The scope and key hashes that share one allocation are those the
// admin API, the command and the stores compute.
func TestKeyHashesAreTheStoresHashes(t *testing.T) {
	tmpl, err := newScopeTemplate("{http.request.header.X-Tenant}")
	if err != nil {
		t.Fatal(err)
	}
	repl := caddy.NewReplacer()
	repl.Set("http.request.header.X-Tenant", "acme")
	scope, hs, ok := tmpl.hash(repl, nil, "")
	if !ok || scope != hashHex("acme") {
		t.Fatalf("scope hash %q (%v), want %q", scope, ok, hashHex("acme"))
	}
	key := storage.Key{Scope: scope, ID: "order-1"}
	if got := hs.keyHash(key); got != key.Hash() || scope != hashHex("acme") {
		t.Fatalf("key hash %q, want %q (scope %q)", got, key.Hash(), scope)
	}
}

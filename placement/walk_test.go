package placement_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy/fastcgi" // php_fastcgi
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-idempotency/caddy-idempotency" // the idempotency directive
	"github.com/caddy-idempotency/caddy-idempotency/placement"
)

// adapted adapts a Caddyfile and runs the check over its JSON, as it
// reads an HTTP app before Caddy provisions it (every route raw).
func adapted(t *testing.T, caddyfileText string) []placement.Misplaced {
	t.Helper()
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(caddyfile.Format([]byte(caddyfileText)), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapt: %v\n%s", err, caddyfileText)
	}
	return ofJSON(t, js)
}

func ofJSON(t *testing.T, js []byte) []placement.Misplaced {
	t.Helper()
	found, servers, err := placement.MisplacedInJSON(js)
	if err != nil {
		t.Fatal(err)
	}
	if servers == 0 {
		t.Fatalf("no server in %s", js)
	}
	return found
}

// TestMisplacementInAdaptedCaddyfiles runs the check over the JSON the
// Caddyfile adapter writes for each way of putting idempotency after the
// handler that answers (the false negatives of issue 28 among them), and
// for the correct placements next to them.
func TestMisplacementInAdaptedCaddyfiles(t *testing.T) {
	const up = "reverse_proxy 127.0.0.1:9\n"
	const api = "&(api) {\n" + up + "}\n"
	orderLine := func(before string) string {
		return "change the `order` line: `order idempotency before " + before + "`"
	}
	for _, tt := range []struct {
		name, globals, outside, body string
		route, answeredBy, fix       string // "" for a correct config
	}{
		{name: "route with reverse_proxy first", body: "route {\n" + up + "idempotency\n}",
			route: "route", answeredBy: "reverse_proxy", fix: "move `idempotency` before `reverse_proxy` in this route"},
		{name: "route /api/* with respond first", body: "route /api/* {\nrespond 201\nidempotency\n}",
			route: "/api/*", answeredBy: "respond", fix: "move `idempotency` before `respond` in this block (if the block sorts"},
		{name: "order idempotency last", globals: "order idempotency last", body: "idempotency\n" + up,
			route: "the site block", answeredBy: "reverse_proxy", fix: orderLine("reverse_proxy")},
		{name: "order idempotency after reverse_proxy", globals: "order idempotency after reverse_proxy", body: "idempotency\n" + up,
			route: "the site block", answeredBy: "reverse_proxy", fix: orderLine("reverse_proxy")},
		// The common style: handle blocks and a fallback handle. Every
		// request runs one of them, and each answers.
		{name: "order idempotency last, handle blocks and a fallback", globals: "order idempotency last",
			body:  "idempotency\nhandle /api/* {\n" + up + "}\nhandle {\nrespond 404\n}",
			route: "the site block", answeredBy: "reverse_proxy", fix: orderLine("handle")},
		{name: "order idempotency last, in a handle block", globals: "order idempotency last",
			body:  "handle /api/* {\nidempotency\n" + up + "}\nhandle {\nrespond 404\n}",
			route: "handle /api/*", answeredBy: "reverse_proxy", fix: orderLine("reverse_proxy")},
		{name: "order idempotency last, in a handle block before another", globals: "order idempotency last",
			body:  "handle /pay/* {\nidempotency\nreverse_proxy /pay/card 127.0.0.1:9\n}\nhandle {\n" + up + "}",
			route: "handle /pay/*", answeredBy: "reverse_proxy", fix: orderLine("reverse_proxy")},
		{name: "order idempotency last, handle blocks without a fallback", globals: "order idempotency last",
			body:  "idempotency\nhandle /api/* {\n" + up + "}",
			route: "the site block", answeredBy: "reverse_proxy", fix: orderLine("handle")},
		{name: "order idempotency last, php_fastcgi", globals: "order idempotency last",
			body:  "idempotency\nphp_fastcgi 127.0.0.1:9000",
			route: "the site block", answeredBy: "php_fastcgi", fix: orderLine("php_fastcgi")},
		// Named routes: an invoke of one that answers, and one that holds
		// a misplaced idempotency.
		{name: "route with an invoke first", outside: api, body: "route {\ninvoke api\nidempotency\n}",
			route: "route", answeredBy: "reverse_proxy (in &(api))", fix: "move `idempotency` before `invoke api` in this route"},
		{name: "order idempotency last, invoke", globals: "order idempotency last", outside: api, body: "idempotency\ninvoke api",
			route: "the site block", answeredBy: "reverse_proxy (in &(api))", fix: orderLine("invoke")},
		// (A named route of directives without matchers keeps only its
		// first: Caddy's adapter simplifies it so.)
		{name: "in a named route", globals: "order idempotency last", outside: "&(api) {\nidempotency\nreverse_proxy /api/* 127.0.0.1:9\n}\n", body: "invoke api",
			route: "&(api)", answeredBy: "reverse_proxy", fix: "move `idempotency` before `reverse_proxy` in this block (if the block sorts"},
		{name: "a route in a named route", outside: "&(api) {\nroute {\n" + up + "idempotency\n}\n}\n", body: "invoke api",
			route: "&(api)", answeredBy: "reverse_proxy", fix: "move `idempotency` before `reverse_proxy` in this block (if the block sorts"},
		// handle_errors routes.
		{name: "handle_errors, order idempotency last", globals: "order idempotency last",
			body:  "respond 500\nhandle_errors {\nidempotency\n" + up + "}",
			route: "handle_errors", answeredBy: "reverse_proxy", fix: orderLine("reverse_proxy")},
		{name: "a misplaced named route invoked where it cannot run, then where it runs", outside: "&(api) {\nroute {\n" + up + "idempotency\n}\n}\n",
			body:  "handle /maintenance/* {\nroute {\nrespond 503\ninvoke api\n}\n}\nhandle {\ninvoke api\n}",
			route: "&(api)", answeredBy: "reverse_proxy", fix: "move `idempotency` before `reverse_proxy` in this block (if the block sorts"},
		{name: "handle_errors 502, route", body: "respond 500\nhandle_errors 502 {\nroute {\n" + up + "idempotency\n}\n}",
			route: "handle_errors 502 > route", answeredBy: "reverse_proxy", fix: "move `idempotency` before `reverse_proxy` in this route"},
		// Nested blocks.
		{name: "route in a handle", body: "handle /api/* {\nroute {\n" + up + "idempotency\n}\n}",
			route: "/api/* > route", answeredBy: "reverse_proxy", fix: "move `idempotency` before `reverse_proxy` in this route"},
		{name: "route after a handle group that answers", body: "route {\nhandle /api/* {\n" + up + "}\nhandle {\nrespond 404\n}\nidempotency\n" + up + "}",
			route: "route", answeredBy: "reverse_proxy", fix: "move `idempotency` before `handle` in this route"},
		{name: "a handle inside a route after reverse_proxy", body: "route {\n" + up + "handle {\nidempotency\n" + up + "}\n}",
			route: "route > route", answeredBy: "reverse_proxy", fix: "move `idempotency` out of this block, before `reverse_proxy`"},
		{name: "matched idempotency after reverse_proxy", body: "@post method POST\nroute {\n" + up + "idempotency @post\n}",
			route: "route > idempotency method POST", answeredBy: "reverse_proxy", fix: "move `idempotency` before `reverse_proxy` in this route"},

		// reverse_proxy with handle_response writes the upstream's
		// response itself unless a handle_response route goes on.
		{name: "order idempotency last, handle_response that responds", globals: "order idempotency last",
			body:  "idempotency\nreverse_proxy 127.0.0.1:9 {\n@err status 5xx\nhandle_response @err {\nrespond 502\n}\n}",
			route: "the site block", answeredBy: "reverse_proxy", fix: orderLine("reverse_proxy")},
		{name: "route, handle_response with copy_response first", body: "route {\nreverse_proxy 127.0.0.1:9 {\n@err status 5xx\nhandle_response @err {\ncopy_response\n}\n}\nidempotency\n}",
			route: "route", answeredBy: "reverse_proxy", fix: "move `idempotency` before `reverse_proxy` in this route"},

		// Correct placements.
		{name: "the directive's own order", body: "idempotency\n" + up},
		{name: "own order, handle blocks", body: "idempotency\nhandle /api/* {\n" + up + "}\nhandle {\nrespond 404\n}"},
		{name: "own order, in a handle block", body: "handle /api/* {\nidempotency\n" + up + "}\nhandle {\nrespond 404\n}"},
		{name: "order idempotency before reverse_proxy, in a handle block", globals: "order idempotency before reverse_proxy", body: "handle /api/* {\nidempotency\n" + up + "}\nhandle {\nrespond 404\n}"},
		{name: "route, idempotency first", body: "route {\nidempotency\n" + up + "}"},
		{name: "after a matched respond", body: "route {\nrespond /health 200\nidempotency\n" + up + "}"},
		{name: "forward_auth first", body: "forward_auth 127.0.0.1:9 {\nuri /auth\n}\nidempotency\n" + up},
		{name: "file_server pass_thru first", body: "route {\nfile_server {\npass_thru\n}\nidempotency\n" + up + "}"},
		{name: "a group whose matched route passes", body: "route {\nhandle /api/* {\nheader X-API 1\n}\nhandle {\nrespond 404\n}\nidempotency\n" + up + "}"},
		{name: "invoke after idempotency", outside: api, body: "route {\nidempotency\ninvoke api\n}"},
		// A named route runs where another invoke of it is dead: its
		// handler runs (and where it does not, neither does its upstream).
		{name: "a named route invoked where it runs and where it cannot", outside: "&(api) {\nroute {\nidempotency\n" + up + "}\n}\n",
			body: "handle /maintenance/* {\nroute {\nrespond 503\ninvoke api\n}\n}\nhandle {\ninvoke api\n}"},
		{name: "idempotency in a named route, own order", outside: "&(api) {\nidempotency\n" + up + "}\n", body: "invoke api"},
		{name: "handle_errors, own order", body: "respond 500\nhandle_errors {\nidempotency\n" + up + "}"},
		// (An idempotency with nothing after it is the opposite mistake,
		// warned of when it records an empty answer.)
		{name: "handle blocks exclude each other", body: "handle /api/* {\n" + up + "}\nhandle /pay/* {\nidempotency\n}"},
		{name: "handle_errors answering, idempotency in the site", body: "idempotency\n" + up + "handle_errors {\nrespond 502\n}"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cf := "{\n" + tt.globals + "\n}\n" + tt.outside + "http://127.0.0.1:8080 {\n" + tt.body + "\n}\n"
			found := adapted(t, cf)
			if tt.route == "" {
				if len(found) != 0 {
					t.Fatalf("a correct config: %s", found[0].Sentence)
				}
				return
			}
			if len(found) != 1 {
				t.Fatalf("found %d misplaced handlers, want 1: %+v\n%s", len(found), found, cf)
			}
			m := found[0]
			if m.Site != "127.0.0.1:8080" || m.Route != tt.route || m.AnsweredBy != tt.answeredBy || !strings.HasPrefix(m.Fix, tt.fix) {
				t.Fatalf("found\n  site %q, route %q, answered by %q, fix %q\nwant\n  site %q, route %q, answered by %q, fix %q...",
					m.Site, m.Route, m.AnsweredBy, m.Fix, "127.0.0.1:8080", tt.route, tt.answeredBy, tt.fix)
			}
		})
	}
}

// TestPlacementSentence: one sentence in the Caddyfile's terms (site,
// route, what answers) and the fix; no JSON path.
func TestPlacementSentence(t *testing.T) {
	found := adapted(t, "{\norder idempotency last\n}\n:8080 {\nbind 127.0.0.1\nhandle /orders/* {\nidempotency\nreverse_proxy 127.0.0.1:9\n}\n}\n")
	if len(found) != 1 {
		t.Fatalf("found %+v", found)
	}
	want := "an idempotency handler can never run (site :8080, /orders/*): reverse_proxy answers its requests first, " +
		"so every retry reaches the upstream again; fix: move `idempotency` before `reverse_proxy` in this block " +
		"(if the block sorts its directives, as handle does, change the `order` line: `order idempotency before reverse_proxy`)"
	if got := found[0].Sentence; got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// TestRepositoryConfigsAreWellPlaced: the example Caddyfiles and the
// adapt fixtures put idempotency where it runs.
func TestRepositoryConfigsAreWellPlaced(t *testing.T) {
	examples, _ := filepath.Glob("../Caddyfile*.example")
	fixtures, _ := filepath.Glob("../inprocess/testdata/adapt/*.caddyfiletest")
	if len(examples) < 3 || len(fixtures) == 0 {
		t.Fatalf("found %d examples and %d fixtures", len(examples), len(fixtures))
	}
	for _, name := range append(examples, fixtures...) {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		var found []placement.Misplaced
		if _, js, ok := strings.Cut(string(b), "----------"); ok {
			found = ofJSON(t, []byte(js))
		} else {
			found = adapted(t, string(b))
		}
		for _, m := range found {
			t.Errorf("%s: %s", name, m.Sentence)
		}
	}
}

// TestPlacementQuotesNoMatcherValue: a route matched by a header, a query
// or an expression may be matched by a credential (an API key); the
// warning names the matcher and its fields, never their values.
func TestPlacementQuotesNoMatcherValue(t *testing.T) {
	const secret = "s3cretKey123"
	for _, matcher := range []string{
		"header X-Api-Key " + secret,
		"header_regexp X-Api-Key ^" + secret + "$",
		"query token=" + secret,
		"expression `{http.request.header.X-Api-Key} == '" + secret + "'`",
		"not header X-Api-Key " + secret,
	} {
		cf := "http://127.0.0.1:8080 {\n@internal " + matcher + "\nroute @internal {\nreverse_proxy 127.0.0.1:9\nidempotency\n}\n}\n"
		found := adapted(t, cf)
		if len(found) != 1 {
			t.Fatalf("%s: found %+v", matcher, found)
		}
		if s := found[0].Sentence; strings.Contains(s, secret) {
			t.Errorf("%s: the warning quotes the value: %s", matcher, s)
		}
	}
}

package placement

import (
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/fileserver"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/headers"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestMisplacedHandlersAreFound walks provisioned route lists as the
// Caddyfile builds them for the three ways of putting idempotency after the handler that
// answers, and for correct configs.
func TestMisplacedHandlersAreFound(t *testing.T) {
	idem := func() caddyhttp.MiddlewareHandler { return &idemHandler{} }
	proxy := func() caddyhttp.MiddlewareHandler { return &reverseproxy.Handler{} }
	respond := func() caddyhttp.MiddlewareHandler { return &caddyhttp.StaticResponse{} }
	route := func(hs ...caddyhttp.MiddlewareHandler) caddyhttp.Route { return caddyhttp.Route{Handlers: hs} }
	matched := func(hs ...caddyhttp.MiddlewareHandler) caddyhttp.Route {
		return caddyhttp.Route{Handlers: hs, MatcherSets: caddyhttp.MatcherSets{{caddyhttp.MatchPath{"/health"}}}}
	}
	sub := func(routes ...caddyhttp.Route) caddyhttp.MiddlewareHandler {
		return &caddyhttp.Subroute{Routes: routes}
	}
	grouped := func(r caddyhttp.Route) caddyhttp.Route { r.Group = "g"; return r }
	terminalRoute := func(r caddyhttp.Route) caddyhttp.Route { r.Terminal = true; return r }
	forwardAuth := func() caddyhttp.MiddlewareHandler {
		return &reverseproxy.Handler{HandleResponse: []caddyhttp.ResponseHandler{{Routes: caddyhttp.RouteList{{}}}}}
	}
	site := func(routes ...caddyhttp.Route) caddyhttp.RouteList {
		return caddyhttp.RouteList{{
			MatcherSets: caddyhttp.MatcherSets{{caddyhttp.MatchHost{"shop.example"}}},
			Handlers:    []caddyhttp.MiddlewareHandler{sub(routes...)},
			Terminal:    true,
		}}
	}
	header := func() caddyhttp.MiddlewareHandler { return &headers.Handler{} }
	for _, tt := range []struct {
		name       string
		routes     caddyhttp.RouteList
		route      string // of the misplaced handler, "" for none
		answeredBy string
		never      bool // every request reaching it was answered before it
	}{
		{"order idempotency last", site(route(proxy()), route(idem())), "the site block", "reverse_proxy", true},
		{"route { reverse_proxy; idempotency }", site(route(sub(route(proxy()), route(idem())))), "route", "reverse_proxy", true},
		{"one route, proxy first", site(route(proxy(), idem())), "the site block", "reverse_proxy", true},
		{"after a handle block that answers everything", site(route(sub(route(respond()))), route(idem())), "the site block", "respond", true},
		{"correct order", site(route(idem()), route(proxy())), "", "", false},
		{"after a matched respond", site(matched(respond()), route(idem()), route(proxy())), "", "", false},
		{"nested correctly", site(route(sub(route(idem()), route(proxy())))), "", "", false},
		// Handlers that may call the next one, and routes that may not run.
		{"after forward_auth (handle_response)", site(route(forwardAuth(), idem()), route(proxy())), "", "", false},
		{"after file_server pass_thru", site(route(&fileserver.FileServer{PassThru: true}, idem(), proxy())), "", "", false},
		{"after file_server", site(route(&fileserver.FileServer{}, idem(), proxy())), "the site block", "file_server", true},
		{"after a group whose matched route passes", site(grouped(matched(header())), grouped(route(respond())), route(idem()), route(proxy())), "", "", false},
		// Every request runs one route of a group with a fallback: when
		// each answers, nothing reaches what follows the group.
		{"after a group whose every route answers", site(grouped(matched(proxy())), grouped(route(respond())), route(idem()), route(proxy())), "the site block", "reverse_proxy", true},
		{"after the first of a group", site(grouped(route(respond())), grouped(matched(respond())), route(idem())), "the site block", "respond", true},
		{"after a subroute whose fallback is grouped", site(route(sub(grouped(matched(sub())), grouped(route(respond()))), idem(), proxy())), "", "", false},
		// A terminal route's requests end in it (Caddy's emptyHandler),
		// the others are answered by respond: none reaches idempotency.
		{"after a subroute with a terminal matched route", site(route(sub(terminalRoute(matched(sub())), route(respond())), idem(), proxy())), "the site block", "respond", true},
		// With nothing after it, idempotency protects no upstream: one
		// that answers some requests before it took them all.
		{"last, after a matched reverse_proxy", site(matched(proxy()), route(idem())), "the site block", "reverse_proxy", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			found := misplacedIn([]pServer{{name: "srv0", listen: []string{":443"}, routes: readRoutes(tt.routes)}})
			if tt.route == "" {
				if len(found) != 0 {
					t.Fatalf("found %+v in a correct config", found)
				}
				return
			}
			if len(found) != 1 || found[0].route() != tt.route || found[0].answeredBy != tt.answeredBy || found[0].site != "shop.example" || found[0].never != tt.never {
				t.Fatalf("found %+v, want one in %s answered by %s on shop.example", found, tt.route, tt.answeredBy)
			}
		})
	}
}

// idemHandler stands for the idempotency handler, which the check knows
// by its module ID and its strict option alone.
type idemHandler struct{ strict bool }

func (idemHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.idempotency", New: func() caddy.Module { return new(idemHandler) }}
}

func (*idemHandler) ServeHTTP(http.ResponseWriter, *http.Request, caddyhttp.Handler) error {
	return nil
}

func (h *idemHandler) StrictPlacement() bool { return h.strict }

// A handler that can never run refuses the config with or without
// strict; one that the requests reaching an upstream skip only when it is
// strict, and is a warning otherwise. Every one is logged.
func TestNeverIsRefusedAndSkippedOnlyWhenStrict(t *testing.T) {
	never := misplaced{never: true, site: ":8080", answeredBy: "reverse_proxy", fix: "move it"}
	skipped := misplaced{site: ":8080", answeredBy: "reverse_proxy", fix: "move it"}
	strictSkipped := skipped
	strictSkipped.strict = true
	for _, tt := range []struct {
		name    string
		found   []misplaced
		refused bool
	}{
		{"never", []misplaced{never}, true},
		{"skipped", []misplaced{skipped}, false},
		{"skipped, strict", []misplaced{strictSkipped}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			core, logs := observer.New(zap.WarnLevel)
			err := report(zap.New(core), tt.found)
			if (err != nil) != tt.refused {
				t.Fatalf("refused: %v, want %v", err, tt.refused)
			}
			if err != nil && err.Error() != tt.found[0].sentence() {
				t.Fatalf("the refusal says %q, want the warning's sentence", err)
			}
			if logs.Len() != 1 || logs.All()[0].Message != tt.found[0].sentence() {
				t.Fatalf("logged %v, want the sentence once", logs.All())
			}
		})
	}
}

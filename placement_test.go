package idempotency

import (
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/fileserver"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/headers"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// TestMisplacedHandlersAreFound walks provisioned route lists as the
// Caddyfile builds them for the three ways of putting idempotency after the handler that
// answers, and for correct configs.
func TestMisplacedHandlersAreFound(t *testing.T) {
	idem := func() caddyhttp.MiddlewareHandler { return &Handler{} }
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
	}{
		{"order idempotency last", site(route(proxy()), route(idem())), "the site block", "reverse_proxy"},
		{"route { reverse_proxy; idempotency }", site(route(sub(route(proxy()), route(idem())))), "route", "reverse_proxy"},
		{"one route, proxy first", site(route(proxy(), idem())), "the site block", "reverse_proxy"},
		{"after a handle block that answers everything", site(route(sub(route(respond()))), route(idem())), "the site block", "respond"},
		{"correct order", site(route(idem()), route(proxy())), "", ""},
		{"after a matched respond", site(matched(respond()), route(idem()), route(proxy())), "", ""},
		{"nested correctly", site(route(sub(route(idem()), route(proxy())))), "", ""},
		// Handlers that may call the next one, and routes that may not run.
		{"after forward_auth (handle_response)", site(route(forwardAuth(), idem()), route(proxy())), "", ""},
		{"after file_server pass_thru", site(route(&fileserver.FileServer{PassThru: true}, idem(), proxy())), "", ""},
		{"after file_server", site(route(&fileserver.FileServer{}, idem(), proxy())), "the site block", "file_server"},
		{"after a group whose matched route passes", site(grouped(matched(header())), grouped(route(respond())), route(idem()), route(proxy())), "", ""},
		// Every request runs one route of a group with a fallback: when
		// each answers, nothing reaches what follows the group.
		{"after a group whose every route answers", site(grouped(matched(proxy())), grouped(route(respond())), route(idem()), route(proxy())), "the site block", "reverse_proxy"},
		{"after the first of a group", site(grouped(route(respond())), grouped(matched(respond())), route(idem())), "the site block", "respond"},
		{"after a subroute whose fallback is grouped", site(route(sub(grouped(matched(sub())), grouped(route(respond()))), idem(), proxy())), "", ""},
		// A terminal route's requests end in it (Caddy's emptyHandler),
		// the others are answered by respond: none reaches idempotency.
		{"after a subroute with a terminal matched route", site(route(sub(terminalRoute(matched(sub())), route(respond())), idem(), proxy())), "the site block", "respond"},
		// With nothing after it, idempotency protects no upstream: one
		// that answers some requests before it took them all.
		{"last, after a matched reverse_proxy", site(matched(proxy()), route(idem())), "the site block", "reverse_proxy"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			found := misplacedIn([]pServer{{name: "srv0", listen: []string{":443"}, routes: readRoutes(tt.routes)}})
			if tt.route == "" {
				if len(found) != 0 {
					t.Fatalf("found %+v in a correct config", found)
				}
				return
			}
			if len(found) != 1 || found[0].route() != tt.route || found[0].answeredBy != tt.answeredBy || found[0].site != "shop.example" {
				t.Fatalf("found %+v, want one in %s answered by %s on shop.example", found, tt.route, tt.answeredBy)
			}
		})
	}
}

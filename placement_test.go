package idempotency

import (
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/fileserver"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// TestMisplacedHandlersAreFound walks route lists as the Caddyfile builds
// them for the three ways of putting idempotency after the handler that
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
	for _, tt := range []struct {
		name       string
		routes     caddyhttp.RouteList
		path       string // of the misplaced handler, "" for none
		answeredBy string
	}{
		{"order idempotency last", site(route(proxy()), route(idem())), "routes[0].handle[0].routes[1].handle[0]", "reverse_proxy"},
		{"route { reverse_proxy; idempotency }", site(route(sub(route(proxy()), route(idem())))), "routes[0].handle[0].routes[0].handle[0].routes[1].handle[0]", "reverse_proxy"},
		{"one route, proxy first", site(route(proxy(), idem())), "routes[0].handle[0].routes[0].handle[1]", "reverse_proxy"},
		{"after a handle block that answers everything", site(route(sub(route(respond()))), route(idem())), "routes[0].handle[0].routes[1].handle[0]", "static_response"},
		{"correct order", site(route(idem()), route(proxy())), "", ""},
		{"after a matched respond", site(matched(respond()), route(idem()), route(proxy())), "", ""},
		{"nested correctly", site(route(sub(route(idem()), route(proxy())))), "", ""},
		// Handlers that may call the next one, and routes that may not run.
		{"after forward_auth (handle_response)", site(route(forwardAuth(), idem()), route(proxy())), "", ""},
		{"after file_server pass_thru", site(route(&fileserver.FileServer{PassThru: true}, idem(), proxy())), "", ""},
		{"after file_server", site(route(&fileserver.FileServer{}, idem(), proxy())), "routes[0].handle[0].routes[0].handle[1]", "file_server"},
		{"after the fallback of a group", site(grouped(matched(respond())), grouped(route(respond())), route(idem()), route(proxy())), "", ""},
		{"after the first of a group", site(grouped(route(respond())), grouped(matched(respond())), route(idem())), "routes[0].handle[0].routes[2].handle[0]", "static_response"},
		{"after a subroute whose fallback is grouped", site(route(sub(grouped(matched(sub())), grouped(route(respond()))), idem(), proxy())), "", ""},
		// A terminal route's requests end in it (Caddy's emptyHandler),
		// the others are answered by respond: none reaches idempotency.
		{"after a subroute with a terminal matched route", site(route(sub(terminalRoute(matched(sub())), route(respond())), idem(), proxy())), "routes[0].handle[0].routes[0].handle[1]", "static_response"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			found := misplacedHandlers(tt.routes, "routes", nil, "")
			if tt.path == "" {
				if len(found) != 0 {
					t.Fatalf("found %+v in a correct config", found)
				}
				return
			}
			if len(found) != 1 || found[0].path != tt.path || found[0].answeredBy != tt.answeredBy || siteName(found[0].hosts) != "shop.example" {
				t.Fatalf("found %+v, want one at %s answered by %s on shop.example", found, tt.path, tt.answeredBy)
			}
		})
	}
}

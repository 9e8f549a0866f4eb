package placement

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/fileserver"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// The placement check reads the HTTP app while Caddy provisions it (the
// only moment `caddy validate` gives a module): each route's matchers and
// handlers are then either still raw JSON or already provisioned, never
// half of each, so the check reads both into one small tree.

// pServer is a server as the placement check sees it.
type pServer struct {
	name   string
	listen []string
	routes []pRoute
	errors []pRoute
	named  map[string]pRoute
}

// pRoute is a route: what it matches and its handlers in order.
type pRoute struct {
	match    []pMatcherSet
	group    string
	terminal bool
	handlers []pHandler
}

// pMatcherSet is one matcher set: all of its matchers must match.
type pMatcherSet []pMatcher

// pMatcher is one matcher by its module name and JSON value.
type pMatcher struct {
	name  string
	value json.RawMessage
}

// pHandler is a handler: its module name and what the check needs.
type pHandler struct {
	name     string
	routes   []pRoute // a subroute's routes
	hasSub   bool     // a subroute (possibly empty)
	passes   bool     // reverse_proxy with handle_response, file_server pass_thru: answers some requests only
	fastcgi  bool     // reverse_proxy over FastCGI (php_fastcgi)
	invoke   string   // the named route an invoke runs
	isIdem   bool
	strict   bool
	response int // static_response's status code, 0 if none or a placeholder
}

// readServers reads the servers of an HTTP app, in name order.
func readServers(app *caddyhttp.App) []pServer {
	names := make([]string, 0, len(app.Servers))
	for name := range app.Servers {
		names = append(names, name)
	}
	slices.Sort(names)
	out := make([]pServer, 0, len(names))
	for _, name := range names {
		srv := app.Servers[name]
		ps := pServer{name: name, listen: srv.Listen, routes: readRoutes(srv.Routes), named: map[string]pRoute{}}
		if srv.Errors != nil {
			ps.errors = readRoutes(srv.Errors.Routes)
		}
		for n, r := range srv.NamedRoutes {
			if r != nil {
				ps.named[n] = readRoute(r)
			}
		}
		out = append(out, ps)
	}
	return out
}

func readRoutes(routes caddyhttp.RouteList) []pRoute {
	out := make([]pRoute, 0, len(routes))
	for i := range routes {
		out = append(out, readRoute(&routes[i]))
	}
	return out
}

// readRoute reads a route, raw or provisioned.
func readRoute(r *caddyhttp.Route) pRoute {
	out := pRoute{group: r.Group, terminal: r.Terminal}
	if r.MatcherSetsRaw != nil {
		out.match = rawMatcherSets(r.MatcherSetsRaw)
	} else {
		for _, set := range r.MatcherSets {
			var ps pMatcherSet
			for _, m := range set {
				name := "?"
				if mod, ok := m.(caddy.Module); ok {
					name = mod.CaddyModule().ID.Name()
				}
				value, _ := json.Marshal(m)
				ps = append(ps, pMatcher{name: name, value: value})
			}
			out.match = append(out.match, ps)
		}
	}
	if r.HandlersRaw != nil {
		for _, raw := range r.HandlersRaw {
			out.handlers = append(out.handlers, rawHandler(raw))
		}
	} else {
		for _, h := range r.Handlers {
			out.handlers = append(out.handlers, typedHandler(h))
		}
	}
	return out
}

func rawMatcherSets(sets caddyhttp.RawMatcherSets) []pMatcherSet {
	var out []pMatcherSet
	for _, set := range sets {
		names := make([]string, 0, len(set))
		for name := range set {
			names = append(names, name)
		}
		slices.Sort(names)
		var ps pMatcherSet
		for _, name := range names {
			ps = append(ps, pMatcher{name: name, value: set[name]})
		}
		out = append(out, ps)
	}
	return out
}

// rawRoute is a route's JSON.
type rawRoute struct {
	Group    string                   `json:"group"`
	Match    caddyhttp.RawMatcherSets `json:"match"`
	Handle   []json.RawMessage        `json:"handle"`
	Terminal bool                     `json:"terminal"`
}

// rawHandler reads the fields of a handler's JSON that the check needs.
func rawHandler(raw json.RawMessage) pHandler {
	var h struct {
		Handler        string     `json:"handler"`
		Routes         []rawRoute `json:"routes"`
		HandleResponse []struct {
			Routes []rawRoute `json:"routes"`
		} `json:"handle_response"`
		PassThru   bool            `json:"pass_thru"`
		Name       string          `json:"name"`
		Strict     bool            `json:"strict"`
		StatusCode json.RawMessage `json:"status_code"`
		Transport  struct {
			Protocol string `json:"protocol"`
		} `json:"transport"`
	}
	if json.Unmarshal(raw, &h) != nil {
		return pHandler{name: "?"}
	}
	out := pHandler{name: h.Handler}
	switch h.Handler {
	case "subroute":
		out.hasSub = true
		out.routes = rawRoutes(h.Routes)
	case "reverse_proxy":
		for _, rh := range h.HandleResponse {
			out.passes = out.passes || responsePasses(rawRoutes(rh.Routes))
		}
		out.fastcgi = h.Transport.Protocol == "fastcgi"
	case "file_server":
		out.passes = h.PassThru
	case "invoke":
		out.invoke = h.Name
	case idempotencyHandler:
		out.isIdem, out.strict = true, h.Strict
	case "static_response":
		var code caddyhttp.WeakString
		if json.Unmarshal(h.StatusCode, &code) == nil {
			out.response, _ = strconv.Atoi(string(code))
		}
	}
	return out
}

func rawRoutes(routes []rawRoute) []pRoute {
	var out []pRoute
	for _, r := range routes {
		pr := pRoute{group: r.Group, terminal: r.Terminal, match: rawMatcherSets(r.Match)}
		for _, hr := range r.Handle {
			pr.handlers = append(pr.handlers, rawHandler(hr))
		}
		out = append(out, pr)
	}
	return out
}

// responsePasses says whether a handle_response of reverse_proxy may
// call the next handler: its routes run before it (forward_auth copies
// headers and goes on), unless one of them without a matcher answers
// (respond, copy_response). Without routes (a status_code only), it
// writes the upstream's response.
func responsePasses(routes []pRoute) bool {
	for i := range routes {
		if len(routes[i].match) > 0 {
			continue
		}
		for j := range routes[i].handlers {
			if isTerminal(&routes[i].handlers[j]) {
				return false
			}
		}
	}
	return len(routes) > 0
}

// typedHandler reads a provisioned handler.
func typedHandler(h caddyhttp.MiddlewareHandler) pHandler {
	out := pHandler{name: moduleName(h)}
	switch h := h.(type) {
	case *caddyhttp.Subroute:
		out.hasSub = true
		out.routes = readRoutes(h.Routes)
	case *reverseproxy.Handler:
		for _, rh := range h.HandleResponse {
			out.passes = out.passes || responsePasses(readRoutes(rh.Routes))
		}
		if m, ok := h.Transport.(caddy.Module); ok {
			out.fastcgi = m.CaddyModule().ID.Name() == "fastcgi"
		}
	case *fileserver.FileServer:
		out.passes = h.PassThru
	case *caddyhttp.Invoke:
		out.invoke = h.Name
	case *caddyhttp.StaticResponse:
		out.response, _ = strconv.Atoi(string(h.StatusCode))
	}
	if out.name == idempotencyHandler {
		out.isIdem = true
		if s, ok := h.(StrictPlacement); ok {
			out.strict = s.StrictPlacement()
		}
	}
	return out
}

// idempotencyHandler is the name of the idempotency handler's module
// (http.handlers.idempotency), as it is known here: by its ID, not its
// type, which lives in the package that imports this one.
const idempotencyHandler = "idempotency"

// terminalHandlers are the standard handlers that answer a request
// without calling the next handler.
var terminalHandlers = map[string]bool{
	"http.handlers.reverse_proxy":   true,
	"http.handlers.static_response": true,
	"http.handlers.file_server":     true,
	"http.handlers.error":           true,
	"http.handlers.copy_response":   true,
	"http.handlers.acme_server":     true,
}

// moduleName is a handler's name as written in the config
// (reverse_proxy).
func moduleName(h caddyhttp.MiddlewareHandler) string {
	if m, ok := h.(caddy.Module); ok {
		return m.CaddyModule().ID.Name()
	}
	return fmt.Sprintf("%T", h)
}

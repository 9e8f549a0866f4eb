package idempotency

import (
	"fmt"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/fileserver"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(placementCheck{})
}

// placementCheck finds idempotency handlers that can never run before the
// handler that answers their requests: a terminal handler (reverse_proxy,
// respond, file_server, error) earlier in the same route, or in an earlier
// route of the same list that matches every request. Such a handler is
// silent (every retry reaches the upstream again), so it is the worst
// mistake a configuration can make with this module: `order idempotency
// last`, `order idempotency after reverse_proxy`, or `route {
// reverse_proxy ...; idempotency }`.
//
// It is an app that every idempotency handler loads: apps start after
// every app is provisioned, which is the first moment the HTTP app's
// routes can be walked. It logs an error per misplaced handler at start
// and on every reload, and refuses the config when such a handler has
// strict set.
type placementCheck struct {
	ctx    caddy.Context
	logger *zap.Logger
}

// placementApp is the app's ID.
const placementApp = "idempotency"

// joinPlacementCheck loads the app into the config being provisioned (if
// it is not there yet), so that it starts with the config. A context
// made without a config (caddy.NewContext, as tools and unit tests make
// one) has no apps to join: Caddy's Context.App panics on it, and there
// is nothing to check.
func joinPlacementCheck(ctx caddy.Context) (err error) {
	defer func() {
		if recover() != nil {
			err = nil
		}
	}()
	_, err = ctx.App(placementApp)
	return err
}

// CaddyModule returns the Caddy module information.
func (placementCheck) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  placementApp,
		New: func() caddy.Module { return new(placementCheck) },
	}
}

// Provision keeps the config's context, to find its HTTP app at start.
func (p *placementCheck) Provision(ctx caddy.Context) error {
	p.ctx, p.logger = ctx, ctx.Logger()
	return nil
}

// Start looks for misplaced handlers once the HTTP app is provisioned.
func (p *placementCheck) Start() error {
	app, err := p.ctx.AppIfConfigured("http")
	if err != nil {
		return nil // no HTTP app, no handler of ours
	}
	http, ok := app.(*caddyhttp.App)
	if !ok {
		return nil
	}
	var refuse []string
	names := make([]string, 0, len(http.Servers))
	for name := range http.Servers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for _, m := range misplacedHandlers(http.Servers[name].Routes, "routes", nil, "") {
			where := fmt.Sprintf("server %s, site %s, %s", name, siteName(m.hosts), m.path)
			p.logger.Error("an idempotency handler can never run: a handler before it in its route answers first, so every retry reaches it again; "+
				"order idempotency before the handler that answers (see docs/caddyfile.md, Directive order and route)",
				zap.String("server", name), zap.Strings("site", m.hosts), zap.String("route", m.path), zap.String("answered_by", m.answeredBy))
			if m.handler.Strict {
				refuse = append(refuse, where+" (answered by "+m.answeredBy+")")
			}
		}
	}
	if len(refuse) > 0 {
		return fmt.Errorf("strict: idempotency handlers that can never run: %s", strings.Join(refuse, "; "))
	}
	return nil
}

// Stop implements caddy.App.
func (*placementCheck) Stop() error { return nil }

// misplaced is an idempotency handler that can never run.
type misplaced struct {
	handler    *Handler
	hosts      []string // the site: the host matchers on the way to it
	path       string   // where in the config: routes[0].handle[0].routes[2].handle[0]
	answeredBy string   // the module that answers before it
}

// misplacedHandlers walks a route list. answeredBy names a terminal
// handler before the list that every request reaching it meets first
// ("" for none).
func misplacedHandlers(routes caddyhttp.RouteList, path string, hosts []string, answeredBy string) []misplaced {
	var out []misplaced
	groups := map[string]bool{}
	for i, rt := range routes {
		routeHosts := append(slices.Clip(hosts), hostsOf(rt.MatcherSets)...)
		before := answeredBy // what answers ahead of this route's handlers
		for j, h := range rt.Handlers {
			at := fmt.Sprintf("%s[%d].handle[%d]", path, i, j)
			switch h := h.(type) {
			case *Handler:
				if before != "" {
					out = append(out, misplaced{handler: h, hosts: routeHosts, path: at, answeredBy: before})
				}
			case *caddyhttp.Subroute:
				out = append(out, misplacedHandlers(h.Routes, at+".routes", routeHosts, before)...)
				if before == "" {
					before = answersAll(h.Routes)
				}
			default:
				if before == "" && terminal(h) {
					before = moduleName(h)
				}
			}
		}
		// A route that matches every request and answers it hides the
		// routes after it in the list, unless it is in a group an earlier
		// route of the list belongs to: that one may run instead.
		if answeredBy == "" && len(rt.MatcherSets) == 0 && !groups[rt.Group] && before != "" {
			answeredBy = before
		}
		if rt.Group != "" {
			groups[rt.Group] = true
		}
	}
	return out
}

// answersAll names the terminal handler that answers every request a
// route list gets, "" when some request may pass through it.
func answersAll(routes caddyhttp.RouteList) string {
	groups := map[string]bool{}
	for _, rt := range routes {
		skippable := groups[rt.Group] // an earlier route of its group may run instead
		if rt.Group != "" {
			groups[rt.Group] = true
		}
		if len(rt.MatcherSets) > 0 {
			// Its requests may be answered, or (terminal) end, in it;
			// either way none of them reaches the next handler through it.
			continue
		}
		if skippable {
			continue
		}
		for _, h := range rt.Handlers {
			if sub, ok := h.(*caddyhttp.Subroute); ok {
				if name := answersAll(sub.Routes); name != "" {
					return name
				}
				continue
			}
			if terminal(h) {
				return moduleName(h)
			}
		}
	}
	return ""
}

// terminalHandlers are the standard handlers that answer a request
// without calling the next handler.
var terminalHandlers = map[string]bool{
	"http.handlers.reverse_proxy":   true,
	"http.handlers.static_response": true,
	"http.handlers.file_server":     true,
	"http.handlers.error":           true,
	"http.handlers.copy_response":   true,
}

func terminal(h caddyhttp.MiddlewareHandler) bool {
	switch h := h.(type) {
	case *reverseproxy.Handler:
		// handle_response routes may call the next handler (forward_auth
		// does for a 2xx answer).
		if len(h.HandleResponse) > 0 {
			return false
		}
	case *fileserver.FileServer:
		if h.PassThru {
			return false // a file not found goes on to the next handler
		}
	}
	m, ok := h.(caddy.Module)
	return ok && terminalHandlers[string(m.CaddyModule().ID)]
}

// moduleName is a handler's name as written in the config
// (reverse_proxy).
func moduleName(h caddyhttp.MiddlewareHandler) string {
	if m, ok := h.(caddy.Module); ok {
		return m.CaddyModule().ID.Name()
	}
	return fmt.Sprintf("%T", h)
}

// hostsOf lists the hosts of the host matchers of sets.
func hostsOf(sets caddyhttp.MatcherSets) []string {
	var hosts []string
	for _, set := range sets {
		for _, m := range set {
			switch m := m.(type) {
			case caddyhttp.MatchHost:
				hosts = append(hosts, m...)
			case *caddyhttp.MatchHost:
				hosts = append(hosts, *m...)
			}
		}
	}
	return hosts
}

// siteName is how a log line names the site of hosts.
func siteName(hosts []string) string {
	if len(hosts) == 0 {
		return "(every host)"
	}
	return strings.Join(hosts, ", ")
}

// Interface guards
var (
	_ caddy.App         = (*placementCheck)(nil)
	_ caddy.Provisioner = (*placementCheck)(nil)
)

package placement

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// misplaced is an idempotency handler that can never run for some of the
// requests it is meant for: a handler reached before it answers them.
type misplaced struct {
	// never: every request that reaches it was answered before it
	// (otherwise some were, and nothing after it answers the rest).
	never      bool
	strict     bool
	server     string
	site       string   // the site as the Caddyfile writes it: api.example.com, 127.0.0.1:8080, :8080
	blocks     []string // the blocks on the way to it: handle /api/*, route, &(api), handle_errors
	answeredBy string   // what answers first: reverse_proxy, respond, reverse_proxy (in &(api))
	fix        string
}

// route names the route: its blocks, or the site block.
func (m misplaced) route() string {
	if len(m.blocks) == 0 {
		return "the site block"
	}
	return strings.Join(m.blocks, " > ")
}

// misplacedLog starts the sentence about a handler that can never run.
const misplacedLog = "an idempotency handler can never run"

// sentence says what is wrong and how to fix it, in the Caddyfile's terms.
func (m misplaced) sentence() string {
	if m.never {
		return fmt.Sprintf("%s (site %s, %s): %s answers its requests first, so every retry reaches the upstream again; fix: %s",
			misplacedLog, m.site, m.route(), m.answeredBy, m.fix)
	}
	return fmt.Sprintf("an idempotency handler protects no upstream (site %s, %s): %s answers the requests that reach an upstream before it, "+
		"and nothing after it answers the others, so every retry reaches the upstream again; fix: %s",
		m.site, m.route(), m.answeredBy, m.fix)
}

// answeredAt is a handler that answers requests before a point of a route list.
type answeredAt struct {
	by    string // what answers: reverse_proxy, reverse_proxy (in &(api))
	elem  string // the directive of the list's element holding it, as the fix names it
	depth int    // the depth of the list holding elem
}

// walkCtx is what a route list inherits from where it is.
type walkCtx struct {
	server, site string
	blocks       []string
	depth        int
	sorted       bool       // its directives were sorted by the Caddyfile's order (site block, handle, named route)
	wrappers     bool       // its terminal routes wrap a site block (server and error routes)
	errors       bool       // the site block of handle_errors: its route blocks are handle_errors blocks
	lone         bool       // a route block, a lone handle block or a named route: the JSON does not say which
	all, some    answeredAt // answers every, or some, request reaching it
	after        bool       // a handler after it may answer its requests
}

// at is the context of route r of a list in c: a host matcher of a route
// that wraps a site block names the site.
func (c walkCtx) at(r *pRoute) walkCtx {
	if hosts := matcherHosts(r.match); len(hosts) > 0 && c.wrappers {
		c.site = hostSite(hosts, c.site)
	}
	return c
}

// walker walks the route lists of one server.
type walker struct {
	srv      *pServer
	found    []misplaced
	invoked  map[string]bool // named routes walked through an invoke
	invoking []string        // the invokes being walked (a named route may invoke another)
	quiet    int             // >0 while walking a named route again: its handlers were reported once
}

// misplacedIn finds the misplaced idempotency handlers of servers.
func misplacedIn(servers []pServer) []misplaced {
	var out []misplaced
	for i := range servers {
		w := &walker{srv: &servers[i], invoked: map[string]bool{}}
		c := walkCtx{server: servers[i].name, site: listenSite(servers[i].listen), sorted: true, wrappers: true}
		w.list(servers[i].routes, c)
		ec := c
		ec.errors, ec.blocks = true, []string{"handle_errors"}
		w.list(servers[i].errors, ec)
		// Named routes no invoke reached still get their own check.
		names := make([]string, 0, len(servers[i].named))
		for name := range servers[i].named {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			if !w.invoked[name] {
				w.named(name, walkCtx{server: c.server, site: c.site, sorted: true})
			}
		}
		out = append(out, w.found...)
	}
	return out
}

// list walks a route list and returns what answers every, and some,
// request reaching its end. Route by route: which routes of a handle
// group run at all (groups), what the route's handlers answer (route),
// and what that leaves answered for the routes after it.
func (w *walker) list(routes []pRoute, c walkCtx) (all, some answeredAt) {
	all, some = c.all, c.some
	g := groups{done: map[string]bool{}, broken: map[string]bool{}, first: map[string]answeredAt{}, start: map[string]answeredAt{}}
	for i := range routes {
		r := &routes[i]
		if g.skips(r) {
			continue
		}
		rAll, rSome := w.route(routes, i, c, all, g.enter(r, some))
		// What this route does to the requests after it in the list: the
		// nearest handler that answers some of them is the one to name.
		some = firstOf(rSome, some)
		all = g.leave(r, rAll, all)
	}
	return all, some
}

// groups is what a route list learns of its handle groups as it is
// walked: a request runs at most one route of a group, the first that
// matches.
type groups struct {
	done   map[string]bool       // groups whose fallback was passed: their later routes never run
	broken map[string]bool       // groups with a matched route that lets requests through
	first  map[string]answeredAt // each group's first answer
	start  map[string]answeredAt // what answered some requests before each group
}

// skips says whether r can never run: a route of a group after its
// fallback.
func (g *groups) skips(r *pRoute) bool { return r.group != "" && g.done[r.group] }

// enter returns what answered some requests before r. The routes of a
// group exclude each other, so for each of them it is what answered
// before the group.
func (g *groups) enter(r *pRoute, some answeredAt) answeredAt {
	if r.group == "" {
		return some
	}
	if s, ok := g.start[r.group]; ok {
		return s
	}
	g.start[r.group] = some
	return some
}

// leave returns what answers every request after r, given what r's
// handlers answer (rAll) and what answered every request before it
// (all): a route without matchers that answers takes them all, and so
// does a group whose every route answers, once its fallback is passed.
func (g *groups) leave(r *pRoute, rAll, all answeredAt) answeredAt {
	matched := len(r.match) > 0
	switch {
	case r.group != "" && matched:
		if rAll.by == "" {
			g.broken[r.group] = true
		} else if _, ok := g.first[r.group]; !ok {
			g.first[r.group] = rAll
		}
	case r.group != "":
		g.done[r.group] = true
		if a, ok := g.first[r.group]; ok {
			rAll = a
		}
		if !g.broken[r.group] && rAll.by != "" && all.by == "" {
			return rAll
		}
	case !matched && rAll.by != "" && all.by == "":
		return rAll
	}
	return all
}

// route walks the handlers of routes[i] (reached with all and someIn
// answered before it) and returns what answers every, and some, request
// that runs it.
func (w *walker) route(routes []pRoute, i int, c walkCtx, all, someIn answeredAt) (rAll, rSome answeredAt) {
	r := &routes[i]
	rc := c.at(r)
	for j := range r.handlers {
		h := &r.handlers[j]
		before := walkCtx{all: firstOf(all, rAll), some: firstOf(someIn, rSome)}
		if h.isIdem || h.hasSub || h.invoke != "" {
			before.after = mayAnswerAfter(routes, i, j, c.after)
		}
		switch {
		case h.isIdem:
			w.check(h, r, rc, c, before)
		case h.hasSub:
			sAll, sSome := w.subroute(h, r, rc, c, before)
			rAll, rSome = firstOf(rAll, sAll), firstOf(rSome, sSome)
		case h.invoke != "":
			nAll, nSome := w.invoke(h, rc, c, before)
			rAll, rSome = firstOf(rAll, nAll), firstOf(rSome, nSome)
		case isTerminal(h):
			if rAll.by == "" {
				rAll = answeredAt{by: directive(h, r), elem: directive(h, r), depth: c.depth}
			}
			if rSome.by == "" {
				rSome = rAll
			}
		}
	}
	return rAll, rSome
}

// check reports the idempotency handler h of route r when what answered
// before it (before.all, before.some) leaves it nothing to protect.
func (w *walker) check(h *pHandler, r *pRoute, rc, c walkCtx, before walkCtx) {
	if w.quiet > 0 {
		return
	}
	blocks := rc.blocks
	if m := describeMatch(r.match); m != "" && !(c.wrappers && r.terminal) {
		blocks = append(slices.Clip(blocks), "idempotency "+m)
	}
	switch {
	case before.all.by != "":
		w.report(h, rc, blocks, before.all, true)
	case before.some.by != "" && !before.after:
		w.report(h, rc, blocks, before.some, false)
	}
}

// subroute walks the block that handler h of route r holds (a route or
// handle block, a site block, a handle_errors block), and returns what
// answers in it as the list holding it sees that: at h.
func (w *walker) subroute(h *pHandler, r *pRoute, rc, c walkCtx, before walkCtx) (all, some answeredAt) {
	sc := rc
	sc.depth = c.depth + 1
	sc.all, sc.some, sc.after = before.all, before.some, before.after
	sc.wrappers, sc.errors, sc.lone = false, false, false
	switch {
	case c.wrappers && r.terminal:
		sc.sorted = true // a site block
		sc.errors = c.errors
	case c.errors:
		sc.sorted = true // a handle_errors block, in the site block of them all
		if m := describeMatch(r.match); m != "" {
			sc.blocks = []string{"handle_errors " + m}
		}
	case r.group != "":
		sc.sorted = true
		sc.blocks = append(slices.Clip(rc.blocks), strings.TrimSpace("handle "+describeMatch(r.match)))
	default:
		// A route block, or a lone handle block (only handle
		// blocks with siblings are grouped): one keeps the
		// written order, the other sorts.
		sc.sorted = false
		sc.blocks = append(slices.Clip(rc.blocks), cmp.Or(describeMatch(r.match), "route"))
		sc.lone = describeMatch(r.match) != ""
	}
	subAll, subSome := w.list(h.routes, sc)
	elem := directive(h, r)
	return inBlock(subAll, subAll.by, elem, c.depth), inBlock(subSome, subSome.by, elem, c.depth)
}

// invoke walks the named route an invoke runs, and returns what answers
// in it as the list holding the invoke sees that.
func (w *walker) invoke(h *pHandler, rc, c walkCtx, before walkCtx) (all, some answeredAt) {
	nc := walkCtx{server: c.server, site: rc.site, depth: c.depth + 1, all: before.all, some: before.some, after: before.after}
	nAll, nSome := w.named(h.invoke, nc)
	elem := "invoke " + h.invoke
	in := " (in &(" + h.invoke + "))"
	return inBlock(nAll, nAll.by+in, elem, c.depth), inBlock(nSome, nSome.by+in, elem, c.depth)
}

// inBlock is a, a handler that answers inside a block, as the list at
// depth that holds the block (its element elem) sees it: by, at elem.
// None when a answered before the block.
func inBlock(a answeredAt, by, elem string, depth int) answeredAt {
	if a.by == "" || a.depth <= depth {
		return answeredAt{}
	}
	return answeredAt{by: by, elem: elem, depth: depth}
}

// named walks a named route, as an invoke runs it.
func (w *walker) named(name string, c walkCtx) (all, some answeredAt) {
	r, ok := w.srv.named[name]
	if !ok || slices.Contains(w.invoking, name) {
		return answeredAt{}, answeredAt{}
	}
	if w.invoked[name] {
		w.quiet++
		defer func() { w.quiet-- }()
	}
	w.invoked[name] = true
	w.invoking = append(w.invoking, name)
	defer func() { w.invoking = w.invoking[:len(w.invoking)-1] }()
	c.blocks = append(slices.Clip(c.blocks), "&("+name+")")
	c.sorted, c.wrappers = true, false
	if c.all.by != "" {
		// An invoke that never runs (answered before it): neither does
		// the upstream after it, and another invoke may run the route.
		// Its handlers are checked as the route holds them.
		c.all, c.some = answeredAt{}, answeredAt{}
	}
	// The named route is the list of its one route; its subroute (more
	// than one directive) is sorted too.
	if len(r.handlers) == 1 && r.handlers[0].hasSub && len(r.match) == 0 {
		// Its directives, or its one route block (the adapter keeps the
		// only handler of a named route of one route).
		c.depth++
		c.sorted, c.lone = false, true
		return w.list(r.handlers[0].routes, c)
	}
	return w.list([]pRoute{r}, c)
}

// report records a misplaced handler and the fix.
func (w *walker) report(h *pHandler, c walkCtx, blocks []string, a answeredAt, never bool) {
	m := misplaced{never: never, strict: h.strict, server: c.server, site: c.site, blocks: blocks, answeredBy: a.by}
	switch {
	case a.depth < c.depth:
		// Answered in an enclosing block, before the one holding it.
		m.fix = fmt.Sprintf("move `idempotency` out of this block, before `%s`", a.elem)
	case c.sorted:
		// A lone handle block reads as a route block; handle sorts first.
		before := cmp.Or(map[string]string{"route": "handle"}[firstWord(a.elem)], firstWord(a.elem))
		m.fix = fmt.Sprintf("change the `order` line: `order idempotency before %s` (or remove it: the directive's own order puts idempotency right after encode)", before)
	case c.lone:
		m.fix = fmt.Sprintf("move `idempotency` before `%s` in this block (if the block sorts its directives, as handle does, change the `order` line: `order idempotency before %s`)", a.elem, firstWord(a.elem))
	default:
		m.fix = fmt.Sprintf("move `idempotency` before `%s` in this route", a.elem)
	}
	w.found = append(w.found, m)
}

func firstOf(a, b answeredAt) answeredAt {
	if a.by != "" {
		return a
	}
	return b
}

func firstWord(s string) string {
	if i := strings.IndexByte(s, ' '); i > 0 {
		return s[:i]
	}
	return s
}

// isTerminal says whether a handler answers every request it gets
// without calling the next handler.
func isTerminal(h *pHandler) bool {
	if h.passes {
		return false
	}
	return terminalHandlers["http.handlers."+h.name]
}

// mayAnswerAfter says whether a handler after routes[i].handlers[j]
// may answer a request that reaches it.
func mayAnswerAfter(routes []pRoute, i, j int, after bool) bool {
	if after {
		return true
	}
	for _, h := range routes[i].handlers[j+1:] {
		if mayAnswer(&h) {
			return true
		}
	}
	for _, r := range routes[i+1:] {
		if r.group != "" && r.group == routes[i].group {
			continue // a request that ran routes[i] runs no other route of its group
		}
		for _, h := range r.handlers {
			if mayAnswer(&h) {
				return true
			}
		}
	}
	return false
}

// passingHandlers are the standard handlers that always call the next
// one (or fail): nothing after idempotency of these only ever answers.
var passingHandlers = map[string]bool{
	"idempotency": true, "headers": true, "rewrite": true, "vars": true, "encode": true,
	"request_body": true, "map": true, "templates": true, "push": true, "log_append": true,
	"tracing": true, "authentication": true, "intercept": true, "copy_response_headers": true,
}

func mayAnswer(h *pHandler) bool {
	switch {
	case h.hasSub:
		for _, r := range h.routes {
			for _, sh := range r.handlers {
				if mayAnswer(&sh) {
					return true
				}
			}
		}
		return false
	case h.invoke != "":
		return true
	}
	return !passingHandlers[h.name]
}

// directive is the Caddyfile directive of a handler in route r.
func directive(h *pHandler, r *pRoute) string {
	switch {
	case h.hasSub && r.group != "":
		return "handle"
	case h.hasSub:
		return "route"
	case h.invoke != "":
		return "invoke " + h.invoke
	case h.fastcgi:
		return "php_fastcgi"
	case h.name == "static_response" && h.response >= 300 && h.response < 400:
		return "redir"
	case h.name == "static_response":
		return "respond"
	}
	return h.name
}

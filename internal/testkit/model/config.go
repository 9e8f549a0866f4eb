package model

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Limits of the contract (docs/caddyfile.md): a configured value outside
// them must make loading fail with an error naming the option.
const (
	minTTL         = time.Second
	maxTTL         = 3650 * 24 * time.Hour
	minLockTimeout = time.Second
	maxLockTimeout = 24 * time.Hour
	minWaitTimeout = 10 * time.Millisecond
	maxWaitTimeout = time.Hour
)

// Defaults of the contract, as the oracle applies them.
const (
	defaultTTL         = 24 * time.Hour
	defaultLockTimeout = 30 * time.Second
	defaultWaitTimeout = 10 * time.Second
	defaultMaxKeyLen   = 255
	defaultMaxBody     = 1 << 20
	defaultMaxResponse = 1 << 20
)

// defaultReleaseOn is the contract's default release_on: 5xx and the
// answers that say nothing was done.
var defaultReleaseOn = []string{"5xx", "401", "403", "407", "408", "429"}

// Policy is one idempotency handler's configuration as the oracle reads
// it. Zero values are the defaults.
type Policy struct {
	Observe bool
	// Match limits the handler to paths with this prefix ("" all).
	Match string

	TTL, LockTimeout time.Duration
	WaitTimeout      time.Duration
	Methods          []string
	Header           string
	Required         bool
	TenantScope      bool // scope {http.request.header.X-Tenant}
	HostPortScope    bool // scope {http.request.hostport} {http.request.header.Authorization} (version 3)
	MaxKeyLength     int
	MaxBodySize      int64
	MaxResponseSize  int64
	FPHeaders        []string
	NotCanonical     bool
	Ignore           []string
	ReleaseOn        []string
	// OnUnknownOutcome is on_unknown_outcome: "" (the default, keep),
	// "keep" or "release" (version 3).
	OnUnknownOutcome string
	InFlight         string // in_flight: wait, reject, or "" (the default, wait)
	FailOpen         bool
	ReplayHeader     string // "off" turns it off
	KeyJSON          string
	HandleErrors     bool
	DocsURL          string

	// How durations are written: as nanosecond integers instead of
	// strings (a JSON mix-up when the value is small).
	NanoDurations bool
}

// Store is the storage of a trial, shared by its handlers.
type Store struct {
	Kind            string // memory, redis, postgres
	MaxKeys         int    // memory: unique per trial, so that the store is fresh
	MaxKeysPerScope int    // memory
	URL             string // redis
	Prefix          string // redis
	DSN             string // postgres
	Table           string // postgres
	Timeout         time.Duration
	ReplayCache     bool
	MaxConns        int // postgres: the pool's size (0: the default)
	// Via is where the handlers of path b (requests with X-Model-Path: b)
	// reach the store: the URL or DSN of a second route to the same
	// server, as another Caddy instance would have ("" when the store is
	// in process). Path a uses URL or DSN.
	Via string
	// FillKeys, when not zero, adds the fill site (requests with
	// X-Model-Site: fill): an idempotency handler of default options on a
	// memory store of FillKeys records of its own (and FillBytes bytes,
	// unique per run, so that each run's store is a fresh one).
	FillKeys  int
	FillBytes int64
}

// Layout is how the handlers sit in the route.
type Layout struct {
	// Handlers, outermost first: one, or two nested (the inner one under
	// a path matcher).
	Handlers []Policy
	// OuterHeaders: a header handler outside idempotency that sets a
	// header on every answer and rewrites Location (deferred, in place).
	OuterHeaders bool
	// Encode: encode gzip outside idempotency.
	Encode bool
	// InnerDeleteServer: a deferred header handler inside idempotency
	// that deletes the Server header the upstream sends.
	InnerDeleteServer bool
}

// Config is a trial's whole configuration, and what the contract says of
// it: Invalid names the option that makes it invalid ("" when valid).
type Config struct {
	Store   Store
	Layout  Layout
	Invalid string
	// Mutation is the invalid value, for the report.
	Mutation string
	// Failures (version 3) puts the proxies that fail before the
	// upstream's status in front of it: attempts whose Behaviour.Fail
	// asks take them (see tail). RefuseAddr is the address that refuses
	// connections, set where the trial runs (Env.route).
	Failures   bool
	RefuseAddr string
	// Raw replaces one handler field's JSON (the invalid mutation).
	rawField map[string]any
	rawStore map[string]any
}

// effective returns p with the defaults filled in.
func (p Policy) effective() Policy {
	p.InFlight = cmp.Or(p.InFlight, "wait")
	p.TTL = cmp.Or(p.TTL, defaultTTL)
	p.LockTimeout = cmp.Or(p.LockTimeout, defaultLockTimeout)
	p.WaitTimeout = cmp.Or(p.WaitTimeout, defaultWaitTimeout)
	p.Header = cmp.Or(p.Header, "Idempotency-Key")
	p.MaxKeyLength = cmp.Or(p.MaxKeyLength, defaultMaxKeyLen)
	p.MaxBodySize = cmp.Or(p.MaxBodySize, defaultMaxBody)
	p.MaxResponseSize = cmp.Or(p.MaxResponseSize, defaultMaxResponse)
	p.ReplayHeader = cmp.Or(p.ReplayHeader, "Idempotent-Replayed")
	if len(p.Methods) == 0 {
		p.Methods = []string{"POST", "PATCH"}
	}
	if len(p.FPHeaders) == 0 {
		p.FPHeaders = []string{"Content-Type"}
	}
	if len(p.ReleaseOn) == 0 {
		p.ReleaseOn = defaultReleaseOn
	}
	return p
}

// releases reports whether status frees the key under p (effective).
func (p Policy) releases(status int) bool {
	for _, spec := range p.ReleaseOn {
		if len(spec) == 3 && strings.HasSuffix(strings.ToLower(spec), "xx") {
			if int(spec[0]-'0') == status/100 {
				return true
			}
			continue
		}
		if spec == fmt.Sprint(status) {
			return true
		}
	}
	return false
}

// releasesUnknown reports whether p frees the key of a request whose
// outcome is unknown (on_unknown_outcome release).
func (p Policy) releasesUnknown() bool { return p.OnUnknownOutcome == "release" }

func (p Policy) covers(method string) bool {
	for _, m := range p.Methods {
		if strings.EqualFold(m, method) {
			return true
		}
	}
	return false
}

func (p Policy) matches(path string) bool { return p.Match == "" || strings.HasPrefix(path, p.Match) }

func (p Policy) duration(d time.Duration) any {
	if p.NanoDurations {
		return int64(d)
	}
	return durationString(d)
}

// durationString writes d as Caddy parses it, in days when it is whole
// days.
func durationString(d time.Duration) string {
	if d >= 24*time.Hour && d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	return d.String()
}

// handlerJSON is the handler's JSON object, on the store as path (a or b)
// reaches it.
func (c *Config) handlerJSON(i int, path string) map[string]any {
	p := c.Layout.Handlers[i]
	m := map[string]any{"handler": "idempotency", "storage": c.storeJSON(path)}
	if p.Observe {
		m["mode"] = "observe"
	}
	if p.TTL != 0 {
		m["ttl"] = p.duration(p.TTL)
	}
	if p.LockTimeout != 0 {
		m["lock_timeout"] = p.duration(p.LockTimeout)
	}
	if p.WaitTimeout != 0 {
		m["wait_timeout"] = p.duration(p.WaitTimeout)
	}
	if len(p.Methods) > 0 {
		m["methods"] = p.Methods
	}
	if p.Header != "" {
		m["header"] = p.Header
	}
	if p.Required {
		m["required"] = true
	}
	if p.TenantScope {
		m["scope"] = "{http.request.header.X-Tenant}"
	} else if p.HostPortScope {
		m["scope"] = "{http.request.hostport} {http.request.header.Authorization}"
	}
	if p.MaxKeyLength != 0 {
		m["max_key_length"] = p.MaxKeyLength
	}
	if p.MaxBodySize != 0 {
		m["max_body_size"] = p.MaxBodySize
	}
	if p.MaxResponseSize != 0 {
		m["max_response_size"] = p.MaxResponseSize
	}
	fp := map[string]any{}
	if len(p.FPHeaders) > 0 {
		fp["headers"] = p.FPHeaders
	}
	if p.NotCanonical {
		fp["canonical_json"] = false
	}
	if len(p.Ignore) > 0 {
		fp["ignore"] = p.Ignore
	}
	if len(fp) > 0 {
		m["fingerprint"] = fp
	}
	if len(p.ReleaseOn) > 0 {
		m["release_on"] = p.ReleaseOn
	}
	if p.InFlight != "" {
		m["in_flight"] = p.InFlight
	}
	if p.OnUnknownOutcome != "" {
		m["on_unknown_outcome"] = p.OnUnknownOutcome
	}
	if p.FailOpen {
		m["on_storage_error"] = "fail_open"
	}
	if p.ReplayHeader != "" {
		m["replay_header"] = p.ReplayHeader
	}
	if p.KeyJSON != "" {
		m["key_json"] = p.KeyJSON
	}
	if p.HandleErrors {
		m["errors"] = "handle_errors"
	}
	if p.DocsURL != "" {
		m["docs_url"] = p.DocsURL
	}
	if i == 0 {
		for k, v := range c.rawField {
			m[k] = v
		}
	}
	return m
}

func (c *Config) storeJSON(path string) map[string]any {
	s := c.Store
	m := map[string]any{"backend": s.Kind}
	url, dsn := s.URL, s.DSN
	if path == "b" && s.Via != "" {
		url, dsn = s.Via, s.Via
	}
	switch s.Kind {
	case "memory":
		m["max_keys"] = s.MaxKeys
		if s.MaxKeysPerScope != 0 {
			m["max_keys_per_scope"] = s.MaxKeysPerScope
		}
	case "redis":
		m["url"], m["key_prefix"] = url, s.Prefix
	case "postgres":
		m["dsn"], m["table"] = dsn, s.Table
		if s.MaxConns != 0 {
			m["max_conns"] = s.MaxConns
		}
	}
	if s.Timeout != 0 {
		m["timeout"] = durationString(s.Timeout)
	}
	if s.ReplayCache {
		m["replay_cache"] = map[string]any{"max_entries": 1000, "ttl": "30s"}
	}
	for k, v := range c.rawStore {
		m[k] = v
	}
	return m
}

// JSON is the whole Caddy config of the trial, serving on port (and, with
// tls, HTTP/1.1, HTTP/2 and HTTP/3 with TLS on its port), proxying to
// upstream. Requests with X-Model-Path: b take the handlers of path b
// (the store through its second route), those with X-Model-Site: fill the
// fill site; the others path a.
func (c *Config) JSON(port int, upstream string, tls *TLSServer) []byte {
	routes := []any{}
	if c.Store.FillKeys > 0 {
		routes = append(routes, map[string]any{
			"match":    []any{map[string]any{"header": map[string]any{HeaderSite: []string{"fill"}}}},
			"handle":   c.fillChain(upstream),
			"terminal": true,
		})
	}
	routes = append(routes,
		map[string]any{
			"match":    []any{map[string]any{"header": map[string]any{HeaderPath: []string{"b"}}}},
			"handle":   c.chain(upstream, "b"),
			"terminal": true,
		},
		map[string]any{"handle": c.chain(upstream, "a")})
	server := func(listen string) map[string]any {
		return map[string]any{
			"listen":           []string{listen},
			"automatic_https":  map[string]any{"disable": true},
			"routes":           routes,
			"read_timeout":     "30s",
			"idle_timeout":     "30s",
			"max_header_bytes": 1 << 20,
		}
	}
	plain := server(fmt.Sprintf("127.0.0.1:%d", port))
	plain["protocols"] = []string{"h1", "h2c"}
	servers := map[string]any{"model": plain}
	apps := map[string]any{"http": map[string]any{"servers": servers}}
	if tls != nil {
		secure := server(fmt.Sprintf("127.0.0.1:%d", tls.Port))
		secure["protocols"] = []string{"h1", "h2", "h3"}
		secure["tls_connection_policies"] = []any{map[string]any{}}
		servers["model_tls"] = secure
		apps["tls"] = map[string]any{
			"certificates": map[string]any{"load_files": []any{map[string]any{"certificate": tls.CertFile, "key": tls.KeyFile}}},
		}
	}
	cfg := map[string]any{
		"admin": map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{
			"writer": map[string]any{"output": "model"}, "level": "ERROR",
		}}},
		"apps": apps,
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		panic(err)
	}
	return b
}

// chain is the handlers of a path: the outer handlers, the idempotency
// handlers as the layout nests them, and the upstream.
func (c *Config) chain(upstream, path string) []any {
	l := c.Layout
	var tail []any
	if l.InnerDeleteServer {
		tail = append(tail, map[string]any{"handler": "headers", "response": map[string]any{"delete": []string{"Server"}, "deferred": true}})
	}
	tail = append(tail, map[string]any{"handler": "model_fault"}, c.proxy(upstream))

	var chain []any
	switch len(l.Handlers) {
	case 1:
		if l.Handlers[0].Match == "" {
			chain = append([]any{c.handlerJSON(0, path)}, tail...)
		} else {
			chain = []any{subroute(l.Handlers[0].Match, append([]any{c.handlerJSON(0, path)}, tail...), tail)}
		}
	case 2:
		inner := subroute(l.Handlers[1].Match, append([]any{c.handlerJSON(1, path)}, tail...), tail)
		chain = []any{c.handlerJSON(0, path), inner}
	}
	var outer []any
	outer = append(outer, map[string]any{"handler": "model_track"})
	if l.OuterHeaders {
		outer = append(outer, map[string]any{"handler": "headers", "response": map[string]any{
			"set":      map[string]any{"X-Outer": []string{"1"}},
			"replace":  map[string]any{"Location": []any{map[string]any{"search_regexp": "^/", "replace": "/app/"}}},
			"deferred": true,
		}})
	}
	if l.Encode {
		outer = append(outer, map[string]any{"handler": "encode", "encodings": map[string]any{"gzip": map[string]any{}}, "minimum_length": 16})
	}
	return append(outer, chain...)
}

// proxy is the reverse_proxy in front of the upstream. With Failures, a
// subroute whose first routes take the attempts that ask their proxy to
// fail (Behaviour.Fail): one that dials an address refusing connections,
// and one whose response_header_timeout is shorter than the upstream
// takes to answer them.
func (c *Config) proxy(upstream string) map[string]any {
	plain := map[string]any{"handler": "reverse_proxy", "upstreams": []any{map[string]any{"dial": upstream}}}
	if !c.Failures {
		return plain
	}
	asks := func(fail string) []any {
		return []any{map[string]any{"header_regexp": map[string]any{HeaderDo: map[string]any{"pattern": "(^|;)f=" + fail + "(;|$)"}}}}
	}
	return map[string]any{"handler": "subroute", "routes": []any{
		map[string]any{"match": asks(FailRefused), "terminal": true, "handle": []any{
			map[string]any{"handler": "reverse_proxy", "upstreams": []any{map[string]any{"dial": c.RefuseAddr}}},
		}},
		map[string]any{"match": asks(FailTimeout), "terminal": true, "handle": []any{
			map[string]any{"handler": "reverse_proxy", "upstreams": []any{map[string]any{"dial": upstream}},
				"transport": map[string]any{"protocol": "http", "response_header_timeout": ResponseHeaderTimeout.String()}},
		}},
		map[string]any{"handle": []any{plain}},
	}}
}

// fillChain is the fill site's handlers: an idempotency handler of default
// options on a small memory store of its own, and the upstream.
func (c *Config) fillChain(upstream string) []any {
	return []any{
		map[string]any{"handler": "model_track"},
		map[string]any{"handler": "idempotency", "storage": map[string]any{"backend": "memory", "max_keys": c.Store.FillKeys, "max_bytes": c.Store.FillBytes}},
		map[string]any{"handler": "reverse_proxy", "upstreams": []any{map[string]any{"dial": upstream}}},
	}
}

func subroute(match string, matched, rest []any) map[string]any {
	return map[string]any{"handler": "subroute", "routes": []any{
		map[string]any{"match": []any{map[string]any{"path": []string{match + "*"}}}, "handle": matched, "terminal": true},
		map[string]any{"handle": rest},
	}}
}

// fresh returns a copy of c for the run of token tok: a fresh memory
// store (of its own size) and Redis prefix.
func (c *Config) fresh(tok string) *Config {
	cfg := *c
	cfg.Layout.Handlers = slices.Clone(c.Layout.Handlers)
	n := runCounter.Add(1)
	cfg.Store.MaxKeys = 900_000_000 + int(n%90_000_000)
	cfg.Store.Prefix = "model:" + tok + ":"
	cfg.Store.FillBytes = 1<<30 + int64(n)
	return &cfg
}

// adapt makes a version 2 configuration fit the scenarios it runs: an
// enforcing handler that keys their requests (POST /orders/1 with a key
// header), leases short enough to wait past, a ttl short enough to
// outlive when the ttl scenario runs and long enough to outlast the
// others otherwise, a small PostgreSQL pool under many leases (the pool
// renewals once queued behind), and the fill site.
func adapt(c *Config, r *rand.Rand, cover []string) {
	hs := c.Layout.Handlers
	// Version 2 draws the default in_flight (wait) too.
	for i := range hs {
		if r.IntN(2) == 0 {
			hs[i].InFlight = ""
		}
	}
	if len(cover) == 0 {
		return
	}
	enforcing := false
	for _, p := range hs {
		enforcing = enforcing || !p.Observe
	}
	if !enforcing {
		hs[len(hs)-1].Observe = false
	}
	lease, ttl := false, slices.Contains(cover, scTTL)
	for _, k := range cover {
		lease = lease || needsLease(k)
	}
	lt := pick(r, time.Second, time.Second, 1500*time.Millisecond, 2*time.Second)
	for i := range hs {
		p := &hs[i]
		if lease {
			p.LockTimeout = lt
		}
		switch {
		case ttl:
			p.TTL = pick(r, time.Second, 2*time.Second)
		case p.TTL != 0 && p.TTL < time.Hour:
			p.TTL = time.Hour
		}
	}
	if slices.Contains(cover, scStorm) {
		// The storm's retries wait for the first request (a lease and a
		// half), and its large bodies are within the limit.
		for i := range hs {
			p := &hs[i]
			if p.WaitTimeout != 0 && p.WaitTimeout < 10*time.Second {
				p.WaitTimeout = 0
			}
			if p.MaxBodySize != 0 && p.MaxBodySize < 1<<20 {
				p.MaxBodySize = 0
			}
		}
	}
	if slices.Contains(cover, scScale) && c.Store.Kind == "postgres" {
		c.Store.MaxConns = 4
	}
	if slices.Contains(cover, scFill) {
		c.Store.FillKeys = 20 + r.IntN(20)
	}
}

// genConfig draws a configuration. Most are valid; some carry one invalid
// value, chosen around the limits.
func genConfig(r *rand.Rand, store Store) *Config {
	c := &Config{Store: store}
	l := &c.Layout
	l.OuterHeaders = r.IntN(3) == 0
	l.Encode = r.IntN(4) == 0
	l.InnerDeleteServer = r.IntN(5) == 0
	switch n := r.IntN(10); {
	case n < 5:
		l.Handlers = []Policy{genPolicy(r)}
		if r.IntN(4) == 0 {
			l.Handlers[0].Match = "/orders"
		}
	default:
		outer, inner := genPolicy(r), genPolicy(r)
		// The pairs of nesting: observe around enforce (the roll-out),
		// enforce around observe, enforce around enforce.
		switch r.IntN(3) {
		case 0:
			outer.Observe, inner.Observe = true, false
		case 1:
			outer.Observe, inner.Observe = false, true
		default:
			outer.Observe, inner.Observe = false, false
		}
		inner.Match = "/orders"
		l.Handlers = []Policy{outer, inner}
	}
	if store.Kind == "memory" && r.IntN(6) == 0 {
		c.Store.MaxKeysPerScope = 2 + r.IntN(4)
	}
	if store.Kind != "memory" && r.IntN(3) == 0 {
		c.Store.ReplayCache = true
	}
	if r.IntN(5) == 0 {
		mutate(r, c)
	}
	return c
}

// genPolicy draws one handler's options around their defaults, floors
// and ceilings.
func genPolicy(r *rand.Rand) Policy {
	var p Policy
	p.Observe = r.IntN(5) == 0
	p.TTL = pick(r, 0, 0, time.Second, 2*time.Second, time.Hour, maxTTL)
	p.LockTimeout = pick(r, 0, 0, time.Second, 3*time.Second, maxLockTimeout)
	p.WaitTimeout = pick(r, 0, 0, time.Second, 2*time.Second, maxWaitTimeout)
	p.NanoDurations = r.IntN(6) == 0
	if r.IntN(3) == 0 {
		p.Methods = []string{"POST", "PUT", "PATCH", "DELETE"}
	}
	if r.IntN(8) == 0 {
		p.Header = "X-Request-Key"
	}
	p.Required = r.IntN(3) == 0
	p.TenantScope = r.IntN(6) == 0
	if r.IntN(5) == 0 {
		p.MaxKeyLength = 12
	}
	if r.IntN(5) == 0 {
		p.MaxBodySize = 200
	}
	if r.IntN(4) == 0 {
		p.MaxResponseSize = 300
	}
	if r.IntN(5) == 0 {
		p.FPHeaders = []string{"Content-Type", "X-Variant"}
	}
	if r.IntN(5) == 0 {
		p.NotCanonical = true
	} else if r.IntN(3) == 0 {
		p.Ignore = []string{"/nonce"}
	}
	switch r.IntN(5) {
	case 0:
		p.ReleaseOn = []string{"5xx"}
	case 1:
		p.ReleaseOn = []string{"4xx", "5xx"}
	}
	// Version 1 drew wait or the default, then reject: it says reject
	// now (adapt may leave it to the default).
	p.InFlight = "reject"
	if r.IntN(4) == 0 {
		p.InFlight = "wait"
	}
	p.FailOpen = r.IntN(4) == 0
	switch r.IntN(6) {
	case 0:
		p.ReplayHeader = "off"
	case 1:
		p.ReplayHeader = "X-Replayed"
	}
	if r.IntN(4) == 0 {
		p.KeyJSON = "/id"
	}
	p.HandleErrors = r.IntN(8) == 0
	if r.IntN(4) == 0 {
		p.DocsURL = "https://docs.example.com/idempotency"
	}
	return p
}

func pick[T any](r *rand.Rand, choices ...T) T { return choices[r.IntN(len(choices))] }

// mutate gives c one invalid value, in the outermost handler or the
// store, and says which option must be named.
func mutate(r *rand.Rand, c *Config) {
	type m struct {
		option string
		field  string
		value  any
		store  bool
	}
	muts := []m{
		{"ttl", "ttl", "999ms", false},
		{"ttl", "ttl", int64(86400), false}, // JSON nanoseconds
		{"ttl", "ttl", durationString(maxTTL + 24*time.Hour), false},
		{"ttl", "ttl", "106751d", false},
		{"ttl", "ttl", int64(math.MaxInt64), false},
		{"lock_timeout", "lock_timeout", int64(30), false},
		{"lock_timeout", "lock_timeout", "500ms", false},
		{"lock_timeout", "lock_timeout", durationString(maxLockTimeout + time.Hour), false},
		{"lock_timeout", "lock_timeout", int64(math.MaxInt64 - 1000), false},
		{"lock_timeout", "lock_timeout", "60000d", false},
		{"wait_timeout", "wait_timeout", int64(5), false},
		{"wait_timeout", "wait_timeout", "-1s", false},
		{"wait_timeout", "wait_timeout", "100000h", false},
		{"mode", "mode", "enforced", false},
		{"in_flight", "in_flight", "queue", false},
		{"on_storage_error", "on_storage_error", "fail_sometimes", false},
		{"release_on", "release_on", []string{"600"}, false},
		{"release_on", "release_on", []string{"1xx"}, false},
		{"max_key_length", "max_key_length", -1, false},
		{"max_body_size", "max_body_size", -5, false},
		{"header", "header", "Idem Key", false},
		{"key_json", "key_json", "id", false},
		{"docs_url", "docs_url", "not a url", false},
		{"scope", "scope", "   ", false},
		{"fingerprint", "fingerprint", map[string]any{"canonical_json": false, "ignore": []string{"/nonce"}}, false},
		{"timeout", "timeout", int64(2), true},
	}
	if c.Store.Kind == "memory" {
		muts = append(muts, m{"max_keys", "max_keys", -3, true})
		muts[len(muts)-2] = m{"max_keys_per_scope", "max_keys_per_scope", -1, true}
	}
	if c.Store.Kind == "redis" {
		muts = append(muts, m{"key_prefix", "key_prefix", "model:{tag}:", true})
		muts = append(muts, m{"dial_timeout", "dial_timeout", int64(3), true})
		muts = append(muts, m{"replay_cache", "replay_cache", map[string]any{"max_entries": 10, "ttl": int64(5)}, true})
	}
	if c.Store.Kind == "postgres" {
		muts = append(muts, m{"cleanup_interval", "cleanup_interval", int64(7), true})
		muts = append(muts, m{"table", "table", "Bad-Table", true})
	}
	x := muts[r.IntN(len(muts))]
	c.Invalid = x.option
	c.Mutation = fmt.Sprintf("%s: %v", x.field, x.value)
	if x.store {
		c.rawStore = map[string]any{x.field: x.value}
	} else {
		c.rawField = map[string]any{x.field: x.value}
	}
}

// describe renders the configuration for failure messages: the handler
// and store JSON and the layout.
func (c *Config) describe() string {
	var b strings.Builder
	l := c.Layout
	fmt.Fprintf(&b, "layout: outer_headers=%v encode=%v inner_delete_server=%v failures=%v\n", l.OuterHeaders, l.Encode, l.InnerDeleteServer, c.Failures)
	for i := range l.Handlers {
		js, _ := json.Marshal(c.handlerJSON(i, "a"))
		where := "outer"
		if i == 1 {
			where = "inner, under path " + l.Handlers[1].Match + "*"
		} else if l.Handlers[0].Match != "" {
			where = "under path " + l.Handlers[0].Match + "*"
		}
		fmt.Fprintf(&b, "handler %d (%s): %s\n", i, where, js)
	}
	if c.Invalid != "" {
		fmt.Fprintf(&b, "invalid: %s (%s)\n", c.Invalid, c.Mutation)
	}
	return b.String()
}

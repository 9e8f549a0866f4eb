// Package idempotency is a Caddy HTTP handler that makes retried writes safe:
// a client sends an Idempotency-Key with a POST, the first request runs and
// its response is recorded, and every retry with the same key gets the
// recorded response back without running the upstream again.
package idempotency

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/backend/opterr"
	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Defaults of the configuration; see the README for what each one means.
const (
	defaultTTL             = 24 * time.Hour
	defaultLockTimeout     = 30 * time.Second
	defaultHeader          = "Idempotency-Key"
	defaultScope           = "{http.request.host} {http.request.header.Authorization}"
	defaultMaxKeyLength    = 255
	defaultMaxBodySize     = 1 << 20
	defaultMaxResponseSize = 1 << 20
	defaultWaitTimeout     = 10 * time.Second
	defaultReplayHeader    = "Idempotent-Replayed"

	// Floors and ceilings. Below a floor, a value is a misreading of the
	// unit (JSON durations without one are nanoseconds: "ttl": 86400 is
	// 86 microseconds), never an intent; above a ceiling, it is a typo
	// that time arithmetic would overflow on (106751 days is the most a
	// time.Duration holds). Stores saturate besides.
	minTTL         = caddy.Duration(time.Second)
	maxTTL         = caddy.Duration(3650 * 24 * time.Hour)
	minLockTimeout = caddy.Duration(time.Second)
	maxLockTimeout = caddy.Duration(24 * time.Hour)
	minWaitTimeout = caddy.Duration(10 * time.Millisecond)
	maxWaitTimeout = caddy.Duration(time.Hour)

	errorsProblem      = "problem"
	errorsHandleErrors = "handle_errors"

	modeEnforce = "enforce"
	modeObserve = "observe"

	inFlightReject  = "reject"
	inFlightWait    = "wait"
	failClosed      = "fail_closed"
	failOpen        = "fail_open"
	replayHeaderOff = "off"
)

var (
	defaultMethods            = []string{http.MethodPost, http.MethodPatch}
	defaultFingerprintHeaders = []string{"Content-Type"}
	// Answers that say nothing was done free the key: a server error, and
	// the refusals that come before any work (no or bad credentials, a
	// proxy's authentication, a request timeout, a rate limit). Keeping
	// them would let a client with made-up credentials fill the store
	// with 401s, and make a retry after a fixed token or a lifted limit
	// replay the refusal.
	defaultReleaseOn = []string{"5xx", "401", "403", "407", "408", "429"}
)

// Handler enforces the Idempotency-Key contract on the requests it sees.
//
// The first request with a key runs and its response is recorded; a retry
// with the same key and the same request gets the recorded response (with
// `Idempotent-Replayed: true`) and never reaches the next handler. A retry
// while the first is still running gets 409, a reuse of the key for another
// request 422, a malformed key 400. Responses with a `release_on` status free
// the key so that the retry runs again.
type Handler struct {
	// Where records are kept: a module in namespace
	// http.idempotency.storage, chosen by its "backend" key ("memory",
	// "redis", "postgres"). Default: memory. Handlers with the same storage
	// configuration share one store (and one connection pool), kept across
	// config reloads.
	StorageRaw json.RawMessage `json:"storage,omitempty" caddy:"namespace=http.idempotency.storage inline_key=backend"`

	// How long a completed response is kept and replayed, counted from
	// completion: at least 1s, at most 3650d. Default: 24h.
	TTL caddy.Duration `json:"ttl,omitempty"`

	// The lease of an in-flight request: at least 1s, at most 24h. It is
	// renewed every tenth of this while the request runs and while its
	// response waits to be recorded, so that a store outage or a stall
	// shorter than 3/4 of it never lets another instance take the key
	// over; if the instance running it dies, the lease lapses and the next
	// retry takes the key over. Default: 30s.
	LockTimeout caddy.Duration `json:"lock_timeout,omitempty"`

	// The request methods that use keys; other requests pass through
	// untouched. Default: POST and PATCH.
	Methods []string `json:"methods,omitempty"`

	// The request header that carries the key. Default: Idempotency-Key.
	Header string `json:"header,omitempty"`

	// Reject requests without a key (400). By default they pass through.
	Required bool `json:"required,omitempty"`

	// Which client a key belongs to: a template with placeholders whose
	// value is hashed (SHA-256) before it reaches the store, so the same
	// key from two clients or two hosts never collides and raw credentials
	// are never stored. A request whose scope evaluates to blank is
	// rejected (400). Default: "{http.request.host}
	// {http.request.header.Authorization}".
	Scope string `json:"scope,omitempty"`

	// The longest key accepted, counted on the unquoted key. Default: 255.
	MaxKeyLength int `json:"max_key_length,omitempty"`

	// The largest request body accepted with a key, in bytes; larger
	// requests get 413 and the next handler is not called. The body is read
	// whole before the key is reserved. Default: 1 MiB.
	MaxBodySize int64 `json:"max_body_size,omitempty"`

	// The largest response body recorded, in bytes. A larger response is
	// still streamed whole to the client; its record keeps status and
	// headers only, and replays say so with `Idempotent-Body-Omitted:
	// true`. Default: 1 MiB.
	MaxResponseSize int64 `json:"max_response_size,omitempty"`

	// What makes two requests with the same key "the same request".
	Fingerprint *FingerprintConfig `json:"fingerprint,omitempty"`

	// Response statuses that free the key instead of being recorded, so
	// that a retry runs again: codes ("429") or classes ("5xx"). Handler
	// errors and panics before a status always free the key. Default:
	// ["5xx", "401", "403", "407", "408", "429"]: the answers that say
	// nothing was done.
	ReleaseOn []string `json:"release_on,omitempty"`

	// What a request gets while another with the same key is running:
	// "wait" (block until the first finishes and replay its response;
	// 409 with Retry-After after wait_timeout, or at once when 1,000
	// requests of the handler wait already) or "reject" (409 at once,
	// unless the request says Prefer: wait=N). Default: wait, because
	// real clients give up on a 409 within a second or two and then send
	// the same intent under a new key.
	InFlight string `json:"in_flight,omitempty"`

	// How long a request waits at most for the first request with its key
	// to finish: with in_flight "wait", and for a request that asks with
	// `Prefer: wait=<seconds>` (which then waits the lesser of its own and
	// this). At least 10ms, at most 1h. Default: 10s.
	WaitTimeout caddy.Duration `json:"wait_timeout,omitempty"`

	// What to do when the store cannot be reached: "fail_closed" answers
	// 503 and never runs the next handler; "fail_open" runs it without
	// idempotency and logs a warning. Default: fail_closed.
	OnStorageError string `json:"on_storage_error,omitempty"`

	// The response header that marks replays, or "off". Default:
	// Idempotent-Replayed.
	ReplayHeader string `json:"replay_header,omitempty"`

	// A URL documenting the API's idempotency rules, linked from problem
	// responses with `Link: <url>; rel="describedby"`.
	DocsURL string `json:"docs_url,omitempty"`

	// "enforce" (default) answers as described; "observe" measures before
	// enforcing: every request reaches the next handler exactly as if this
	// handler were absent (no rejection, no replay, no header, no body
	// limit), while the store still records the first request with each
	// key and every later one is classified. The would-be outcome goes to
	// {http.idempotency.outcome}, the access log and the counter
	// caddy_http_idempotency_observed_total. A store error never affects
	// the request.
	Mode string `json:"mode,omitempty"`

	// How rejections are answered: "problem" (default) writes an RFC 9457
	// problem+json response; "handle_errors" returns each rejection (400,
	// 409, 413, 422, 429, 503) as a handler error with its status, for
	// the site's handle_errors routes to render, where
	// {http.error.status_code}, {http.error.message} (the detail) and
	// {http.idempotency.problem} (the problem type) tell them apart.
	// Retry-After is set on 409, 429 and 503 either way.
	Errors string `json:"errors,omitempty"`

	// Refuse the config (caddy validate, start, and a reload to it) when
	// this handler can never run before the handler that answers its
	// requests: a terminal handler such as reverse_proxy reached first on
	// its path (earlier in its route, in an enclosing block, in handle
	// blocks that all answer, through an invoke). Without it such a config
	// loads, and a warning naming the site, the route and the fix is
	// logged. The Caddyfile sets it on every idempotency directive with
	// the global option `idempotency { strict }`.
	Strict bool `json:"strict,omitempty"`

	// A JSON Pointer (RFC 6901) into the request body where the key is
	// found when the request carries no key header: webhook senders put
	// the delivery id there (/id for Stripe events). A string is the key
	// (under the key syntax and max_key_length); an integer is its decimal
	// text. The header wins when present; a body without the member has no
	// key.
	KeyJSON string `json:"key_json,omitempty"`

	backend      backend.Backend // the storage module
	backendName  string          // its name: memory, redis, postgres
	keeper       *keeper         // the requests' conversation with the store
	nothingAfter uint32          // warnNothingAfter has warned (atomic)
	waiting      int32           // requests waiting for an in-flight first one (atomic)
	logger       *zap.Logger

	// What requests run on, set by Provision: requests read
	// h.policy.ttl, never h.TTL, which stays as configured.
	policy policy
}

// policy is the handler's configuration compiled (see compile): defaults
// filled in, each value checked and parsed once. A field named after an
// option holds its value, defaulted.
type policy struct {
	ttl             caddy.Duration
	lockTimeout     caddy.Duration
	methods         []string // upper case
	header          string   // as configured, for messages
	headerKey       string   // header, canonical
	required        bool
	scope           *scopeTemplate
	maxKeyLength    int
	maxBodySize     int64
	maxResponseSize int64
	fingerprint     *fingerprint.Fingerprinter
	releaseOn       statusSet
	inFlight        string
	waitTimeout     caddy.Duration
	onStorageError  string
	replayHeader    string // canonical; empty for off
	docsURL         string
	mode            mode                 // how the handler acts on an answer
	errors          string               // errors problem or handle_errors
	keyJSON         *fingerprint.Pointer // nil without key_json
}

// FingerprintConfig chooses what a request's fingerprint covers: always the
// method, path, query and body, plus these headers.
type FingerprintConfig struct {
	// Request headers whose values are part of the fingerprint.
	// Default: ["Content-Type"].
	Headers []string `json:"headers,omitempty"`

	// Compare bodies declared as JSON (application/json, */*+json) by
	// meaning rather than bytes: member order, whitespace, string escapes
	// and number spelling do not matter. A body declared as JSON that is
	// not valid JSON is refused with 400. Every other body is compared
	// byte for byte. Default: true.
	CanonicalJSON *bool `json:"canonical_json,omitempty"`

	// JSON Pointers (RFC 6901) of members left out of the fingerprint of
	// JSON bodies, at any depth (an absent one is fine): fields a client
	// stamps on each attempt, such as /sent_at or /metadata/nonce. Needs
	// canonical_json.
	Ignore []string `json:"ignore,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.idempotency",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision compiles the configuration and loads the store. A config that
// does not compile holds nothing that Cleanup must give back.
func (h *Handler) Provision(ctx caddy.Context) error {
	p, err := h.compile()
	if err != nil {
		return err
	}
	h.policy = p
	h.logger = ctx.Logger()
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	if err := joinPlacementCheck(ctx); err != nil {
		return err
	}
	return h.loadStorage(ctx)
}

// compile fills in defaults, checks every option and builds the policy
// that requests run on. It is pure (no I/O, no placeholders) and leaves
// h as configured, so that the Caddyfile parser runs it on the block it
// has read and Provision on the config it loads. An error names its
// option (opterr), for the Caddyfile to point at that option's line.
func (h *Handler) compile() (policy, error) {
	var p policy
	for _, d := range []struct {
		name               string
		v, min, max, deflt caddy.Duration
		dst                *caddy.Duration
	}{
		{"ttl", h.TTL, minTTL, maxTTL, caddy.Duration(defaultTTL), &p.ttl},
		{"lock_timeout", h.LockTimeout, minLockTimeout, maxLockTimeout, caddy.Duration(defaultLockTimeout), &p.lockTimeout},
		{"wait_timeout", h.WaitTimeout, minWaitTimeout, maxWaitTimeout, caddy.Duration(defaultWaitTimeout), &p.waitTimeout},
	} {
		if err := backend.CheckDuration(d.name, d.v, d.min, d.max); err != nil {
			return policy{}, opterr.New(err, d.name)
		}
		*d.dst = cmp.Or(d.v, d.deflt)
	}
	switch {
	case h.MaxKeyLength < 0:
		return policy{}, opterr.Errorf("max_key_length", "max_key_length must be positive, got %d", h.MaxKeyLength)
	case h.MaxBodySize < 0:
		return policy{}, opterr.Errorf("max_body_size", "max_body_size must be positive, got %d", h.MaxBodySize)
	case h.MaxResponseSize < 0:
		return policy{}, opterr.Errorf("max_response_size", "max_response_size must be positive, got %d", h.MaxResponseSize)
	case h.Scope != "" && strings.TrimSpace(h.Scope) == "":
		return policy{}, opterr.Errorf("scope", "scope must not be blank; to share keys between all clients, use a constant such as 'global'")
	}
	p.maxKeyLength = cmp.Or(h.MaxKeyLength, defaultMaxKeyLength)
	p.maxBodySize = cmp.Or(h.MaxBodySize, defaultMaxBodySize)
	p.maxResponseSize = cmp.Or(h.MaxResponseSize, defaultMaxResponseSize)
	var err error
	if p.scope, err = newScopeTemplate(cmp.Or(h.Scope, defaultScope)); err != nil {
		return policy{}, opterr.New(err, "scope")
	}
	switch {
	case h.Mode != "" && h.Mode != modeEnforce && h.Mode != modeObserve:
		return policy{}, opterr.Errorf("mode", "mode must be %s or %s, got '%s'", modeEnforce, modeObserve, h.Mode)
	case h.Errors != "" && h.Errors != errorsProblem && h.Errors != errorsHandleErrors:
		return policy{}, opterr.Errorf("errors", "errors must be %s or %s, got '%s'", errorsProblem, errorsHandleErrors, h.Errors)
	}
	p.mode = modes[cmp.Or(h.Mode, modeEnforce)]
	p.errors = cmp.Or(h.Errors, errorsProblem)
	if h.KeyJSON != "" {
		ptr, err := fingerprint.ParsePointer(h.KeyJSON)
		if err != nil {
			return policy{}, opterr.Errorf("key_json", "key_json: %v", err)
		}
		p.keyJSON = &ptr
	}
	methods := h.Methods
	if len(methods) == 0 {
		methods = defaultMethods
	}
	for _, m := range methods {
		if !isToken(m) {
			return policy{}, opterr.Errorf("methods", "methods: %q is not a valid method name", m)
		}
		p.methods = append(p.methods, strings.ToUpper(m))
	}
	if h.Header != "" && !isToken(h.Header) {
		return policy{}, opterr.Errorf("header", "header: %q is not a valid header name", h.Header)
	}
	p.header = cmp.Or(h.Header, defaultHeader)
	p.headerKey = textproto.CanonicalMIMEHeaderKey(p.header)
	if p.fingerprint, err = h.Fingerprint.fingerprinter(); err != nil {
		return policy{}, opterr.New(err, "fingerprint")
	}
	switch h.ReplayHeader {
	case "":
		p.replayHeader = defaultReplayHeader
	case replayHeaderOff:
	default:
		if !isToken(h.ReplayHeader) {
			return policy{}, opterr.Errorf("replay_header", "replay_header: %q is not a valid header name", h.ReplayHeader)
		}
		p.replayHeader = textproto.CanonicalMIMEHeaderKey(h.ReplayHeader)
	}
	switch h.InFlight {
	case "", inFlightReject, inFlightWait:
		p.inFlight = cmp.Or(h.InFlight, inFlightWait)
	default:
		return policy{}, opterr.Errorf("in_flight", "in_flight must be %q or %q, got %q", inFlightReject, inFlightWait, h.InFlight)
	}
	switch h.OnStorageError {
	case "", failClosed, failOpen:
		p.onStorageError = cmp.Or(h.OnStorageError, failClosed)
	default:
		return policy{}, opterr.Errorf("on_storage_error", "on_storage_error must be %q or %q, got %q", failClosed, failOpen, h.OnStorageError)
	}
	if h.DocsURL != "" {
		u, err := url.Parse(h.DocsURL)
		if err != nil || !u.IsAbs() || u.Host == "" {
			return policy{}, opterr.Errorf("docs_url", "docs_url must be an absolute URL, got %q", h.DocsURL)
		}
	}
	p.docsURL = h.DocsURL
	releaseOn := h.ReleaseOn
	if len(releaseOn) == 0 {
		releaseOn = defaultReleaseOn
	}
	if p.releaseOn, err = parseStatusSet(releaseOn); err != nil {
		return policy{}, opterr.Errorf("release_on", "release_on: %w", err)
	}
	p.required = h.Required
	return p, nil
}

// fingerprinter builds the Fingerprinter fc describes (nil: the
// defaults), and checks it.
func (fc *FingerprintConfig) fingerprinter() (*fingerprint.Fingerprinter, error) {
	if fc == nil {
		fc = new(FingerprintConfig)
	}
	opts := fingerprint.Options{Headers: fc.Headers, CanonicalJSON: fc.CanonicalJSON == nil || *fc.CanonicalJSON}
	if len(opts.Headers) == 0 {
		opts.Headers = defaultFingerprintHeaders
	}
	for _, name := range opts.Headers {
		if !isToken(name) {
			return nil, fmt.Errorf("fingerprint headers: %q is not a valid header name", name)
		}
	}
	for _, s := range fc.Ignore {
		p, err := fingerprint.ParsePointer(s)
		if err != nil {
			return nil, fmt.Errorf("fingerprint ignore: %v", err)
		}
		opts.Ignore = append(opts.Ignore, p)
	}
	f, err := fingerprint.NewFingerprinter(opts)
	if err != nil {
		return nil, errors.New("fingerprint ignore needs canonical_json: members can only be left out of bodies compared as JSON")
	}
	return f, nil
}

// loadStorage loads the storage backend and wires the handler to its
// store.
func (h *Handler) loadStorage(ctx caddy.Context) error {
	b, name, err := loadBackend(ctx, h)
	if err != nil {
		return err
	}
	h.backend, h.backendName = b, name
	store := b.Store()
	if kl, ok := store.(storage.KeyLimiter); ok && kl.MaxKeyLength() > 0 && h.policy.maxKeyLength > kl.MaxKeyLength() {
		// Refused at start-up, not with a 503 for every long key.
		return opterr.Errorf("max_key_length", "max_key_length %d is more than the %s store can hold: at most %d", h.policy.maxKeyLength, name, kl.MaxKeyLength())
	}
	holder, _ := b.(backend.Holder)
	h.keeper = newKeeper(observe(store, name, holder), time.Duration(h.policy.lockTimeout), time.Duration(h.policy.ttl), h.logger)
	h.keeper.runShort = h.policy.onStorageError == failOpen
	return nil
}

// Validate reports configuration errors. Provision compiled the
// configuration before taking a store, so a handler with a store has
// none left; one that was not provisioned reports its compile error.
func (h *Handler) Validate() error {
	if h.keeper != nil {
		return nil
	}
	if _, err := h.compile(); err != nil {
		return err
	}
	return errors.New("no storage loaded")
}

// Cleanup releases nothing of its own: the storage guest module is cleaned
// up by Caddy with the rest of the config. It leaves the handler's fields
// alone: on a reload Caddy cleans the old config up as soon as the new one
// runs, while requests the old one started may still be running (the old
// servers shut down gracefully, without a deadline), and those requests
// must still complete or release their keys.
func (h *Handler) Cleanup() error {
	return nil
}

// statusSet says which response statuses free a key.
type statusSet [1000]bool

func (s *statusSet) has(status int) bool {
	return status >= 0 && status < len(s) && s[status]
}

// parseStatusSet parses codes ("429") and classes ("5xx") of final statuses.
func parseStatusSet(specs []string) (statusSet, error) {
	var set statusSet
	for _, spec := range specs {
		if len(spec) == 3 && (spec[1:] == "xx" || spec[1:] == "XX") && spec[0] >= '2' && spec[0] <= '5' {
			base := int(spec[0]-'0') * 100
			for code := base; code < base+100; code++ {
				set[code] = true
			}
			continue
		}
		code, err := strconv.Atoi(spec)
		if err != nil || code < 200 || code > 599 {
			return set, fmt.Errorf("%q is not a final status code (200-599) or class (2xx-5xx)", spec)
		}
		set[code] = true
	}
	return set, nil
}

// isToken reports whether s is an RFC 9110 token (a method or header name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)

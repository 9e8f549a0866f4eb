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
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
	"github.com/caddy-idempotency/caddy-idempotency/placement"
	"github.com/caddy-idempotency/caddy-idempotency/storage/opterr"
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

// The values of on_unknown_outcome.
const (
	unknownOutcomeKeep    = "keep"
	unknownOutcomeRelease = "release"
)

// framingHeaders are the headers replay_header must not name: those that
// frame or describe the replayed message or its connection (hop by hop),
// which a value of "true" would corrupt, and Date, which the server sets.
var framingHeaders = []string{"Content-Length", "Content-Type", "Content-Encoding", "Content-Range", "Transfer-Encoding",
	"Date", "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Upgrade"}

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
	// rejected (400 scope-empty, naming the placeholders). Placeholders
	// are those Caddy sets before the handler runs ({http.request.*},
	// {http.vars.*}, {http.auth.*}, {http.regexp.*}, {http.matchers.*},
	// {http.error.*}, {env.*}, {file.*}, {system.*}, {time.*}); another,
	// and {http.request.header.Host} (always empty: use
	// {http.request.host}), is a configuration error. Default:
	// "{http.request.host} {http.request.header.Authorization}".
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
	// that a retry runs again: codes ("429") or classes ("5xx") of 3xx to
	// 5xx (a success says the work was done: 2xx is refused). They are
	// the statuses the next handler (the upstream) writes; a failure
	// before any status is on_unknown_outcome's. Default: ["5xx", "401",
	// "403", "407", "408", "429"]: the answers that say nothing was done.
	ReleaseOn []string `json:"release_on,omitempty"`

	// What becomes of the key of a request whose outcome is unknown: the
	// next handler failed before any status after the request may have
	// reached the upstream (reverse_proxy's response_header_timeout, a
	// reset or an EOF after the request was sent, a deadline, an error of
	// a handler that is not a proxy, a panic). "keep" keeps the key as an
	// outcome-unknown record until ttl: every retry with the key gets a
	// 502 problem of type urn:caddy-idempotency:outcome-unknown (not
	// retryable) and never runs, until an operator releases the key (admin
	// API, `caddy idempotency release`) once the operation is reconciled.
	// "release" frees the key, so that the retry runs again: the upstream
	// may then act twice. A failure that provably sent nothing (a dial
	// error, no upstream available, a 4xx handler error) frees the key
	// either way. Default: keep.
	OnUnknownOutcome string `json:"on_unknown_outcome,omitempty"`

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

	// The response header that marks replays, or "off". Not a header
	// that frames or describes the message or its connection
	// (Content-Length, Content-Type, Transfer-Encoding, Date, Connection,
	// ...). Default: Idempotent-Replayed.
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
	// 409, 413, 422, 429, 502, 503) as a handler error with its status, for
	// the site's handle_errors routes to render, where
	// {http.error.status_code}, {http.error.message} (the detail) and
	// {http.idempotency.problem} (the problem type) tell them apart.
	// Retry-After is set on 409, 429 and 503 either way.
	Errors string `json:"errors,omitempty"`

	// A config in which this handler can never run before the handler
	// that answers its requests (a terminal handler such as reverse_proxy
	// reached first on its path: earlier in its route, in an enclosing
	// block, in handle blocks that all answer, through an invoke) is
	// always refused, in caddy validate, at start and on a reload. Strict
	// refuses one in which the requests that reach an upstream skip it
	// and nothing after it answers the others, too; without it such a
	// config loads, and a warning names the site, the route and the fix.
	// The Caddyfile sets it on every idempotency directive with the
	// global option `idempotency { strict }`.
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
	waiters      *waitRoom       // requests waiting for an in-flight first one
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
	waitInFlight    bool // in_flight wait
	waitTimeout     caddy.Duration
	failOpen        bool   // on_storage_error fail_open
	replayHeader    string // canonical; empty for off
	docsURL         string
	mode            mode                 // how the handler acts on an answer
	errorRoutes     bool                 // errors handle_errors
	keyJSON         *fingerprint.Pointer // nil without key_json
	keepUnknown     bool                 // on_unknown_outcome keep
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
	if err := placement.Join(ctx); err != nil {
		return err
	}
	return h.loadStorage(ctx)
}

// modes are the values of the mode option (mode.go).
var modes = map[string]mode{modeEnforce: enforcing{}, modeObserve: observing{}}

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
	// The enumerations, each checked against its values (the first is
	// its default) and compiled into what requests compare.
	var mode, errorsTo, inFlight, onStorageError, onUnknownOutcome string
	for _, e := range []struct {
		option, value string
		values        [2]string
		chosen        *string
	}{
		{"mode", h.Mode, [2]string{modeEnforce, modeObserve}, &mode},
		{"errors", h.Errors, [2]string{errorsProblem, errorsHandleErrors}, &errorsTo},
		{"in_flight", h.InFlight, [2]string{inFlightWait, inFlightReject}, &inFlight},
		{"on_storage_error", h.OnStorageError, [2]string{failClosed, failOpen}, &onStorageError},
		{"on_unknown_outcome", h.OnUnknownOutcome, [2]string{unknownOutcomeKeep, unknownOutcomeRelease}, &onUnknownOutcome},
	} {
		*e.chosen = cmp.Or(e.value, e.values[0])
		if !slices.Contains(e.values[:], *e.chosen) {
			return policy{}, opterr.Errorf(e.option, "%s must be %q or %q, got %q", e.option, e.values[0], e.values[1], e.value)
		}
	}
	p.mode = modes[mode]
	p.errorRoutes = errorsTo == errorsHandleErrors
	p.waitInFlight = inFlight == inFlightWait
	p.failOpen = onStorageError == failOpen
	p.keepUnknown = onUnknownOutcome == unknownOutcomeKeep
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
		if slices.Contains(framingHeaders, p.replayHeader) {
			return policy{}, opterr.Errorf("replay_header", "replay_header: %s describes the message or the connection, and a replay must not set it to 'true'; name a header of its own, such as %s", p.replayHeader, defaultReplayHeader)
		}
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
	for code := 200; code < 300; code++ {
		if p.releaseOn.has(code) {
			// A success says the work was done: freeing its key would run
			// it again on the retry, the one thing the handler prevents.
			return policy{}, opterr.Errorf("release_on", "release_on: %d is a success; only answers that say nothing was done (4xx, 5xx) may free a key", code)
		}
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

// StrictPlacement implements placement.StrictPlacement: the placement
// check refuses a config in which some requests skip this handler.
func (h *Handler) StrictPlacement() bool { return h.Strict }

// Cleanup releases nothing of its own: the storage guest module is cleaned
// up by Caddy with the rest of the config. It leaves the handler's fields
// alone: on a reload Caddy cleans the old config up as soon as the new one
// runs, while requests the old one started may still be running (the old
// servers shut down gracefully, without a deadline), and those requests
// must still complete or release their keys. When Caddy exits (its
// servers are drained by then), it waits, up to exitDrain for all
// handlers together, for the store writes aftercare still retries: each
// holds the key of a request that ran, which a retry would run again
// once its lease lapsed.
func (h *Handler) Cleanup() error {
	if h.keeper == nil || !caddy.Exiting() {
		return nil
	}
	if left := h.keeper.aftercare.drain(exitDeadline()); left > 0 {
		h.logger.Error("exiting with idempotency store writes still pending: their keys stay in flight until their leases lapse, "+
			"and a retry then runs the request again; check the store",
			zap.Int("pending", left), zap.Duration("waited_at_most", exitDrain))
	}
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
	_ placement.StrictPlacement   = (*Handler)(nil)
)

// UnmarshalJSON decodes the handler's JSON config as Caddy would, but
// that an error names the option whose value does not decode ("ttl":
// "x" says ttl, not just `time: invalid duration "x"`).
func (h *Handler) UnmarshalJSON(b []byte) error {
	type fields Handler
	return backend.DecodeJSON(b, (*fields)(h))
}

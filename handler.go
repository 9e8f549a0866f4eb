package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// bodyOmittedHeader marks replays of responses whose body was not
// recorded: too large, or cut short by a failure after the status was
// sent.
const bodyOmittedHeader = "Idempotent-Body-Omitted"

// Retry-After values, in seconds. A 409 clears when the first request
// finishes, usually well within a second; a store outage is worth probing
// again soon; a client past its share frees room as its records expire,
// which the memory store's janitor notices once a minute. (A full store
// says nothing: it cannot tell when room returns.)
const (
	conflictRetryAfter  = "1"
	storeDownRetryAfter = "1"
	scopeFullRetryAfter = "60"
)

// errStoreClosed: the handler's store was closed before the request could
// hold it (its config was unloaded as the request arrived).
var errStoreClosed = errors.New("the idempotency store of this configuration is closed")

// ServeHTTP implements caddyhttp.MiddlewareHandler: the request flow of
// docs/guarantees.md. What happened to the request is classified once
// (answer.go); the mode acts on that answer (mode.go: enforce.go,
// observe.go).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !slices.Contains(h.policy.methods, r.Method) {
		return next.ServeHTTP(w, r)
	}
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if taken(h.policy.mode, repl) {
		return next.ServeHTTP(w, r)
	}

	x := &exchange{h: h, w: w, r: r, next: next, repl: repl}
	k, ref := h.keyRequest(&x.keyed, r, repl)
	if k != nil {
		defer k.done() // after the next handler: it may read the body
	}
	x.k = k
	if ref != nil {
		return h.policy.mode.carryOut(x, h.policy.refusalAnswer(ref))
	}
	res, err := h.keeper.claim(x.detached(), k.key, k.fp)
	if err != nil {
		return h.policy.mode.carryOut(x, h.policy.storeErrorAnswer(err))
	}
	replayed := outcomeReplayed
	if res.Outcome == storage.Conflict && h.policy.mode.traits().waits {
		if wait, asked := h.waitFor(r); wait > 0 && h.enterWait() {
			replayed = outcomeWaited
			if asked {
				w.Header().Set("Preference-Applied", preferenceApplied(wait))
			}
			res, err = h.keeper.await(r.Context(), k.key, k.fp, res, wait)
			h.leaveWait()
			if err != nil {
				return h.policy.mode.carryOut(x, h.policy.storeErrorAnswer(err))
			}
		}
	}
	x.res = res
	return h.policy.mode.carryOut(x, reservationAnswer(res.Outcome, replayed))
}

// exchange is one request on its way through the handler.
type exchange struct {
	h    *Handler
	w    http.ResponseWriter
	r    *http.Request
	next caddyhttp.Handler
	repl *caddy.Replacer
	k    *keyedRequest       // nil when the request could not be keyed
	res  storage.Reservation // what the store said of the key

	requestID string // Caddy's id of a rejected request ("" otherwise)

	// What k points to, the detached context of the store's calls, and
	// the access log's fields: parts of the exchange rather than
	// allocations of their own.
	keyed    keyedRequest
	detach   detachedContext
	logged   settledFields
	loggedTo bool
}

// detached is the request's context without its cancellation, for the
// store's calls: they outlive a client that hangs up (see keeper.claim).
func (x *exchange) detached() context.Context {
	if x.detach.parent == nil {
		x.detach.parent = x.r.Context()
	}
	return &x.detach
}

// settledFields are the access log's fields of how the handler answered
// a request, as one field (caddyhttp.ExtraLogFields.Add costs an
// allocation or two per call).
type settledFields struct {
	traits  *modeTraits
	outcome outcome
	keyHash string
}

func (f *settledFields) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddString(f.traits.outcomeField, string(f.outcome))
	if f.keyHash != "" {
		enc.AddString(f.traits.hashField, f.keyHash)
	}
	return nil
}

// settle records how the handler answered the request: in the
// {http.idempotency.outcome} placeholder, the requests counter, the access
// log and a debug log.
func (x *exchange) settle(o outcome) {
	h, r, repl := x.h, x.r, x.repl
	m := h.policy.mode.traits()
	repl.Set(placeholderOutcome, o.value())
	if m.answers {
		repl.Set(placeholderSettled, true)
	}
	m.counted(r, o)
	traceOutcome(r.Context(), o, repl, h.backendName, m)
	kh, _ := repl.GetString(m.keyHash)
	if extra, ok := r.Context().Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields); ok && accessLogged(r) {
		f := &x.logged
		if x.loggedTo {
			f = new(settledFields) // the first one is the log's already
		}
		x.loggedTo = true
		*f = settledFields{traits: m, outcome: o, keyHash: kh}
		extra.Add(zap.Inline(f))
	}
	if c := h.logger.Check(zapcore.DebugLevel, "idempotency outcome"); c != nil {
		if x.requestID != "" {
			c.Write(zap.String("outcome", string(o)), zap.String("key_hash", kh), zap.String("request_id", x.requestID))
		} else {
			c.Write(zap.String("outcome", string(o)), zap.String("key_hash", kh))
		}
	}
}

// accessLogged reports whether the request's server may write an access
// log, the only reader of its extra log fields: a server without one
// (Caddy's default) is spared ExtraLogFields.Add, which allocates three
// times (it clears a sync.Map) on every request.
func accessLogged(r *http.Request) bool {
	srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	return !ok || srv == nil || srv.Logs != nil
}

// keyHash is the key hash of the request's key, "" before it has one.
func (x *exchange) keyHash() string {
	if x.k == nil {
		return ""
	}
	return x.k.hash
}

// execute runs the next handler for the request that owns its key,
// streams the response to the client while recording it, then completes
// or releases the record.
func (x *exchange) execute(token storage.Token) error {
	h, w, r, k := x.h, x.w, x.r, x.k
	x.settle(outcomeNew)
	inFlight := metricsOf(r).inFlight
	inFlight.Inc()
	defer inFlight.Dec()
	// What a later 422 needs to tell what differs; taken before the next
	// handler reads the body.
	detail := h.policy.fingerprint.DetailCanonical(r.Method, k.path, r.URL.RawQuery, r.Header, k.body.Bytes(), k.canonical)
	l := h.keeper.holdLease(k.key, token)
	// Runs after the record is settled: the write that settles it keeps
	// the lease alive, in aftercare if the store cannot take it at once.
	defer l.stop()
	rec := newRecorder(w, h.policy.maxResponseSize, h.policy.mode.traits().transparent)
	defer rec.unbound()

	if h.policy.mode.traits().detaches {
		// The request runs to the end even if the client hangs up: an
		// upstream cancelled half-way may or may not have acted, and its
		// response is what every retry must get. Stored bodies are never
		// content-encoded, so that each replay can be encoded for the
		// client that asks for it. (Observe mode changes nothing.)
		r = r.WithContext(detach(r.Context()))
		r.Header.Set("Accept-Encoding", "identity")
	}

	// A panic is not recovered, so that it keeps its stack trace; the
	// deferred call settles the record on the way out.
	finished := false
	defer func() {
		if !finished {
			h.finish(withLease(r.Context(), l), k.key, token, rec, detail, "the handler panicked")
		}
	}()
	err := x.next.ServeHTTP(rec, r)
	finished = true
	failure := ""
	switch {
	case err != nil:
		failure = "the handler failed: " + err.Error()
	case rec.invalid != 0:
		failure = fmt.Sprintf("the handler answered with status %d, which HTTP cannot send", rec.invalid)
		err = caddyhttp.Error(http.StatusBadGateway, errors.New(failure))
	case rec.status == 0 && !rec.hijacked:
		h.warnNothingAfter()
	}
	h.finish(withLease(r.Context(), l), k.key, token, rec, detail, failure)
	if rec.cutShort() {
		// The record is settled, but the client did not get the whole
		// answer: abort its side rather than end it cleanly (see
		// recorder.cutShort).
		panic(http.ErrAbortHandler)
	}
	return err
}

// warnNothingAfter says, once per handler, that nothing after it in its
// route answered, so it recorded an empty 200. (A responding handler
// ordered before idempotency answers the request itself; idempotency then
// never runs and cannot tell: docs/caddyfile.md explains the order.)
func (h *Handler) warnNothingAfter() {
	if atomic.CompareAndSwapUint32(&h.nothingAfter, 0, 1) {
		h.logger.Warn("no handler after idempotency in its route wrote a response, so it recorded an empty 200; " +
			"put reverse_proxy (or another responding handler) after it in the route (see docs/caddyfile.md, order and route)")
	}
}

// finish completes or releases the record of a request once the next
// handler has returned or panicked (failure says which, "" when it
// returned nil). The rule: once a final status outside release_on was
// sent, the upstream has acted and must never run again for this key, so
// the record is completed; when the response is incomplete (an error or
// a panic after the status, such as reverse_proxy's http.ErrAbortHandler
// when the upstream broke off mid-body), with its body omitted. Before
// any final status that HTTP can send, a failure frees the key for the
// retry.
func (h *Handler) finish(ctx context.Context, key storage.Key, token storage.Token, rec *recorder, detail []byte, failure string) {
	status, header, body, omitted := rec.response()
	switch {
	case rec.hijacked:
		h.keeper.release(ctx, key, token, "the connection was hijacked")
	case rec.invalid != 0 || !storage.ValidStatus(status):
		h.keeper.release(ctx, key, token, fmt.Sprintf("invalid status %d", max(rec.invalid, status)))
	case failure != "" && rec.status == 0:
		h.keeper.release(ctx, key, token, failure)
	case h.policy.releaseOn.has(status):
		h.keeper.release(ctx, key, token, fmt.Sprintf("status %d", status))
	default:
		resp := &storage.Response{Status: status, Header: header, Body: body, BodyOmitted: omitted, Detail: detail}
		if failure != "" {
			resp.Body, resp.BodyOmitted = nil, true
			h.logger.Warn("the response broke off after its status was sent; recording status and headers without the body",
				zap.String("key_hash", key.Hash()), zap.Int("status", status), zap.String("failure", failure))
		}
		identityBody(resp, h.policy.maxResponseSize)
		h.keeper.complete(ctx, key, token, resp)
	}
}

// replay answers with a recorded response: the headers the outer handlers
// set for the current request (CORS, request ids), changed as the inner
// handlers changed them the first time, the body, and the trailers.
func (x *exchange) replay(rec *storage.Record, how outcome) error {
	h, w, r := x.h, x.w, x.r
	x.settle(how)
	traceReplay(r.Context(), rec)
	resp := rec.Response
	hdr := w.Header()
	trailers := replayHeader(hdr, resp.Header, h.policy.replayHeader)
	if resp.BodyOmitted {
		hdr.Del("Content-Length")
		hdr.Set(bodyOmittedHeader, "true")
	} else if len(trailers) > 0 {
		hdr.Del("Content-Length") // trailers need a chunked body
		hdr["Trailer"] = []string{strings.Join(trailers, ", ")}
	}
	w.WriteHeader(resp.Status)
	if r.Method != http.MethodHead && len(resp.Body) > 0 {
		if _, err := w.Write(resp.Body); err != nil {
			// A client gone mid-replay loses nothing, but must not take
			// what it got for the whole answer.
			panic(http.ErrAbortHandler)
		}
	}
	if !resp.BodyOmitted {
		for _, name := range trailers {
			hdr[name] = resp.Header[http.TrailerPrefix+name]
		}
	}
	return nil
}

// mismatchDetail is the detail of a 422 for a request that reuses a key
// for another request, naming what differs (never a value) when the
// record says.
func (h *Handler) mismatchDetail(r *http.Request, k *keyedRequest, rec *storage.Record) (string, []string) {
	differs := h.differs(r, k, rec)
	if len(differs) > 0 {
		return fmt.Sprintf("this %s was already used for a request that differs in %s; use a new key for a new operation",
			h.policy.header, strings.Join(differs, ", ")), differs
	}
	return fmt.Sprintf("this %s was already used for a different request; use a new key for a new operation", h.policy.header), nil
}

// differs names the parts of the request that differ from the recorded
// one, nil when the record cannot say (still in flight, or made before
// records kept request details).
func (h *Handler) differs(r *http.Request, k *keyedRequest, rec *storage.Record) []string {
	if rec == nil {
		return nil
	}
	d, ok := h.policy.fingerprint.Differs(rec.Detail, r.Method, k.path, r.URL.RawQuery, r.Header, k.body.Bytes())
	if !ok {
		return nil
	}
	return d
}

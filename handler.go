package idempotency

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// bodyOmittedHeader marks replays of responses whose body was not
// recorded: too large, or cut short by a failure after the status was
// sent.
const bodyOmittedHeader = "Idempotent-Body-Omitted"

// ServeHTTP implements caddyhttp.MiddlewareHandler: the request flow of
// docs/guarantees.md. What happened to the request is classified once
// (answer.go); the mode acts on that answer (mode.go: enforcing,
// observing).
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
	if res.Outcome == storage.Conflict && h.policy.mode.traits().enforces {
		if res, replayed, err = x.wait(res); err != nil {
			return h.policy.mode.carryOut(x, h.policy.storeErrorAnswer(err))
		}
	}
	x.res = res
	return h.policy.mode.carryOut(x, reservationAnswer(res, replayed))
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

	// Likewise for a new key: the recorder, the record's response, the
	// context of the write that settles the record (detached, with its
	// lease), and the Accept-Encoding value the next handler is sent; for
	// a replay, the replayed header values when they are few (each
	// replay's own, see replayHeader).
	rec      recorder
	resp     storage.Response
	settling detachedContext
	identity [1]string
	// The next handler's trace: how many connections its transports
	// asked for and got to upstreams (failure.notSent, failureOf).
	trace  httptrace.ClientTrace
	gets   atomic.Int32
	conns  atomic.Int32
	values [8]string
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

// answered records how the handler answered the request: in the
// {http.idempotency.outcome} placeholder, the requests counter, the access
// log and a debug log.
func (x *exchange) answered(o outcome) {
	h, r, repl := x.h, x.r, x.repl
	m := h.policy.mode.traits()
	repl.Set(placeholderOutcome, o.value())
	if m.enforces {
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
	x.answered(outcomeNew)
	inFlight := metricsOf(r).inFlight
	inFlight.Inc()
	defer inFlight.Dec()
	// What a later 422 needs to tell what differs; taken before the next
	// handler reads the body.
	detail := h.policy.fingerprint.DetailCanonical(r.Method, k.path, r.URL.RawQuery, r.Header, k.content, k.canonical)
	l := h.keeper.holdLease(k.key, token)
	// Runs after the record is settled: the write that settles it keeps
	// the lease alive, in aftercare if the store cannot take it at once.
	defer l.stop()
	rec := initRecorder(&x.rec, w, h.policy.maxResponseSize, !h.policy.mode.traits().enforces)
	defer rec.unbound()

	ctx := r.Context()
	if h.policy.mode.traits().enforces {
		// The request runs to the end even if the client hangs up: an
		// upstream cancelled half-way may or may not have acted, and its
		// response is what every retry must get. Stored bodies are never
		// content-encoded, so that each replay can be encoded for the
		// client that asks for it. (Observe mode changes nothing.)
		ctx = x.detached()
		x.identity[0] = "identity"
		r.Header["Accept-Encoding"] = x.identity[:] // Header.Set, without its allocation
	}
	// The context of the write that settles the record: detached (it
	// outlives a client that hangs up) with the lease, which the write
	// keeps alive.
	x.settling = detachedContext{parent: ctx, lease: l}
	settling := &x.settling
	// How many connections to upstreams the attempts got (failureOf):
	// httptrace composes this with reverse_proxy's own trace, and with
	// that of a reverse_proxy in a handle_response route.
	x.trace.GetConn = func(string) { x.gets.Add(1) }
	x.trace.GotConn = func(httptrace.GotConnInfo) { x.conns.Add(1) }
	r = r.WithContext(httptrace.WithClientTrace(ctx, &x.trace))
	// reverse_proxy's status and retries in the replacer are the next
	// handler's only if none were there before (a forward_auth ahead of
	// this handler leaves its own): cleared now, the outer ones are put
	// back after if the next handler set none.
	var prior [len(upstreamKeys)]any
	var hadPrior [len(upstreamKeys)]bool
	for i, key := range upstreamKeys {
		prior[i], hadPrior[i] = x.repl.Get(key)
		x.repl.Delete(key)
	}
	failed := func(err error, panicked bool) failure {
		f := failureOf(err, panicked, rec, int(x.gets.Load()), int(x.conns.Load()), x.repl)
		for i, key := range upstreamKeys {
			if !hadPrior[i] {
				continue
			}
			if _, ok := x.repl.Get(key); !ok {
				x.repl.Set(key, prior[i])
			}
		}
		return f
	}

	// A panic is not recovered, so that it keeps its stack trace; the
	// deferred call settles the record on the way out.
	finished := false
	defer func() {
		if !finished {
			f := failed(nil, true)
			h.finish(settling, k.key, token, rec, &x.resp, detail, f)
		}
	}()
	err := x.next.ServeHTTP(rec, r)
	finished = true
	f := failed(err, false)
	switch {
	case err == nil && rec.invalid != 0:
		err = caddyhttp.Error(http.StatusBadGateway, errors.New(f.String()))
	case err == nil && rec.status == 0 && !rec.hijacked:
		h.warnNothingAfter()
	}
	h.finish(settling, k.key, token, rec, &x.resp, detail, f)
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
// handler has returned or panicked (f says how it failed, if it did).
// The rule: once a final status outside release_on was sent, the
// upstream has acted and must never run again for this key, so the
// record is completed; when the response is incomplete (an error or a
// panic after the status, such as reverse_proxy's http.ErrAbortHandler
// when the upstream broke off mid-body), with its body omitted. A
// failure before any final status that HTTP can send frees the key when
// nothing reached the upstream, and otherwise leaves the outcome unknown
// (settleUnknown). A recorded response is made in resp.
func (h *Handler) finish(ctx context.Context, key storage.Key, token storage.Token, rec *recorder, resp *storage.Response, detail []byte, f failure) {
	status, header, body, omitted := rec.response()
	switch {
	case rec.hijacked:
		h.keeper.release(ctx, key, token, "the connection was hijacked")
	case f.happened() && rec.status == 0:
		h.settleUnknown(ctx, key, token, detail, f)
	case !storage.ValidStatus(status):
		h.keeper.release(ctx, key, token, fmt.Sprintf("invalid status %d", status))
	case h.policy.releaseOn.has(status):
		h.keeper.release(ctx, key, token, fmt.Sprintf("status %d", status))
	default:
		*resp = storage.Response{Status: status, Header: header, Body: body, BodyOmitted: omitted, Detail: detail}
		if f.happened() {
			resp.Body, resp.BodyOmitted = nil, true
			h.logger.Warn("the response broke off after its status was sent; recording status and headers without the body",
				zap.String("key_hash", key.Hash()), zap.Int("status", status), zap.String("failure", f.String()))
		}
		identityBody(resp, h.policy.maxResponseSize)
		h.keeper.complete(ctx, key, token, resp)
	}
}

// identityBody makes sure a recorded body is never content-encoded, so
// that each replay can be encoded for the client that asks (encode runs
// outside the handler). The handler asks the upstream for identity; one
// that answers gzip anyway has its body decoded here, within limit; any
// other encoding, or a gzip body that does not decode within limit, is
// recorded without its body (replays say so) rather than replayed to
// clients that cannot read it.
func identityBody(resp *storage.Response, limit int64) {
	ce := headerValue(resp.Header, "Content-Encoding")
	if ce == "" || strings.EqualFold(ce, "identity") {
		return
	}
	delete(resp.Header, "Content-Encoding")
	delete(resp.Header, "Content-Length") // the encoded length
	if resp.BodyOmitted || len(resp.Body) == 0 {
		return
	}
	if strings.EqualFold(ce, "gzip") || strings.EqualFold(ce, "x-gzip") {
		if zr, err := gzip.NewReader(bytes.NewReader(resp.Body)); err == nil {
			var out bytes.Buffer
			n, err := out.ReadFrom(io.LimitReader(zr, limit+1))
			if err == nil && n <= limit {
				resp.Body = out.Bytes()
				return
			}
		}
	}
	resp.Body, resp.BodyOmitted = nil, true
}

// headerValue is the first value of name in h, which may be nil.
func headerValue(h http.Header, name string) string {
	if v := h[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// settleUnknown settles the key of a request whose next handler failed
// before any final status: freed when nothing reached the upstream (the
// retry runs, as the request did nothing); otherwise the outcome is
// unknown, and the key is kept as an outcome-unknown record until ttl
// (every retry is answered that the outcome is unknown, and never runs),
// or freed with on_unknown_outcome release. An unknown outcome is
// counted and logged either way, so that operators find the keys to
// reconcile.
func (h *Handler) settleUnknown(ctx context.Context, key storage.Key, token storage.Token, detail []byte, f failure) {
	if sent, why := f.notSent(); sent {
		h.keeper.release(ctx, key, token, why+": "+f.String())
		return
	}
	if s := f.upstreamStatus; s != 0 && h.policy.releaseOn.has(s) {
		// The upstream's own answer frees the key, as release_on says,
		// though a handler after it (handle_response) then failed.
		h.keeper.release(ctx, key, token, fmt.Sprintf("the upstream answered %d, then %s", s, f.String()))
		return
	}
	kept := h.policy.keepUnknown
	// Observe mode keeps the record in its own namespace, so that the
	// retries are classified as enforce mode would answer them; it warns
	// of nothing and counts in observed_total only.
	enforced := h.policy.mode.traits().enforces
	if enforced {
		countUnknownOutcome(ctx, kept)
	}
	if kept {
		if enforced {
			h.logger.Warn("the upstream's outcome is unknown: the request may have reached it, and no status came back; "+
				"keeping the key as outcome-unknown (every retry is refused until ttl, or until an operator releases it)",
				zap.String("key_hash", key.Hash()), zap.String("failure", f.String()))
		}
		h.keeper.complete(ctx, key, token, &storage.Response{Status: f.answeredStatus(), OutcomeUnknown: true, Detail: detail})
		return
	}
	if enforced {
		h.logger.Warn("the upstream's outcome is unknown: the request may have reached it, and no status came back; "+
			"releasing the key (on_unknown_outcome release): a retry runs again",
			zap.String("key_hash", key.Hash()), zap.String("failure", f.String()))
	}
	h.keeper.release(ctx, key, token, "outcome unknown: "+f.String())
}

// With Caddy's tracing directive on, the request's context carries a
// recording span (OpenTelemetry, which Caddy links already): the handler
// adds its outcome to it (below) and makes a child span of each store
// call (store.go). Without tracing the span is a no-op and each of these
// returns at once.

// traceOutcome adds the outcome, key hash and backend to the request's
// span.
func traceOutcome(ctx context.Context, o outcome, repl *caddy.Replacer, backend string, m *modeTraits) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{
		attribute.String(m.span, string(o)),
		attribute.String("idempotency.backend", backend),
	}
	if kh, ok := repl.GetString(m.keyHash); ok && kh != "" {
		attrs = append(attrs, attribute.String("idempotency.key_hash", kh))
	}
	span.SetAttributes(attrs...)
}

// traceReplay records on the request's span that the answer is a replay of
// the record created at rec.CreatedAt.
func traceReplay(ctx context.Context, rec *storage.Record) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.AddEvent("idempotency.replay", trace.WithAttributes(
		attribute.String("idempotency.record.created_at", rec.CreatedAt.UTC().Format(time.RFC3339Nano))))
}

// replay answers with a recorded response: the headers the outer handlers
// set for the current request (CORS, request ids), changed as the inner
// handlers changed them the first time, the body, and the trailers.
func (x *exchange) replay(rec *storage.Record, how outcome) error {
	h, w, r := x.h, x.w, x.r
	x.answered(how)
	traceReplay(r.Context(), rec)
	resp := rec.Response
	hdr := w.Header()
	trailers := replayHeader(hdr, resp.Header, h.policy.replayHeader, x.values[:0])
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
	if len(differs) == 0 {
		return "this " + h.policy.header + " was already used for a different request; use a new key for a new operation", nil
	}
	var b strings.Builder
	b.Grow(len(h.policy.header) + 128)
	b.WriteString("this ")
	b.WriteString(h.policy.header)
	b.WriteString(" was already used for a request that differs in ")
	for i, d := range differs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(d)
	}
	b.WriteString("; use a new key for a new operation")
	return b.String(), differs
}

// differs names the parts of the request that differ from the recorded
// one, nil when the record cannot say (still in flight, or made before
// records kept request details).
func (h *Handler) differs(r *http.Request, k *keyedRequest, rec *storage.Record) []string {
	if rec == nil {
		return nil
	}
	d, ok := h.policy.fingerprint.Differs(rec.Detail, r.Method, k.path, r.URL.RawQuery, r.Header, k.content)
	if !ok {
		return nil
	}
	return d
}

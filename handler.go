package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

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
// again soon; a full store or client frees room as records expire, which
// the memory store's janitor notices once a minute.
const (
	conflictRetryAfter  = "1"
	storeDownRetryAfter = "1"
	storeFullRetryAfter = "60"
)

// errStoreClosed: the handler's store was closed before the request could
// hold it (its config was unloaded as the request arrived).
var errStoreClosed = errors.New("the idempotency store of this configuration is closed")

// ServeHTTP implements caddyhttp.MiddlewareHandler: the request flow of
// DESIGN.md, one function per answer the client can get. Observe mode has
// its flow of its own (observe.go).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !slices.Contains(h.methods, r.Method) {
		return next.ServeHTTP(w, r)
	}
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if _, taken := repl.Get(placeholderKeyHash); taken {
		// An outer enforcing idempotency handler owns this request's key.
		return next.ServeHTTP(w, r)
	}
	if h.observing {
		if _, seen := repl.Get(placeholderObservedKeyHash); seen {
			return next.ServeHTTP(w, r) // an outer observer classifies it
		}
		return h.observe(w, r, next, repl)
	}

	k, ref := h.keyRequest(r, repl)
	if k != nil {
		defer k.done() // after the next handler: it may read the body
	}
	if ref != nil {
		return h.refuse(w, r, next, repl, ref)
	}

	res, err := h.reserve(r.Context(), k.key, k.fp)
	if err != nil {
		return h.storeFailed(w, r, next, repl, k.key, err)
	}
	how := outcomeReplayed
	if res.Outcome == storage.Conflict {
		if wait, asked := h.waitFor(r); wait > 0 && h.enterWait() {
			how = outcomeWaited
			if asked {
				w.Header().Set("Preference-Applied", preferenceApplied(wait))
			}
			res, err = h.await(r.Context(), k.key, k.fp, res, wait)
			h.leaveWait()
			if err != nil {
				return h.storeFailed(w, r, next, repl, k.key, err)
			}
		}
	}

	switch res.Outcome {
	case storage.Acquired:
		return h.execute(w, r, next, repl, k, res.Token)
	case storage.Mismatch:
		return h.mismatch(w, r, repl, k, res.Record)
	case storage.Conflict:
		w.Header().Set("Retry-After", conflictRetryAfter)
		return h.reject(w, r, repl, outcomeConflict, problemConflict,
			"the first request with this key is still being processed; retry later")
	case storage.Replay:
		return h.replay(w, r, repl, res.Record, how)
	}
	return fmt.Errorf("idempotency store returned unknown outcome %d", res.Outcome)
}

// refuse answers a request that could not be keyed.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, ref *refusal) error {
	switch {
	case ref.outcome == outcomePassed:
		return h.pass(w, r, next, repl)
	case errors.Is(ref.err, errStoreClosed):
		return h.storeFailed(w, r, next, repl, storage.Key{}, ref.err)
	case ref.err != nil:
		return ref.err // a body that could not be read: Caddy answers
	}
	return h.reject(w, r, repl, ref.outcome, ref.problem, ref.detail)
}

// execute runs the next handler for the request that owns its key,
// streams the response to the client while recording it, then completes
// or releases the record.
func (h *Handler) execute(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, k *keyedRequest, token storage.Token) error {
	h.settle(r, repl, outcomeNew)
	metrics.inFlight.Inc()
	defer metrics.inFlight.Dec()
	// What a later 422 needs to tell what differs; taken before the next
	// handler reads the body.
	detail := h.fingerprint.Detail(r.Method, k.path, r.URL.RawQuery, r.Header, k.body.Bytes())
	l := holdLease(h.ops, h.logger, k.key, token, time.Duration(h.lockTimeout))
	// Runs after the record is settled: the write that settles it keeps
	// the lease alive, in aftercare if the store cannot take it at once.
	defer l.stop()
	rec := newRecorder(w, h.maxResponseSize, h.observing)
	defer rec.unbound()

	if !h.observing {
		// The request runs to the end even if the client hangs up: an
		// upstream cancelled half-way may or may not have acted, and its
		// response is what every retry must get. Stored bodies are never
		// content-encoded, so that each replay can be encoded for the
		// client that asks for it. (Observe mode changes nothing.)
		r = r.WithContext(context.WithoutCancel(r.Context()))
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
	err := next.ServeHTTP(rec, r)
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
		h.release(ctx, key, token, "the connection was hijacked")
	case rec.invalid != 0 || !storage.ValidStatus(status):
		h.release(ctx, key, token, fmt.Sprintf("invalid status %d", max(rec.invalid, status)))
	case failure != "" && rec.status == 0:
		h.release(ctx, key, token, failure)
	case h.releaseOn.has(status):
		h.release(ctx, key, token, fmt.Sprintf("status %d", status))
	default:
		resp := &storage.Response{Status: status, Header: header, Body: body, BodyOmitted: omitted, Detail: detail}
		if failure != "" {
			resp.Body, resp.BodyOmitted = nil, true
			h.logger.Warn("the response broke off after its status was sent; recording status and headers without the body",
				zap.String("key_hash", key.Hash()), zap.Int("status", status), zap.String("failure", failure))
		}
		identityBody(resp, h.maxResponseSize)
		h.complete(ctx, key, token, resp)
	}
}

// replay answers with a recorded response: the headers the outer handlers
// set for the current request (CORS, request ids), changed as the inner
// handlers changed them the first time, the body, and the trailers.
func (h *Handler) replay(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, rec *storage.Record, how outcome) error {
	h.settle(r, repl, how)
	traceReplay(r.Context(), rec)
	resp := rec.Response
	hdr := w.Header()
	trailers := replayHeader(hdr, resp.Header)
	if h.replayHeader != "" {
		hdr.Set(h.replayHeader, "true")
	}
	if resp.BodyOmitted {
		hdr.Del("Content-Length")
		hdr.Set(bodyOmittedHeader, "true")
	} else if len(trailers) > 0 {
		hdr.Del("Content-Length") // trailers need a chunked body
		hdr["Trailer"] = []string{strings.Join(trailers, ", ")}
	}
	w.WriteHeader(resp.Status)
	if r.Method != http.MethodHead && len(resp.Body) > 0 {
		_, _ = w.Write(resp.Body) // a client gone mid-replay loses nothing
	}
	if !resp.BodyOmitted {
		for _, name := range trailers {
			hdr[name] = resp.Header[http.TrailerPrefix+name]
		}
	}
	return nil
}

// mismatch answers a request that reuses a key for another request with a
// 422 that names what differs (never a value), when the record says.
func (h *Handler) mismatch(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, k *keyedRequest, rec *storage.Record) error {
	detail := fmt.Sprintf("this %s was already used for a different request; use a new key for a new operation", h.header)
	differs := h.differs(r, k, rec)
	if len(differs) > 0 {
		detail = fmt.Sprintf("this %s was already used for a request that differs in %s; use a new key for a new operation",
			h.header, strings.Join(differs, ", "))
	}
	return h.rejectWith(w, r, repl, outcomeMismatch, problemMismatch, detail, differs)
}

// differs names the parts of the request that differ from the recorded
// one, nil when the record cannot say (still in flight, or made before
// records kept request details).
func (h *Handler) differs(r *http.Request, k *keyedRequest, rec *storage.Record) []string {
	if rec == nil {
		return nil
	}
	d, ok := h.fingerprint.Differs(rec.Detail, r.Method, k.path, r.URL.RawQuery, r.Header, k.body.Bytes())
	if !ok {
		return nil
	}
	return d
}

// storeFailed answers when the store could not be used.
func (h *Handler) storeFailed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, key storage.Key, err error) error {
	switch {
	case errors.Is(err, storage.ErrScopeFull):
		h.logger.Warn("a client holds as many idempotency keys as it may; rejecting a new key", zap.String("key_hash", key.Hash()))
		w.Header().Set("Retry-After", storeFullRetryAfter)
		return h.reject(w, r, repl, outcomeTooManyKeys, problemTooManyKeys,
			"too many keys in flight or recorded for this client; retry later")
	case errors.Is(err, storage.ErrFull):
		h.logger.Error("idempotency store is full; rejecting a new key", zap.String("key_hash", key.Hash()))
		w.Header().Set("Retry-After", storeFullRetryAfter)
		return h.reject(w, r, repl, outcomeStoreError, problemStoreFull,
			"too many requests are being tracked; retry later")
	case h.onStorageError == failOpen && storage.Unavailable(err):
		// Only a store that cannot be reached or is too slow is passed
		// by: an error that proves it answered (a corrupt record, a
		// refused write) fails closed.
		h.logger.Warn("idempotency store unavailable; passing the request on without idempotency (fail_open)",
			zap.String("backend", h.backendName), zap.String("key_hash", key.Hash()), zap.Error(err))
		h.settle(r, repl, outcomeStoreError)
		return next.ServeHTTP(w, r)
	}
	h.logger.Error("idempotency store unavailable; rejecting the request (fail_closed)",
		zap.String("backend", h.backendName), zap.String("key_hash", key.Hash()), zap.Error(err))
	w.Header().Set("Retry-After", storeDownRetryAfter)
	return h.reject(w, r, repl, outcomeStoreError, problemStoreDown,
		"the request was not processed; retry later with the same key")
}

// reject answers with a problem and records the outcome.
func (h *Handler) reject(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, o outcome, p problem, detail string) error {
	return h.rejectWith(w, r, repl, o, p, detail, nil)
}

// rejectWith is reject with the differs of a 422. With errors
// handle_errors the problem goes to the site's error routes instead.
func (h *Handler) rejectWith(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, o outcome, p problem, detail string, differs []string) error {
	h.settle(r, repl, o)
	repl.Set(placeholderProblem, p.typeURI())
	if h.errors == errorsHandleErrors {
		return caddyhttp.Error(p.status, errors.New(detail))
	}
	return writeProblem(w, h.docsURL, p, detail, differs)
}

// reserve claims key for this request. A reservation that an earlier
// request of this handler abandoned (its Reserve failed, yet may have been
// written) is released on the spot when it is what holds the key: the
// client was told 503 and invited to retry. Store calls outlive the
// client: a reservation made for a client that hung up mid-call must
// still be answered for.
func (h *Handler) reserve(ctx context.Context, key storage.Key, fp []byte) (storage.Reservation, error) {
	ctx = context.WithoutCancel(ctx)
	lease := time.Duration(h.lockTimeout)
	res, err := h.ops.Reserve(ctx, key, fp, lease)
	if err == nil && res.Outcome == storage.Conflict && h.aftercare.reclaim(key) {
		res, err = h.ops.Reserve(ctx, key, fp, lease)
	}
	if err != nil {
		h.abandon(key, res.Token, err)
	}
	return res, err
}

// complete records resp as the answer for key; if the store fails, it
// keeps trying in the background, keeping the lease that ctx carries
// alive meanwhile.
func (h *Handler) complete(ctx context.Context, key storage.Key, token storage.Token, resp *storage.Response) {
	l := leaseFrom(ctx)
	l.settle()
	err := h.ops.Complete(context.WithoutCancel(ctx), key, token, resp, time.Duration(h.ttl))
	switch {
	case err == nil:
	case errors.Is(err, storage.ErrLeaseLost):
		h.logger.Warn("idempotency lease was lost before the response could be recorded; a retry may run again",
			zap.String("key_hash", key.Hash()))
	case errors.Is(err, storage.ErrInvalid):
		// Retrying a write the store refuses for what it is would only
		// keep the key in flight for longer: its lease lapses.
		h.logger.Error("the idempotency store refused the response; its key stays in flight until its lease lapses, and a retry after that runs again",
			zap.String("backend", h.backendName), zap.String("key_hash", key.Hash()), zap.Error(err))
	default:
		h.logger.Error("recording idempotent response failed; retrying in the background",
			zap.String("backend", h.backendName), zap.String("key_hash", key.Hash()), zap.Error(err))
		h.aftercare.add(&chore{kind: choreComplete, key: key, token: token, resp: resp, ttl: time.Duration(h.ttl), until: h.aftercareDeadline(), lease: l.keep()})
	}
}

// release frees key so that a retry runs again; if the store fails, it
// keeps trying in the background, keeping the lease that ctx carries
// alive meanwhile (so that retries get 409, as they would from a request
// still running, until the key is free).
func (h *Handler) release(ctx context.Context, key storage.Key, token storage.Token, why string) {
	l := leaseFrom(ctx)
	l.settle()
	err := h.ops.Release(context.WithoutCancel(ctx), key, token)
	switch {
	case err == nil:
		if c := h.logger.Check(zapcore.DebugLevel, "idempotency key released"); c != nil {
			c.Write(zap.String("key_hash", key.Hash()), zap.String("reason", why))
		}
	case errors.Is(err, storage.ErrLeaseLost):
		// Someone else holds the key now; nothing of ours to free.
	default:
		h.logger.Error("releasing idempotency key failed; retrying in the background",
			zap.String("backend", h.backendName), zap.String("key_hash", key.Hash()), zap.String("reason", why), zap.Error(err))
		h.aftercare.add(&chore{kind: choreRelease, key: key, token: token, until: h.aftercareDeadline(), lease: l.keep()})
	}
}

// abandon removes, once the store answers again, the reservation that a
// failed Reserve may have written after all (its outcome is unknown), so
// that the retry the client was invited to make is not met by a 409 for
// a whole lease.
func (h *Handler) abandon(key storage.Key, token storage.Token, err error) {
	if token == 0 || errors.Is(err, storage.ErrFull) || errors.Is(err, storage.ErrScopeFull) {
		return
	}
	h.aftercare.add(&chore{kind: choreAbandon, key: key, token: token, until: time.Now().Add(time.Duration(h.lockTimeout))})
}

// aftercareDeadline is how long a write that failed after the upstream ran
// is retried, its lease renewed meanwhile: at least a lease, and a minute,
// so that a store outage a renewal cannot bridge either ends with the
// record written (the stores keep a lapsed in-flight record that nobody
// took over and still let its owner complete it).
func (h *Handler) aftercareDeadline() time.Time {
	return time.Now().Add(max(time.Duration(h.lockTimeout), time.Minute))
}

package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
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
// DESIGN.md, one function per answer the client can get.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !slices.Contains(h.methods, r.Method) {
		return next.ServeHTTP(w, r)
	}
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if _, taken := repl.Get(placeholderKeyHash); taken {
		// An outer idempotency handler owns this request's key.
		return next.ServeHTTP(w, r)
	}

	values := r.Header[h.headerKey]
	if len(values) == 0 {
		if h.Required {
			return h.reject(w, r, repl, outcomeMissing, problemKeyMissing,
				fmt.Sprintf("this endpoint requires an %s header with a unique key per operation", h.Header))
		}
		return h.pass(w, r, next, repl)
	}
	id, err := fingerprint.ParseKey(values, h.MaxKeyLength)
	if err != nil {
		return h.reject(w, r, repl, outcomeInvalid, problemKeyInvalid, err.Error())
	}
	scope, ok := h.scope.evaluate(repl)
	if !ok {
		return h.reject(w, r, repl, outcomeInvalid, problemKeyInvalid,
			"the request carries no client identity to scope the key to")
	}
	key := storage.Key{Scope: hashHex(scope), ID: id}
	repl.Set(placeholderKeyHash, key.Hash())

	// Hold the store before reading the body: a reload that replaces the
	// storage config while a slow client uploads must not close it under
	// the request.
	unhold, ok := h.holdStore()
	if !ok {
		return h.storeFailed(w, r, next, repl, key, errStoreClosed)
	}
	defer unhold()

	body, err := readBody(r, h.MaxBodySize)
	if errors.Is(err, errBodyTooLarge) {
		return h.reject(w, r, repl, outcomeTooLarge, problemTooLarge,
			fmt.Sprintf("requests with an %s may carry at most %d bytes", h.Header, h.MaxBodySize))
	}
	if err != nil {
		return err
	}
	defer body.Close()

	var sum [fingerprint.Size]byte
	fp, canonical := h.fingerprint.SumJSON(sum[:0], r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header, body.Bytes())
	if !canonical && h.fingerprint.CanonicalJSON() && body.Len() > 0 && fingerprint.DeclaresJSON(r.Header) && !json.Valid(body.Bytes()) {
		// A body that says it is JSON and is not cannot be compared by
		// meaning, and no JSON upstream can act on it: refuse it here,
		// before anything is stored.
		return h.reject(w, r, repl, outcomeInvalid, problemBodyNotJSON,
			"the request body is declared as JSON but is not valid JSON")
	}

	res, err := h.reserve(r.Context(), key, fp)
	if err != nil {
		return h.storeFailed(w, r, next, repl, key, err)
	}
	how := outcomeReplayed
	if res.Outcome == storage.Conflict && h.InFlight == inFlightWait {
		how = outcomeWaited
		if res, err = h.await(r.Context(), key, fp, res); err != nil {
			return h.storeFailed(w, r, next, repl, key, err)
		}
	}

	switch res.Outcome {
	case storage.Acquired:
		return h.execute(w, r, next, repl, key, res.Token)
	case storage.Mismatch:
		return h.reject(w, r, repl, outcomeMismatch, problemMismatch,
			fmt.Sprintf("this %s was already used for a different request; use a new key for a new operation", h.Header))
	case storage.Conflict:
		w.Header().Set("Retry-After", conflictRetryAfter)
		return h.reject(w, r, repl, outcomeConflict, problemConflict,
			"the first request with this key is still being processed; retry later")
	case storage.Replay:
		return h.replay(w, r, repl, res.Record.Response, how)
	}
	return fmt.Errorf("idempotency store returned unknown outcome %d", res.Outcome)
}

// execute runs the next handler for the request that owns key, streams its
// response to the client while recording it, then completes or releases
// the record.
func (h *Handler) execute(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, key storage.Key, token storage.Token) error {
	h.settle(r, repl, outcomeNew)
	metrics.inFlight.Inc()
	defer metrics.inFlight.Dec()
	l := holdLease(h.ops, h.logger, key, token, time.Duration(h.LockTimeout))
	rec := newRecorder(w, h.MaxResponseSize)

	// The request runs to the end even if the client hangs up: an upstream
	// cancelled half-way may or may not have acted, and its response is
	// what every retry must get. Stored bodies are never content-encoded,
	// so that each replay can be encoded for the client that asks for it.
	r = r.WithContext(context.WithoutCancel(r.Context()))
	r.Header.Set("Accept-Encoding", "identity")

	// A panic is not recovered, so that it keeps its stack trace; the
	// deferred call settles the record on the way out.
	finished := false
	defer func() {
		if !finished {
			l.stop()
			h.finish(key, token, rec, "the handler panicked")
		}
	}()
	err := next.ServeHTTP(rec, r)
	finished = true
	l.stop()
	failure := ""
	if err != nil {
		failure = "the handler failed: " + err.Error()
	}
	h.finish(key, token, rec, failure)
	return err
}

// finish completes or releases the record of a request once the next
// handler has returned or panicked (failure says which, "" when it
// returned nil). The rule: once a final status outside release_on was
// sent, the upstream has acted and must never run again for this key, so
// the record is completed; when the response is incomplete (an error or
// a panic after the status, such as reverse_proxy's http.ErrAbortHandler
// when the upstream broke off mid-body), with its body omitted. Before
// any final status, a failure frees the key for the retry.
func (h *Handler) finish(key storage.Key, token storage.Token, rec *recorder, failure string) {
	status, header, body, omitted := rec.response()
	switch {
	case rec.hijacked:
		h.release(key, token, "the connection was hijacked")
	case failure != "" && rec.status == 0:
		h.release(key, token, failure)
	case h.releaseOn.has(status):
		h.release(key, token, fmt.Sprintf("status %d", status))
	default:
		resp := &storage.Response{Status: status, Header: header, Body: body, BodyOmitted: omitted}
		if failure != "" {
			resp.Body, resp.BodyOmitted = nil, true
			h.logger.Warn("the response broke off after its status was sent; recording status and headers without the body",
				zap.String("key_hash", key.Hash()), zap.Int("status", status), zap.String("failure", failure))
		}
		h.complete(key, token, resp)
	}
}

// replay answers with a recorded response. Headers that handlers outside
// this one set for the current request (CORS, request ids) stay as they
// are; the recorded ones fill in the rest.
func (h *Handler) replay(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, resp *storage.Response, how outcome) error {
	h.settle(r, repl, how)
	hdr := w.Header()
	for name, values := range resp.Header {
		if _, outer := hdr[name]; outer {
			continue
		}
		// Clipped, so that an outer handler appending a value copies the
		// slice instead of writing into the stored record.
		hdr[name] = values[:len(values):len(values)]
	}
	if h.replayHeader != "" {
		hdr.Set(h.replayHeader, "true")
	}
	if resp.BodyOmitted {
		hdr.Del("Content-Length")
		hdr.Set(bodyOmittedHeader, "true")
	}
	w.WriteHeader(resp.Status)
	if r.Method != http.MethodHead && len(resp.Body) > 0 {
		_, _ = w.Write(resp.Body) // a client gone mid-replay loses nothing
	}
	return nil
}

// reserve claims key for this request. A reservation that an earlier
// request of this handler abandoned (its Reserve failed, yet may have been
// written) is released on the spot when it is what holds the key: the
// client was told 503 and invited to retry. Store calls outlive the
// client: a reservation made for a client that hung up mid-call must
// still be answered for.
func (h *Handler) reserve(ctx context.Context, key storage.Key, fp []byte) (storage.Reservation, error) {
	ctx = context.WithoutCancel(ctx)
	lease := time.Duration(h.LockTimeout)
	res, err := h.ops.Reserve(ctx, key, fp, lease)
	if err == nil && res.Outcome == storage.Conflict && h.aftercare.reclaim(key) {
		res, err = h.ops.Reserve(ctx, key, fp, lease)
	}
	if err != nil {
		h.abandon(key, res.Token, err)
	}
	return res, err
}

// await blocks while the first request with key runs, for wait_timeout
// at most, and returns what the store holds then: a Replay when it
// completed, Acquired when it released the key (this request runs
// instead), still Conflict on timeout.
func (h *Handler) await(ctx context.Context, key storage.Key, fp []byte, res storage.Reservation) (storage.Reservation, error) {
	deadline := time.Now().Add(time.Duration(h.WaitTimeout))
	pause := 10 * time.Millisecond
	for res.Outcome == storage.Conflict {
		remaining := time.Until(deadline)
		if remaining <= 0 || ctx.Err() != nil {
			return res, nil
		}
		if h.waiter == nil || h.waiter.Wait(ctx, key, min(remaining, time.Second)) != nil {
			// No notifications (or they failed): poll with backoff.
			sleep(ctx, min(pause, remaining))
			pause = min(2*pause, 250*time.Millisecond)
		}
		var err error
		if res, err = h.reserve(ctx, key, fp); err != nil {
			return res, err
		}
	}
	return res, nil
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
	case h.OnStorageError == failOpen:
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

// reject answers with a problem response and records the outcome.
func (h *Handler) reject(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, o outcome, p problem, detail string) error {
	h.settle(r, repl, o)
	return writeProblem(w, h.DocsURL, p, detail)
}

// complete records resp as the answer for key; if the store fails, it
// keeps trying in the background.
func (h *Handler) complete(key storage.Key, token storage.Token, resp *storage.Response) {
	err := h.ops.Complete(context.Background(), key, token, resp, time.Duration(h.TTL))
	switch {
	case err == nil:
	case errors.Is(err, storage.ErrLeaseLost):
		h.logger.Warn("idempotency lease was lost before the response could be recorded; a retry may run again",
			zap.String("key_hash", key.Hash()))
	default:
		h.logger.Error("recording idempotent response failed; retrying in the background",
			zap.String("backend", h.backendName), zap.String("key_hash", key.Hash()), zap.Error(err))
		h.aftercare.add(&chore{kind: choreComplete, key: key, token: token, resp: resp, ttl: time.Duration(h.TTL), until: h.aftercareDeadline()})
	}
}

// release frees key so that a retry runs again; if the store fails, it
// keeps trying in the background.
func (h *Handler) release(key storage.Key, token storage.Token, why string) {
	err := h.ops.Release(context.Background(), key, token)
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
		h.aftercare.add(&chore{kind: choreRelease, key: key, token: token, until: h.aftercareDeadline()})
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
	h.aftercare.add(&chore{kind: choreAbandon, key: key, token: token, until: time.Now().Add(time.Duration(h.LockTimeout))})
}

// aftercareDeadline is how long a write that failed after the upstream ran
// is retried: past the lease, because the stores keep a lapsed in-flight
// record that nobody took over and still let its owner complete it.
func (h *Handler) aftercareDeadline() time.Time {
	return time.Now().Add(max(time.Duration(h.LockTimeout), time.Minute))
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

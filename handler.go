package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Outcomes of a request, as set in {http.idempotency.outcome}.
const (
	outcomeNew        = "new"         // ran the next handler under a fresh key
	outcomeReplayed   = "replayed"    // answered with the recorded response
	outcomeWaited     = "waited"      // waited for the first request, then replayed it
	outcomeConflict   = "conflict"    // 409: the first request is still running
	outcomeMismatch   = "mismatch"    // 422: the key was used for another request
	outcomeMissing    = "missing"     // 400: no key where one is required
	outcomeInvalid    = "invalid"     // 400: malformed key or no client scope
	outcomeTooLarge   = "too_large"   // 413: body over max_body_size
	outcomeStoreError = "store_error" // the store failed: 503, or passed on with fail_open
	outcomePassed     = "passed"      // no key: passed on without idempotency
)

// Placeholders set on every request this handler owns.
const (
	placeholderOutcome = "http.idempotency.outcome"
	placeholderKeyHash = "http.idempotency.key_hash"
)

// bodyOmittedHeader marks replays of responses whose body was too large
// to record.
const bodyOmittedHeader = "Idempotent-Body-Omitted"

// conflictRetryAfter is the Retry-After of a 409, in seconds: most requests
// finish well within it, and a client polling once a second is cheap.
const conflictRetryAfter = "1"

// ServeHTTP implements caddyhttp.MiddlewareHandler: the request flow of
// DESIGN.md, one function per answer the client can get.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !slices.Contains(h.methods, r.Method) {
		return next.ServeHTTP(w, r)
	}
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if _, owned := repl.Get(placeholderOutcome); owned {
		// An outer idempotency handler already owns this request.
		return next.ServeHTTP(w, r)
	}

	values := r.Header[h.headerKey]
	if len(values) == 0 {
		if h.Required {
			return h.reject(w, r, repl, outcomeMissing, problemKeyMissing,
				fmt.Sprintf("this endpoint requires an %s header with a unique key per operation", h.Header))
		}
		h.settle(r, repl, outcomePassed)
		return next.ServeHTTP(w, r)
	}
	id, err := fingerprint.ParseKey(values, h.MaxKeyLength)
	if err != nil {
		return h.reject(w, r, repl, outcomeInvalid, problemKeyInvalid, h.keyDetail(err))
	}
	scope := repl.ReplaceAll(h.Scope, "")
	if strings.TrimSpace(scope) == "" {
		return h.reject(w, r, repl, outcomeInvalid, problemKeyInvalid,
			"the request carries no client identity to scope the key to")
	}
	key := storage.Key{Scope: hashHex(scope), ID: id}
	repl.Set(placeholderKeyHash, keyHash(key))

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
	if !canonical && h.fingerprint.CanonicalJSON() && body.Len() > 0 && declaresJSON(r.Header) && !json.Valid(body.Bytes()) {
		// A body that says it is JSON and is not cannot be compared by
		// meaning, and no JSON upstream can act on it: refuse it here,
		// before anything is stored.
		return h.reject(w, r, repl, outcomeInvalid, problemBodyNotJSON,
			"the request body is declared as JSON but is not valid JSON")
	}

	if h.pooled != nil {
		// A reload may drop this handler's store while the request runs.
		defer h.pooled.hold()()
	}

	// Store calls outlive the client: a reservation made for a client that
	// hung up mid-call must still be answered for.
	ctx := context.WithoutCancel(r.Context())
	res, err := h.ops.Reserve(ctx, key, fp, time.Duration(h.LockTimeout))
	if err != nil {
		return h.storeFailed(w, r, next, repl, key, err)
	}
	outcome := outcomeReplayed
	if res.Outcome == storage.Conflict && h.InFlight == inFlightWait {
		outcome = outcomeWaited
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
		return h.replay(w, r, repl, res.Record.Response, outcome)
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
	l := h.holdLease(key, token)
	rec := newRecorder(w, h.MaxResponseSize)

	// The request runs to the end even if the client hangs up: an upstream
	// cancelled half-way may or may not have acted, and its response is
	// what every retry must get. Stored bodies are never content-encoded,
	// so that each replay can be encoded for the client that asks for it.
	r = r.WithContext(context.WithoutCancel(r.Context()))
	r.Header.Set("Accept-Encoding", "identity")

	finished := false
	defer func() {
		if !finished { // a panic: free the key and let the panic go on
			l.stop()
			h.release(key, token, "handler panicked")
		}
	}()
	err := next.ServeHTTP(rec, r)
	finished = true
	l.stop()

	status, header, respBody, omitted := rec.response()
	switch {
	case rec.hijacked:
		h.release(key, token, "connection hijacked")
	case err != nil && rec.status == 0:
		h.release(key, token, "handler error")
	case h.releaseOn.has(status):
		h.release(key, token, fmt.Sprintf("status %d", status))
	default:
		// A response was sent with a status that counts as done. If the
		// handler failed half-way through the body, the effect happened all
		// the same: keep status and headers, never run it again.
		resp := &storage.Response{Status: status, Header: header, Body: respBody, BodyOmitted: omitted}
		if err != nil {
			resp.Body, resp.BodyOmitted = nil, true
		}
		h.complete(key, token, resp)
	}
	return err
}

// replay answers with a recorded response.
func (h *Handler) replay(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, resp *storage.Response, outcome string) error {
	h.settle(r, repl, outcome)
	hdr := w.Header()
	for name, values := range resp.Header {
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

// await blocks while the first request with key runs, for wait_timeout
// at most, and returns what the store holds then: a Replay when it
// completed, Acquired when it released the key (this request runs
// instead), still Conflict on timeout.
func (h *Handler) await(ctx context.Context, key storage.Key, fp []byte, res storage.Reservation) (storage.Reservation, error) {
	deadline := time.Now().Add(time.Duration(h.WaitTimeout))
	pause := 10 * time.Millisecond
	storeCtx := context.WithoutCancel(ctx)
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
		if res, err = h.ops.Reserve(storeCtx, key, fp, time.Duration(h.LockTimeout)); err != nil {
			return res, err
		}
	}
	return res, nil
}

// storeFailed answers when the store could not be used.
func (h *Handler) storeFailed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, key storage.Key, err error) error {
	if errors.Is(err, storage.ErrFull) {
		h.logger.Error("idempotency store is full; rejecting a new key", zap.String("key_hash", keyHash(key)))
		return h.reject(w, r, repl, outcomeStoreError, problemStoreFull,
			"too many requests are being tracked; retry later")
	}
	if h.OnStorageError == failOpen {
		h.logger.Warn("idempotency store unavailable; passing the request on without idempotency (fail_open)",
			zap.String("backend", h.backend), zap.String("key_hash", keyHash(key)), zap.Error(err))
		h.settle(r, repl, outcomeStoreError)
		return next.ServeHTTP(w, r)
	}
	h.logger.Error("idempotency store unavailable; rejecting the request (fail_closed)",
		zap.String("backend", h.backend), zap.String("key_hash", keyHash(key)), zap.Error(err))
	return h.reject(w, r, repl, outcomeStoreError, problemStoreDown,
		"the request was not processed; retry later with the same key")
}

// reject answers with a problem response and records the outcome.
func (h *Handler) reject(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, outcome string, p problem, detail string) error {
	h.settle(r, repl, outcome)
	return h.writeProblem(w, p, detail)
}

// settle records how the handler answers a request it owns: in the
// {http.idempotency.outcome} placeholder (which also marks the request as
// owned, for inner idempotency handlers), the requests counter, the access
// log and a debug log.
func (h *Handler) settle(r *http.Request, repl *caddy.Replacer, outcome string) {
	repl.Set(placeholderOutcome, outcome)
	countOutcome(outcome)
	kh, _ := repl.GetString(placeholderKeyHash)
	if extra, ok := r.Context().Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields); ok {
		extra.Add(zap.String("idempotency_outcome", outcome))
		if kh != "" {
			extra.Add(zap.String("idempotency_key_hash", kh))
		}
	}
	if c := h.logger.Check(zapcore.DebugLevel, "idempotency outcome"); c != nil {
		c.Write(zap.String("outcome", outcome), zap.String("key_hash", kh))
	}
}

// complete records resp as the answer for key.
func (h *Handler) complete(key storage.Key, token storage.Token, resp *storage.Response) {
	err := h.ops.Complete(context.Background(), key, token, resp, time.Duration(h.TTL))
	switch {
	case errors.Is(err, storage.ErrLeaseLost):
		h.logger.Warn("idempotency lease was lost before the response could be recorded; a retry may run again",
			zap.String("key_hash", keyHash(key)))
	case err != nil:
		h.logger.Error("recording idempotent response; the key stays in flight until its lease lapses",
			zap.String("backend", h.backend), zap.String("key_hash", keyHash(key)), zap.Error(err))
	}
}

// release frees key so that a retry runs again.
func (h *Handler) release(key storage.Key, token storage.Token, why string) {
	err := h.ops.Release(context.Background(), key, token)
	switch {
	case errors.Is(err, storage.ErrLeaseLost):
		// Someone else holds the key now; nothing of ours to free.
	case err != nil:
		h.logger.Error("releasing idempotency key; it stays in flight until its lease lapses",
			zap.String("backend", h.backend), zap.String("key_hash", keyHash(key)), zap.String("reason", why), zap.Error(err))
	default:
		if c := h.logger.Check(zapcore.DebugLevel, "idempotency key released"); c != nil {
			c.Write(zap.String("key_hash", keyHash(key)), zap.String("reason", why))
		}
	}
}

// declaresJSON reports whether the request's Content-Type is JSON
// (application/json or any +json type).
func declaresJSON(h http.Header) bool {
	ct := h.Get("Content-Type")
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// keyDetail turns a key parsing error into the detail of a 400.
func (h *Handler) keyDetail(err error) string {
	var ke *fingerprint.KeyError
	if errors.As(err, &ke) {
		return ke.Error()
	}
	return err.Error()
}

// hashHex returns the hex SHA-256 of s: how scopes reach the store.
func hashHex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// keyHash names a record in logs, placeholders and the admin API without
// revealing the key or the client: a short hash of scope and key.
func keyHash(key storage.Key) string {
	var stack [512]byte
	in := append(stack[:0], key.Scope...)
	in = append(in, 0)
	in = append(in, key.ID...)
	sum := sha256.Sum256(in)
	return hex.EncodeToString(sum[:8])
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

package idempotency

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// observe is the request flow of mode observe: every request reaches the
// next handler as if this handler were absent, and the outcome it would
// have had in enforce mode is only recorded (settle counts it in
// observed_total). The store is used as in enforce mode for the first
// request with a key, which runs under a lease and is recorded; a later
// request is classified against that record and runs untracked, never
// touching it. A failing store changes nothing for the request.
func (h *Handler) observe(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer) error {
	k, ref := h.keyRequest(r, repl)
	if k != nil {
		defer k.done() // after the next handler, which reads the body
	}
	if ref != nil {
		if ref.outcome == outcomePassed {
			return h.pass(w, r, next, repl)
		}
		// A body that could not be read, or was over max_body_size, was
		// put back for the next handler (readBody); one that was read
		// whole is the next handler's to read (k.body).
		h.settle(r, repl, ref.outcome)
		return next.ServeHTTP(w, r)
	}

	res, err := h.reserve(r.Context(), k.key, k.fp)
	switch {
	case errors.Is(err, storage.ErrScopeFull):
		h.settle(r, repl, outcomeTooManyKeys)
	case err != nil:
		h.settle(r, repl, outcomeStoreError)
	case res.Outcome == storage.Acquired:
		return h.execute(w, r, next, repl, k, res.Token)
	case res.Outcome == storage.Mismatch:
		h.settle(r, repl, outcomeMismatch)
	case res.Outcome == storage.Conflict:
		h.settle(r, repl, outcomeConflict)
	case res.Outcome == storage.Replay:
		h.settle(r, repl, outcomeReplayed)
	}
	return next.ServeHTTP(w, r)
}

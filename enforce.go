package idempotency

import (
	"errors"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// enforcing is mode enforce: the handler answers as the contract says.
type enforcing struct{}

var enforceTraits = modeTraits{
	name:    modeEnforce,
	keyHash: placeholderKeyHash, outcomeField: "idempotency_outcome", hashField: "idempotency_key_hash",
	span:     "idempotency.outcome",
	counted:  countOutcome,
	answers:  true,
	waits:    true,
	detaches: true,
}

func (enforcing) traits() *modeTraits { return &enforceTraits }

// carryOut answers the request as a says: runs it, replays its record,
// refuses it with a problem, or hands it on (no key, fail_open).
func (enforcing) carryOut(x *exchange, a answer) error {
	h := x.h
	if a.action == actReject {
		// The id the problem's instance, the access log and the log
		// line below all carry.
		x.requestID, _ = x.repl.GetString("http.request.uuid")
	}
	if a.level != logNone {
		fields := []zap.Field{zap.String("key_hash", x.keyHash())}
		if x.requestID != "" {
			fields = append(fields, zap.String("request_id", x.requestID))
		}
		if a.err != nil {
			fields = append(fields, zap.String("backend", h.backendName), zap.Error(a.err))
		}
		if a.outcome == outcomeStoreError {
			// At most a line a second per store, with a count (storelog.go).
			storeErrors.log(h.keeper.store.store, h.logger, a.level, a.msg, fields)
		} else {
			h.logger.Log(a.level, a.msg, fields...)
		}
	}
	switch a.action {
	case actRun:
		return x.execute(x.res.Token)
	case actReplay:
		return x.replay(x.res.Record, a.outcome)
	case actPass:
		if a.outcome == outcomePassed {
			return enforcing{}.pass(x)
		}
		x.settle(a.outcome) // fail_open
		metricsOf(x.r).failOpen.Inc()
		return x.next.ServeHTTP(x.w, x.r)
	case actFail:
		return a.err
	}
	if a.retryAfter != "" {
		x.w.Header().Set("Retry-After", a.retryAfter)
	}
	var differs []string
	if a.outcome == outcomeMismatch {
		a.detail, differs = h.mismatchDetail(x.r, x.k, x.res.Record)
	}
	x.settle(a.outcome)
	x.repl.Set(placeholderProblem, a.problem.typeURI())
	if h.policy.errors == errorsHandleErrors {
		// The problem goes to the site's error routes instead.
		return caddyhttp.Error(a.problem.status, errors.New(a.detail))
	}
	return writeProblem(x.w, h.policy.docsURL, a.problem, a.detail, differs, x.requestID)
}

// pass hands a request that carries no key to the next handler. An inner
// idempotency handler may still take it (its own rules apply, `required`
// included): the request counts as passed only if no enforcing handler
// took it, and only once however many handlers passed it on.
func (enforcing) pass(x *exchange) error {
	w, r, next, repl := x.w, x.r, x.next, x.repl
	if _, outer := repl.Get(placeholderPassing); outer {
		return next.ServeHTTP(w, r) // an outer handler passed it on and counts it
	}
	repl.Set(placeholderPassing, true)
	err := next.ServeHTTP(w, r)
	if _, settled := repl.Get(placeholderSettled); !settled {
		x.settle(outcomePassed)
	}
	return err
}

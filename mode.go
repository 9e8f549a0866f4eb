package idempotency

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// mode is how a handler acts on the answer to a request (answer.go):
// enforce answers as the contract says (enforcing, below); observe lets
// every request through as if the handler were absent and only records
// what enforce would have done (observing, below). The rest of the
// request flow is the same in both; what differs is here, as the mode's
// methods and its traits.
type mode interface {
	// carryOut acts on the answer to x's request.
	carryOut(x *exchange, a answer) error
	// pass hands on a request that carries no key.
	pass(x *exchange) error
	// traits are the values that tell the mode's requests apart.
	traits() *modeTraits
}

// modeTraits are what a mode's requests carry and are counted by, kept
// apart so that an observing handler never changes what an enforcing one
// nested with it sees.
type modeTraits struct {
	name string // the mode option's value

	// keyHash is the placeholder that carries the request's key hash;
	// outcomeField and hashField are the access log's fields of the
	// outcome and the key hash; span is the span attribute of the
	// outcome.
	keyHash, outcomeField, hashField, span string
	// scopePrefix starts the scope of the mode's records, so that an
	// observing handler's records never look like an enforcing one's in
	// a shared store (scope.go).
	scopePrefix string
	// counted is the requests counter of the mode, by outcome.
	counted func(r *http.Request, o outcome)

	// enforces: the mode answers for its requests as the contract says
	// (placeholderSettled; the outermost enforcing handler that passed a
	// request on counts it as passed only when no handler did); a request
	// that finds its key in flight may wait for it; the request that owns
	// its key runs to the end even if its client hangs up, and asks for a
	// body that is not content-encoded (exchange.execute). Otherwise the
	// mode only watches: it answers nothing, waits for nothing, and its
	// recorder neither bounds writes to the client nor refuses a status
	// (recorder.go).
	enforces bool
}

// taken reports whether an outer idempotency handler owns the request
// already: an enforcing one that took its key, for every handler; an
// observing one, for an observing handler (it classifies the request).
func taken(m mode, repl *caddy.Replacer) bool {
	if _, ok := repl.Get(placeholderKeyHash); ok {
		return true
	}
	_, ok := repl.Get(m.traits().keyHash)
	return ok
}

// enforcing is mode enforce: the handler answers as the contract says.
type enforcing struct{}

var enforceTraits = modeTraits{
	name:    modeEnforce,
	keyHash: placeholderKeyHash, outcomeField: "idempotency_outcome", hashField: "idempotency_key_hash",
	span:     "idempotency.outcome",
	counted:  countOutcome,
	enforces: true,
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
			// At most a line a second per store, with a count (store.go).
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
		x.answered(a.outcome) // fail_open
		metricsOf(x.r).failOpen.Inc()
		return x.next.ServeHTTP(x.w, x.r)
	case actFail:
		return a.err
	}
	// The problem's header values, in the exchange's array (a rejected
	// request replays nothing, so it is free).
	vals := x.values[:0]
	if a.retryAfter != "" {
		vals = append(vals, a.retryAfter)
		x.w.Header()["Retry-After"] = vals[0:1:1]
	}
	if a.acceptEncoding != "" {
		x.w.Header().Set("Accept-Encoding", a.acceptEncoding)
	}
	var differs []string
	if a.outcome == outcomeMismatch {
		a.detail, differs = h.mismatchDetail(x.r, x.k, x.res.Record)
	}
	x.answered(a.outcome)
	x.repl.Set(placeholderProblem, a.problem.typValue)
	if h.policy.errorRoutes {
		// The problem goes to the site's error routes instead.
		return caddyhttp.Error(a.problem.status, errors.New(a.detail))
	}
	return writeProblem(x.w, h.policy.docsURL, a.problem, a.detail, differs, x.requestID, vals[len(vals):])
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
		x.answered(outcomePassed)
	}
	return err
}

// observing is mode observe: the handler measures before enforcing.
type observing struct{}

var observeTraits = modeTraits{
	name:    modeObserve,
	keyHash: placeholderObservedKeyHash, outcomeField: "idempotency_observed", hashField: "idempotency_observed_key_hash",
	span:        "idempotency.observed",
	scopePrefix: observedScopePrefix,
	counted:     countObserved,
}

func (observing) traits() *modeTraits { return &observeTraits }

// carryOut carries out the answer in mode observe: every request reaches
// the next handler as if this handler were absent, and the outcome it
// would have had in enforce mode is only recorded (settle counts it in
// observed_total). The store is used as in enforce mode for the first
// request with a key, which runs under a lease and is recorded; a later
// request is classified against that record and runs untracked, never
// touching it. A failing store changes nothing for the request. A body
// that could not be read, or was over max_body_size, was put back for the
// next handler (readBody); one that was read whole is the next handler's
// to read (keyedRequest.body).
func (observing) carryOut(x *exchange, a answer) error {
	if a.action == actRun {
		return x.execute(x.res.Token)
	}
	x.answered(a.outcome)
	return x.next.ServeHTTP(x.w, x.r)
}

// pass hands a request that carries no key to the next handler, counting
// it as passed in observed_total: an observing handler counts what it saw
// on its own.
func (observing) pass(x *exchange) error {
	x.answered(outcomePassed)
	return x.next.ServeHTTP(x.w, x.r)
}

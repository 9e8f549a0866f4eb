package idempotency

import "net/http"

// outcome is how the handler answered a request, as set in
// {http.idempotency.outcome}, the access log and the requests counter.
type outcome string

const (
	outcomeNew         outcome = "new"           // ran the next handler under a fresh key
	outcomeReplayed    outcome = "replayed"      // answered with the recorded response
	outcomeWaited      outcome = "waited"        // waited for the first request, then replayed it
	outcomeConflict    outcome = "conflict"      // 409: the first request is still running
	outcomeMismatch    outcome = "mismatch"      // 422: the key was used for another request
	outcomeMissing     outcome = "missing"       // 400: no key where one is required
	outcomeInvalid     outcome = "invalid"       // 400: malformed key, no client scope, or invalid JSON
	outcomeTooLarge    outcome = "too_large"     // 413: body over max_body_size
	outcomeTooManyKeys outcome = "too_many_keys" // 429: the client holds as many keys as it may
	outcomeStoreError  outcome = "store_error"   // the store failed or is full: 503, or passed on with fail_open
	outcomePassed      outcome = "passed"        // no key: passed on without idempotency
)

// outcomes lists every outcome, so that each counter exists (at zero)
// from the start.
var outcomes = []outcome{
	outcomeNew, outcomeReplayed, outcomeWaited, outcomeConflict, outcomeMismatch,
	outcomeMissing, outcomeInvalid, outcomeTooLarge, outcomeTooManyKeys, outcomeStoreError, outcomePassed,
}

// outcomeValues are the outcomes as placeholder values, boxed once: a
// string put in an interface per request would be an allocation.
var outcomeValues = func() map[outcome]any {
	m := make(map[outcome]any, len(outcomes))
	for _, o := range outcomes {
		m[o] = string(o)
	}
	return m
}()

// value is o as a placeholder value.
func (o outcome) value() any {
	if v, ok := outcomeValues[o]; ok {
		return v
	}
	return string(o)
}

// countOutcome counts one request of the server that serves r.
func countOutcome(r *http.Request, o outcome) {
	if c := metricsOf(r).byOutcome[o]; c != nil {
		c.Inc()
	}
}

// countObserved counts one request of observe mode.
func countObserved(r *http.Request, o outcome) {
	if c := metricsOf(r).observedByOutcome[o]; c != nil {
		c.Inc()
	}
}

// Placeholders set on the requests this handler answers.
const (
	placeholderOutcome = "http.idempotency.outcome"
	// placeholderKeyHash is set once a handler has taken the request's
	// key, and marks the request as taken for inner idempotency handlers.
	placeholderKeyHash = "http.idempotency.key_hash"
	// placeholderProblem is the problem type of a rejection, for the
	// site's handle_errors routes.
	placeholderProblem = "http.idempotency.problem"
	// placeholderObservedKeyHash is the key hash of an observing
	// handler's record (its own namespace); it takes nothing.
	placeholderObservedKeyHash = "http.idempotency.observed_key_hash"
	// placeholderPassing marks a request an enforcing handler passed on
	// without a key: the outermost such handler counts it as passed, once,
	// if no inner handler takes its key.
	placeholderPassing = "http.idempotency.passing"
	// placeholderSettled marks a request an enforcing handler has
	// answered for (any outcome but passed, or passed counted).
	placeholderSettled = "http.idempotency.settled"
)

package idempotency

// observing is mode observe: the handler measures before enforcing.
type observing struct{}

var observeTraits = modeTraits{
	name:    modeObserve,
	keyHash: placeholderObservedKeyHash, outcomeField: "idempotency_observed", hashField: "idempotency_observed_key_hash",
	span:        "idempotency.observed",
	scopePrefix: observedScopePrefix,
	counted:     countObserved,
	transparent: true,
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
	x.settle(a.outcome)
	return x.next.ServeHTTP(x.w, x.r)
}

// pass hands a request that carries no key to the next handler, counting
// it as passed in observed_total: an observing handler counts what it saw
// on its own.
func (observing) pass(x *exchange) error {
	x.settle(outcomePassed)
	return x.next.ServeHTTP(x.w, x.r)
}

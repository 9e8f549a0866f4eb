package idempotency

// observe carries out the answer of mode observe: every request reaches
// the next handler as if this handler were absent, and the outcome it
// would have had in enforce mode is only recorded (settle counts it in
// observed_total). The store is used as in enforce mode for the first
// request with a key, which runs under a lease and is recorded; a later
// request is classified against that record and runs untracked, never
// touching it. A failing store changes nothing for the request. A body
// that could not be read, or was over max_body_size, was put back for the
// next handler (readBody); one that was read whole is the next handler's
// to read (keyedRequest.body).
func (x *exchange) observe(a answer) error {
	switch {
	case a.action == actRun:
		return x.execute(x.res.Token)
	case a.outcome == outcomePassed:
		return x.pass()
	}
	x.settle(a.outcome)
	return x.next.ServeHTTP(x.w, x.r)
}

package history

import "fmt"

// Problem types the module answers with (problem.go).
const (
	ProblemOutstanding      = "urn:caddy-idempotency:request-outstanding"
	ProblemStoreUnavailable = "urn:caddy-idempotency:store-unavailable"
	// ProblemOutcomeUnknown: the key's first request reached the upstream
	// and got no status back; the key is kept, and never runs again.
	ProblemOutcomeUnknown = "urn:caddy-idempotency:outcome-unknown"
)

// checkStatuses is invariant 5, and the module's other answers: 409 only
// as request-outstanding; 503 store-unavailable only on a fail_closed
// route during or just after a fault that kept its instance from the
// store, or while a PostgreSQL row is locked (checkLocks judges those of
// other keys); 503 store-full on a memory route whose store is full
// (checkFill judges one that made-up sources filled); 502 only for an upstream that failed before its status
// or a dial its attempt asked to be refused, and 502 outcome-unknown
// only once a request of its key failed so after it reached the
// upstream; 504 only for an attempt that asked its proxy to time out; a 5xx
// the upstream sent only first-hand (it frees the key, so it is never
// replayed); nothing else of the module's own, and never a 500.
func (ix *index) checkStatuses(r *Report) {
	for i := range ix.h.Attempts {
		a := &ix.h.Attempts[i]
		in := ix.intents[a.Intent]
		if in == nil || a.Status == 0 {
			continue
		}
		if msg := ix.unlisted(in, a); msg != "" {
			kind := Unlisted5xx
			if a.Status < 500 {
				kind = UnexpectedStatus
			}
			r.anomaly(kind, in, a.describe()+": "+msg)
		}
	}
}

// unlisted says why a's status is not one the documentation lists for
// its situation, "" when it is.
func (ix *index) unlisted(in *Intent, a *Attempt) string {
	switch {
	case a.Replayed && releases(a.Status):
		return fmt.Sprintf("a replayed %d: a status that frees the key was recorded", a.Status)
	case a.Execution > 0:
		return "" // the upstream's own answer; checkAnswers compares it
	case a.Status < 300:
		return "" // names no execution: checkAnswers reports it
	case a.Status == 409:
		if a.Problem != ProblemOutstanding {
			return fmt.Sprintf("409 of type %q", a.Problem)
		}
		return ""
	case a.Status == 503 && a.Problem == ProblemStoreFull && in.Store == Memory:
		return ix.storeFullListed(a)
	case a.Status == 503 && a.Problem == ProblemStoreUnavailable:
		if in.FailOpen {
			return "503 store-unavailable on a fail_open route"
		}
		if ix.lockDuring(in, a) != nil {
			// The locked key may be refused; any other key is
			// checkLocks's to judge.
			return ""
		}
		if ix.h.troubleNear(a.Instance, in.Store, a.Start, a.End) < 0 {
			return fmt.Sprintf("503 store-unavailable with no fault of %s or its link to %s during it or within %s before",
				a.Instance, in.Store, secs(ix.h.after(in.Store)))
		}
		return ""
	case a.Status == 502 && a.Problem == ProblemOutcomeUnknown:
		if ix.unknownBefore(in, a) {
			return ""
		}
		return "502 outcome-unknown, but no request of its key reached the upstream and failed before its status"
	case a.Status == 502:
		if a.AskFail == FailRefused || ix.failedBeforeStatus(in, a) {
			return ""
		}
		return "502 without an upstream that failed before its status"
	case a.Status == 504:
		if a.AskFail == FailTimeout && a.Problem == "" {
			return ""
		}
		return "504 without an attempt that asked its proxy to time out"
	case a.Status >= 500:
		return fmt.Sprintf("%d %q of the module's own", a.Status, a.Problem)
	}
	return fmt.Sprintf("%d %q: this workload never asks for it", a.Status, a.Problem)
}

// unknownBefore reports whether an execution of a's record that reached
// the upstream and got no status back began before a ended: what keeps
// the key as outcome-unknown.
func (ix *index) unknownBefore(in *Intent, a *Attempt) bool {
	for _, x := range ix.runs[scopeKey{in.Scope, in.Key}] {
		if x.unknownOutcome() && x.Start <= a.End {
			return true
		}
	}
	return false
}

// failedBeforeStatus reports whether an execution of a's record on its
// instance sent no status while a ran.
func (ix *index) failedBeforeStatus(in *Intent, a *Attempt) bool {
	for _, x := range ix.runs[scopeKey{in.Scope, in.Key}] {
		if x.Status == 0 && x.Instance == a.Instance && x.Start <= a.End && a.Start <= x.End {
			return true
		}
	}
	return false
}

package history

import (
	"fmt"
	"strings"
)

// checkLiveness is invariant 4: once the faults stopped and the quiet
// period passed, the sweep's bounded retries got every intent a final
// answer. A key still answering 409 is stuck in flight. Made-up
// credentials never come back: the sweep leaves them out.
//
// A key that checkFill reported (refused store-full by a store made-up
// sources filled) is not reported again when the sweep met the same.
func (ix *index) checkLiveness(r *Report, filled map[int]bool) {
	if ix.h.SweepStart == 0 {
		return // the run ended before its sweep
	}
	for i := range ix.h.Intents {
		in := &ix.h.Intents[i]
		if in.MadeUp() {
			continue // never comes back: the sweep leaves it out
		}
		var last *Attempt
		n := 0
		for _, a := range ix.attempts[in.ID] {
			if a.Sweep {
				last = a
				n++
			}
		}
		switch {
		case last == nil:
			r.anomaly(StuckKey, in, "the sweep sent it nothing")
		case filled[in.ID] && last.Status == 503 && last.Problem == ProblemStoreFull:
		case !last.final():
			what := last.outcome()
			if last.Status == 409 {
				what = "still 409 (in flight)"
			}
			r.anomaly(StuckKey, in, fmt.Sprintf("%s after %d sweep attempts, the last %s after the faults stopped: no final answer",
				what, n, secs(last.End-ix.h.NemesisEnd)))
		}
	}
}

// outcome is what an attempt got, in a few words.
func (a *Attempt) outcome() string {
	s := fmt.Sprintf("%d", a.Status)
	switch {
	case a.Status == 0 && a.HungUp:
		return "hung up"
	case a.Status == 0:
		return "error: " + a.Err
	case a.Replayed:
		s += " replay"
	case a.Execution > 0:
		s += " new"
	}
	if a.Execution > 0 {
		s += fmt.Sprintf(" #%d", a.Execution)
	}
	if a.AskSize > 0 {
		s += fmt.Sprintf(" %d bytes", a.BodyBytes)
	}
	if a.BodyOmitted {
		s += " body-omitted"
	}
	if a.Problem != "" {
		s += " " + strings.TrimPrefix(a.Problem, "urn:caddy-idempotency:")
	}
	if a.Err != "" {
		s += " (" + a.Err + ")"
	}
	return s
}

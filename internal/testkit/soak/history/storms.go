package history

import (
	"fmt"
	"time"
)

// waitTimeout is the soak routes' wait_timeout (the default): how long a
// retry may wait for its key's first request.
const waitTimeout = 10 * time.Second

// checkStorms is invariant 10: a handler keeps only a share of its
// waiting places (and of the bytes waiting bodies hold) for one key, so
// that while one key's storm of retries waits, another key's retry on the
// same instance still waits for its first request. A retry of a
// storm-other intent that got 409 sooner than half of what it could
// wait (wait_timeout, or until its first request ended), with no fault of
// its instance or store around it, was crowded out.
func (ix *index) checkStorms(r *Report) {
	for i := range ix.h.Intents {
		in := &ix.h.Intents[i]
		if in.Source != SourceStormOther {
			continue
		}
		runs := ix.runs[scopeKey{in.Scope, in.Key}]
		if len(runs) == 0 {
			continue
		}
		first := runs[0]
		for _, a := range ix.attempts[in.ID] {
			if a.Status != 409 || a.Instance != first.Instance || a.Start < first.Start || a.Start > first.End {
				continue
			}
			could := min(waitTimeout, first.End-a.Start)
			if a.End-a.Start >= could/2 || ix.h.troubleNear(a.Instance, in.Store, a.Start, a.End) >= 0 {
				continue
			}
			r.anomaly(WaiterCrowdedOut, in, fmt.Sprintf("%s: a retry that may wait %s for its first request (#%d, on %s until %s) got 409 after %s while a storm of retries of another key waited there",
				a.describe(), secs(could), first.N, first.Instance, secs(first.End), secs(a.End-a.Start)))
		}
	}
}

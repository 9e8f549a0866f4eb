package history

import (
	"fmt"
	"time"
)

// ProblemStoreFull is the type of the memory store's refusal of a new key
// when it holds max_keys live records.
const ProblemStoreFull = "urn:caddy-idempotency:store-full"

// checkFill is invariant 8: refused answers that are recorded (404s for
// made-up credentials, each a scope of its own, that never come back)
// cannot fill the store against a new key. A real client's key refused
// store-full while made-up sources' refusals held at least half of
// max_keys is an anomaly (one per key, counting its refused attempts);
// a store that real records fill may refuse (statuses.go lists that). It
// returns the intents it reported, which the liveness check leaves to it.
func (ix *index) checkFill(r *Report) map[int]bool {
	flagged := map[int]bool{}
	max := ix.h.Params.MemoryMaxKeys
	for i := range ix.h.Intents {
		in := &ix.h.Intents[i]
		if in.Store != Memory || in.MadeUp() {
			continue
		}
		var first *Attempt
		var held, n int
		for _, a := range ix.attempts[in.ID] {
			if a.Status != 503 || a.Problem != ProblemStoreFull {
				continue
			}
			if madeUp, _ := ix.memoryHeld(a.Instance, a.Start); max > 0 && 2*madeUp >= max {
				if first == nil {
					first, held = a, madeUp
				}
				n++
			}
		}
		if first != nil {
			flagged[in.ID] = true
			r.anomaly(StoreFilledByRefusals, in, fmt.Sprintf("%d attempts of this new key were refused store-full; the first, %s, while made-up sources' refusals held %d of the %d records (max_keys) of %s's memory store",
				n, first.describe(), held, max, first.Instance))
		}
	}
	return flagged
}

// memoryHeld counts the records in instance's memory store at a moment:
// those of made-up sources' refusals (a recorded 4xx), and all of them.
// A record is there from its execution's start (the key is reserved
// before) unless its answer freed it, until the instance is killed.
func (ix *index) memoryHeld(instance string, at time.Duration) (madeUp, all int) {
	for i := range ix.h.Intents {
		in := &ix.h.Intents[i]
		if in.Store != Memory {
			continue
		}
		for _, x := range ix.runs[scopeKey{in.Scope, in.Key}] {
			if x.Instance != instance || x.Start >= at || x.End <= at && (x.Status == 0 || releases(x.Status)) {
				continue
			}
			if ix.h.killedBetween(instance, x.Start, at) != nil {
				continue
			}
			all++
			if in.MadeUp() && x.Status >= 400 && x.Status < 500 {
				madeUp++
			}
			break // one record per key
		}
	}
	return madeUp, all
}

// storeFullListed says whether a 503 store-full on a memory route is one
// the documentation lists: the store held (nearly) max_keys records,
// most of them real clients'. Made-up sources' refusals holding half of
// it are checkFill's; "" then, and when listed.
func (ix *index) storeFullListed(a *Attempt) string {
	max := ix.h.Params.MemoryMaxKeys
	madeUp, all := ix.memoryHeld(a.Instance, a.Start)
	switch {
	case max == 0:
		return "503 store-full on a route whose store has no max_keys"
	case 2*madeUp >= max, 10*all >= 9*max:
		return ""
	}
	return fmt.Sprintf("503 store-full while %s's memory store held %d of its %d records", a.Instance, all, max)
}

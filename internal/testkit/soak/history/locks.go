package history

import (
	"fmt"
	"strings"
	"time"
)

// checkLocks is invariant 7: while an outside transaction holds one
// PostgreSQL row locked, only that row's key may wait or be refused.
// Every other key is answered as on a free store: a 503 store-unavailable
// that no fault of its instance, link or store explains, or a 409 with no
// other request of its key in flight, is a request held up by another
// key's lock (a batch that waited on the locked row, say). One anomaly
// per key and lock, counting its refused attempts.
func (ix *index) checkLocks(r *Report) {
	for fi := range ix.h.Faults {
		f := &ix.h.Faults[fi]
		if f.Kind != Lock || f.Key == "" {
			continue // a lock that failed to take its row held nothing
		}
		for i := range ix.h.Intents {
			in := &ix.h.Intents[i]
			if in.Store != f.Store || in.Scope == f.Scope && in.Key == f.Key {
				continue
			}
			var refused []*Attempt
			for _, a := range ix.attempts[in.ID] {
				if !overlaps(a, f) {
					continue
				}
				switch {
				case a.Status == 503 && a.Problem == ProblemStoreUnavailable:
					if ix.h.troubleNear(a.Instance, in.Store, a.Start, a.End) >= 0 {
						continue
					}
				case a.Status == 409:
					if ix.othersInFlight(in, a) {
						continue
					}
				default:
					continue
				}
				refused = append(refused, a)
			}
			if len(refused) == 0 {
				continue
			}
			r.anomaly(HeldUpByLock, in, fmt.Sprintf("while %s, %d attempts of this other key were refused; the first, %s, got %s",
				f.Describe(), len(refused), refused[0].describe(), refused[0].outcome()))
		}
	}
}

// overlaps reports whether a was under way while f lasted.
func overlaps(a *Attempt, f *Fault) bool { return a.Start < f.End && a.End > f.Start }

// othersInFlight reports whether another request of a's record may have
// held the key while a ran: another attempt of its intent, or an
// execution of its record, under way then or ended less than a
// lock_timeout before (a request whose client gave up runs on, and a
// lease outlives a killed holder by up to a lock_timeout).
func (ix *index) othersInFlight(in *Intent, a *Attempt) bool {
	L := ix.h.Params.LockTimeout
	for _, b := range ix.attempts[in.ID] {
		if b != a && b.Start < a.End && b.End+L > a.Start {
			return true
		}
	}
	for _, x := range ix.runs[scopeKey{in.Scope, in.Key}] {
		if x.Start < a.End && x.End+L > a.Start {
			return true
		}
	}
	return false
}

// lockDuring returns a Lock of in's store that a overlapped, nil if none.
func (ix *index) lockDuring(in *Intent, a *Attempt) *Fault {
	for i := range ix.h.Faults {
		f := &ix.h.Faults[i]
		if f.Kind == Lock && f.Key != "" && f.Store == in.Store && overlaps(a, f) {
			return f
		}
	}
	return nil
}

// locksBetween describes the Locks of in's store, of other keys, between
// from and to; "" when there were none.
func (ix *index) locksBetween(in *Intent, from, to time.Duration) string {
	var parts []string
	for i := range ix.h.Faults {
		f := &ix.h.Faults[i]
		if f.Kind == Lock && f.Key != "" && f.Store == in.Store && (f.Key != in.Key || f.Scope != in.Scope) && f.Start <= to && f.End >= from {
			parts = append(parts, f.Describe())
		}
	}
	return strings.Join(parts, "; ")
}

package history

import (
	"fmt"
	"time"
)

// checkDuplicates is invariant 1: every execution of a record after the
// first is excused by a documented exception, or an anomaly.
//
// Each execution is judged against the one that held the key before it
// (the latest earlier execution that ran under a lease): the key could
// only be taken again if that one freed it, or lost its lease to a fault
// the promise does not cover; never once its record was complete (a
// replay of it shows that), as the soak's stores lose nothing. An execution that ran unprotected under
// fail_open never held the key: it is excused, and not a holder.
func (ix *index) checkDuplicates(r *Report) {
	for i := range ix.h.Intents {
		in := &ix.h.Intents[i]
		runs := ix.runs[scopeKey{in.Scope, in.Key}]
		var holder *Execution
		for j, x := range runs {
			if f := ix.failOpenPass(in, x); f >= 0 {
				if j > 0 {
					r.excuse(x, runs[j-1], FailOpen, fmt.Sprintf("#%d ran unprotected under fail_open during %s", x.N, ix.h.Faults[f].Describe()))
				}
				continue
			}
			switch {
			case j == 0:
			case holder == nil:
				r.excuse(x, runs[j-1], FailOpen, fmt.Sprintf("every execution before #%d ran unprotected under fail_open", x.N))
			case in.Store == Memory && ix.h.killedBetween(holder.Instance, holder.Start, x.Start) != nil:
				// The memory store lives in the instance's process: its
				// records died with it.
				f := ix.h.killedBetween(holder.Instance, holder.Start, x.Start)
				r.excuse(x, holder, Killed, fmt.Sprintf("%s killed after #%d ran: its memory store died with it: %s", holder.Instance, holder.N, f.Describe()))
			case ix.replayed(holder) != nil:
				// Its record was complete: stores that lose nothing on a
				// restart never run a completed record again, whatever
				// the fault.
				a := ix.replayed(holder)
				r.anomaly(DuplicateExecution, in, ix.duplicateSummary(in, holder, x)+
					fmt.Sprintf("; #%d's record was complete (replayed by %s), and a completed record must never run again", holder.N, a.describe()))
			default:
				if ex, detail := ix.excuse(in, holder, x); ex != "" {
					r.excuse(x, holder, ex, detail)
				} else {
					r.anomaly(DuplicateExecution, in, ix.duplicateSummary(in, holder, x))
				}
			}
			holder = x
		}
	}
}

// excuse finds the exception that let x run after prev held the key: ""
// when there is none.
func (ix *index) excuse(in *Intent, prev, x *Execution) (Exception, string) {
	h := ix.h
	// A request that reached the upstream and got no status back (its
	// proxy's timeout, a reset or an EOF once the upstream read it) left
	// its outcome unknown: the key is kept (on_unknown_outcome keep), and
	// nothing frees it but a fault below.
	if x.Start >= prev.End && !prev.unknownOutcome() && releases(prev.Status) {
		return Released, fmt.Sprintf("#%d answered %d, which frees the key", prev.N, prev.Status)
	}
	from := ix.heldFrom(in, prev)
	for i := range h.Faults {
		f := &h.Faults[i]
		if f.Kind == Kill && f.Instance == prev.Instance && f.End >= from && f.Start <= x.Start {
			return Killed, fmt.Sprintf("%s killed while #%d held the key: %s", prev.Instance, prev.N, f.Describe())
		}
	}
	for _, o := range h.outages(prev.Instance, in.Store) {
		if o.length() >= h.tolerated() && o.end >= from && o.start <= x.Start {
			return LongOutage, fmt.Sprintf("%s lost %s while #%d held the key: %s (tolerance %s)",
				prev.Instance, in.Store, prev.N, h.describeOutage(o), secs(h.tolerated()))
		}
	}
	return "", ""
}

// heldFrom is the earliest moment prev's request may have taken the key:
// the start of the attempt that got prev's first-hand answer, or of the
// earliest attempt on prev's instance that was under way when prev began
// (the key is taken before the upstream runs, and an instance stalled in
// between holds it all along); prev.Start when no attempt tells.
func (ix *index) heldFrom(in *Intent, prev *Execution) time.Duration {
	from := prev.Start
	for _, a := range ix.attempts[in.ID] {
		firstHand := a.Execution == prev.N && !a.Replayed
		underWay := a.Instance == prev.Instance && a.Start <= prev.Start && (a.End == 0 || a.End >= prev.Start)
		if (firstHand || underWay) && a.Start < from {
			from = a.Start
		}
	}
	return from
}

// failOpenPass returns the fault during which x ran unprotected under
// fail_open, or -1 when it did not (or could not) have.
func (ix *index) failOpenPass(in *Intent, x *Execution) int {
	if !in.FailOpen {
		return -1
	}
	// The store call fails within the store timeout of the fault, and the
	// request is passed on then.
	return ix.h.troubleNear(x.Instance, in.Store, x.Start, x.Start)
}

func (r *Report) excuse(x, prev *Execution, ex Exception, detail string) {
	r.Excused = append(r.Excused, Excused{Key: x.Key, Scope: x.Scope, Execution: x.N, Previous: prev.N, Exception: ex, Detail: detail})
}

// duplicateSummary says what ran twice and what faults were near, with
// their lengths against the tolerance.
func (ix *index) duplicateSummary(in *Intent, prev, x *Execution) string {
	h := ix.h
	s := fmt.Sprintf("#%d on %s [%s-%s] ran while #%d on %s [%s-%s] held the key (answered %d)",
		x.N, x.Instance, secs(x.Start), secs(x.End), prev.N, prev.Instance, secs(prev.Start), secs(prev.End), prev.Status)
	if prev.unknownOutcome() {
		s += fmt.Sprintf("; #%d's outcome was unknown (%s before its status reached the proxy), which keeps the key", prev.N, prev.Failed)
	}
	var near []string
	from := ix.heldFrom(in, prev)
	for _, o := range h.outages(prev.Instance, in.Store) {
		if o.end >= from && o.start <= x.Start {
			near = append(near, h.describeOutage(o))
		}
	}
	if len(near) == 0 {
		s += fmt.Sprintf("; no fault of %s or its link to %s in between", prev.Instance, in.Store)
		if locks := ix.locksBetween(in, from, x.Start); locks != "" {
			s += "; a row of another key was locked meanwhile: " + locks
		}
		return s
	}
	s += fmt.Sprintf("; in between, shorter than the tolerance (%s):", secs(h.tolerated()))
	for _, n := range near {
		s += " " + n + ";"
	}
	return s[:len(s)-1]
}

// replayed returns the first attempt that got a replay of x, nil when
// none did.
func (ix *index) replayed(x *Execution) *Attempt {
	for _, in := range []*Intent{ix.byRecord[scopeKey{x.Scope, x.Key}]} {
		if in == nil {
			continue
		}
		for _, a := range ix.attempts[in.ID] {
			if a.Replayed && a.Execution == x.N {
				return a
			}
		}
	}
	return nil
}

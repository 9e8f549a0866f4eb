package model

import (
	"bytes"
	"slices"
	"time"
)

// The rules of the scenarios that the rules of every step cannot judge:
// a takeover's two executions, a write waiting out a fault, a pause's
// answers, a locked row, the fill site, clients that read slowly.

// seen marks the executions of outs as this step's.
func (j *judge) seen(outs []*outcome) {
	for _, o := range outs {
		if o.exec != nil {
			j.seenExec[o.a.ID] = true
		}
	}
}

// byID returns the outcome of attempt id among outs, nil if none.
func byID(outs []*outcome, id string) *outcome {
	for _, o := range outs {
		if o.a.ID == id {
			return o
		}
	}
	return nil
}

// runs are the outcomes of outs that reached the upstream.
func runs(outs []*outcome) []*outcome {
	var out []*outcome
	for _, o := range outs {
		if o.exec != nil {
			out = append(out, o)
		}
	}
	return out
}

// judgeTakeover: path a was cut off for longer than a lease while its
// request ran. Path b's request after the lapse takes the key over and
// runs; the owner's late answer is fenced: every later replay is path
// b's, and the upstream ran exactly twice.
func (x *trialRun) judgeTakeover(outs []*outcome) {
	j := x.j
	j.seen(outs)
	owner, taker := byID(outs, x.stepAttempt(0)), byID(outs, x.stepAttempt(1))
	if owner == nil || owner.exec == nil {
		j.fail("scenario", "takeover: the first request %s never ran: %s", x.stepAttempt(0), describeOutcome(owner))
		return
	}
	j.checkOwnAnswer(owner, "wrong-answer")
	if taker == nil || taker.exec == nil {
		j.fail("lease-outlived", "takeover: path a was cut off from the store for longer than a lease, yet %s got %s instead of taking the key over", x.stepAttempt(1), describeOutcome(taker))
		return
	}
	j.checkOwnAnswer(taker, "wrong-answer")
	if n := len(runs(outs)); n != 2 {
		j.fail("duplicate", "takeover: the upstream ran %d times, want the owner's and the taker's", n)
	}
	rec := &record{exec: taker.exec, owner: taker.a, omitted: taker.a.Do.BreaksAfterStatus()}
	for _, o := range outs {
		if o == owner || o == taker {
			continue
		}
		switch src := o.res.Header.Get(HeaderReq); {
		case src == owner.a.ID:
			j.fail("fenced-owner-recorded", "takeover: %s got the answer of %s, whose lease was taken over: its late completion overwrote the taker's record", o.a.ID, owner.a.ID)
		case src != taker.a.ID:
			j.fail("wrong-answer", "takeover: %s got %s, want the replay of the taker %s", o.a.ID, o.res.describe(), taker.a.ID)
		default:
			j.checkReplayContent(o, rec)
		}
	}
}

// stepAttempt is the id of attempt i of the current step, as generated
// (before any resend).
func (x *trialRun) stepAttempt(i int) string { return x.current.Attempts[i].ID }

func describeOutcome(o *outcome) string {
	if o == nil {
		return "<not sent>"
	}
	return o.res.describe()
}

// judgeAftercare: path a was cut off as its request's answer came, so the
// record waited in aftercare, its lease renewed, until path a was back.
// The upstream ran once; path b's retries got 409 until the record was
// written, then its replay, and got it before they gave up.
func (x *trialRun) judgeAftercare(outs []*outcome) {
	j := x.j
	j.seen(outs)
	owner := byID(outs, x.stepAttempt(0))
	if owner == nil || owner.exec == nil {
		j.fail("scenario", "aftercare: the first request never ran: %s", describeOutcome(owner))
		return
	}
	j.checkOwnAnswer(owner, "wrong-answer")
	rec := &record{exec: owner.exec, owner: owner.a, omitted: owner.a.Do.BreaksAfterStatus()}
	replayed := false
	for _, o := range outs {
		if o == owner {
			continue
		}
		slug := problemSlug(o.res, o.d.pol)
		switch {
		case o.exec != nil:
			j.fail("duplicate", "aftercare: %s ran although %s's record waited to be written", o.a.ID, owner.a.ID)
		case o.res.NoAnswer:
			j.fail("no-answer", "aftercare: %s got no answer: %s", o.a.ID, o.res.Err)
		case slug == "request-outstanding" || slug == "?" && o.res.Status == 409:
		case isReplay(o.res, o.a) && o.res.Header.Get(HeaderReq) == owner.a.ID:
			replayed = true
			j.checkReplayContent(o, rec)
		default:
			j.fail("wrong-answer", "aftercare: %s got %s, want 409 or the replay of %s", o.a.ID, o.res.describe(), owner.a.ID)
		}
	}
	if !replayed {
		j.fail("record-never-written", "aftercare: %s's answer was never recorded once the store was back: path b's retries got 409 until they gave up", owner.a.ID)
	}
}

// judgePause: both paths stalled for a fifth of a lease under a burst.
// Per key the upstream runs once (several times only under fail_open,
// for requests that met the stall); answers are the key's run or its
// replay, 409 while another of its requests is in flight, or 503 for
// those that met the stall; once it is over, every key is answered.
func (x *trialRun) judgePause(st Step, outs []*outcome) {
	j := x.j
	j.seen(outs)
	n := len(st.Attempts) / 3
	after := map[string]bool{}
	for _, a := range st.Attempts[2*n:] {
		after[a.ID] = true
	}
	byKey := map[recKey][]*outcome{}
	for _, o := range outs {
		if o.d.kind == "keyed" {
			byKey[o.d.rk] = append(byKey[o.d.rk], o)
		}
	}
	for rk, os := range byKey {
		ran := runs(os)
		failOpen := len(ran) > 0 && ran[0].d.pol.FailOpen
		if first, again := j.rerunWhileLive(ran); again != nil && !failOpen {
			j.fail("duplicate", "pause: key %q ran %d times: %s ran while the record of %s lived (ttl %s)",
				rk.key, len(ran), again.a.ID, first.a.ID, first.d.pol.TTL)
		}
		for _, o := range os {
			if o.exec != nil {
				j.checkOwnAnswer(o, "wrong-answer")
				continue
			}
			slug := problemSlug(o.res, o.d.pol)
			switch {
			case o.res.NoAnswer:
				j.fail("no-answer", "pause: %s got no answer: %s", o.a.ID, o.res.Err)
			case slug == "store-unavailable" || slug == "?" && o.res.Status == 503:
				if after[o.a.ID] {
					j.fail("wrong-answer", "pause: %s, sent once the store was back, got 503", o.a.ID)
				}
			case slug == "request-outstanding" || slug == "?" && o.res.Status == 409:
				holding := false
				for _, h := range os {
					holding = holding || h != o && !h.done.Before(o.res.Sent) && !o.res.Done.Before(h.res.Sent)
				}
				if !holding && after[o.a.ID] {
					j.fail("wrong-answer", "pause: %s, sent once the store was back, got 409 with no other request of its key in flight", o.a.ID)
				}
			case isReplay(o.res, o.a):
				src := byID(ran, o.res.Header.Get(HeaderReq))
				if src == nil {
					j.fail("wrong-answer", "pause: %s got the answer of %s, which did not run for its key", o.a.ID, o.res.Header.Get(HeaderReq))
					continue
				}
				j.checkReplayContent(o, &record{exec: src.exec, owner: src.a})
			default:
				j.fail("wrong-answer", "pause: %s got %s", o.a.ID, o.res.describe())
			}
		}
	}
}

// rerunWhileLive returns a run of ran that was sent while the record of
// an earlier one (which kept its key) certainly lived, and that earlier
// run: nil when every re-run came after the record it replaced may have
// expired (a short ttl under a long burst) or was freed.
func (j *judge) rerunWhileLive(ran []*outcome) (first, again *outcome) {
	slices.SortFunc(ran, func(x, y *outcome) int { return x.exec.Arrived.Compare(y.exec.Arrived) })
	for i, later := range ran {
		for _, earlier := range ran[:i] {
			if j.settles(earlier) == keyFreed {
				continue
			}
			if earlier.exec.Finished.IsZero() {
				return earlier, later // never answered: in flight for all we know
			}
			if lo, _ := j.newRecord(earlier).expiry(); later.res.Sent.Before(lo) {
				return earlier, later
			}
		}
	}
	return nil, nil
}

// judgeLocked: while the locked key's row was held by an outside
// transaction, every unrelated key was answered as on a free store (the
// rules of every step), within the hold; the locked key got 409 or 503,
// and ran at most once (a request still waiting when the row was let go
// may run then).
//
// hold is how long the row was held: the unrelated keys must be answered
// within it only when it is the long one (lockHold).
func (x *trialRun) judgeLocked(outs []*outcome, locked []*Attempt, unrelated, hold time.Duration) {
	j := x.j
	isLocked := make(map[string]bool, len(locked))
	for _, a := range locked {
		isLocked[a.ID] = true
	}
	var lockedOuts, rest []*outcome
	for _, o := range outs {
		if isLocked[o.a.ID] {
			lockedOuts = append(lockedOuts, o)
		} else {
			rest = append(rest, o)
		}
	}
	// The locked key's runs are seen first: judgeStep ends by looking for
	// executions no step saw, and the locked key may run once its row is
	// let go (they were taken for strays).
	j.seen(lockedOuts)
	x.judgeStep(j.step, rest)
	if hold >= lockHold && unrelated >= hold {
		j.fail("held-up-by-a-lock", "locked: the unrelated keys were answered only once the locked row was let go (%s)", unrelated.Round(time.Millisecond))
	}
	if n := len(runs(lockedOuts)); n > 1 {
		j.fail("duplicate", "locked: the locked key ran %d times", n)
	}
	for _, o := range lockedOuts {
		if o.exec != nil {
			j.checkOwnAnswer(o, "wrong-answer")
			continue
		}
		slug := problemSlug(o.res, o.d.pol)
		switch {
		case o.res.NoAnswer:
			j.fail("no-answer", "locked: %s got no answer: %s", o.a.ID, o.res.Err)
		case slug == "request-outstanding" || slug == "store-unavailable" || slug == "?":
		case isReplay(o.res, o.a):
		default:
			j.fail("wrong-answer", "locked: %s got %s, want 409 or 503 while its row is locked", o.a.ID, o.res.describe())
		}
	}
}

// judgeFill: the fill site's store was filled with the records of
// refusals (404s for made-up credentials, a scope each); then a real
// client's new key must run and get its answer: refusals cannot fill a
// store against a new key.
func (x *trialRun) judgeFill(outs []*outcome) {
	j := x.j
	j.seen(outs)
	for i, o := range outs {
		real := i == len(outs)-1
		switch {
		case o.exec == nil && real:
			j.fail("store-filled-by-refusals", "fill: a real client's new key got %s after %d made-up credentials' requests were refused with 404 (max_keys %d)", o.res.describe(), len(outs)-1, x.cfg.Store.FillKeys)
		case o.exec == nil:
			j.fail("wrong-answer", "fill: %s never ran: %s", o.a.ID, o.res.describe())
		case o.res.NoAnswer || o.res.Status != o.a.Do.Status || o.res.Header.Get(HeaderReq) != o.a.ID:
			j.fail("wrong-answer", "fill: %s ran but got %s", o.a.ID, o.res.describe())
		}
	}
}

// judgeClients judges clients that read slowly, slept and resumed, or
// stopped reading, and clients of a silent upstream: each ran once. A
// slow reader gets the whole answer. One that resumes gets the whole
// answer or an error, never a clean end after part of it. One that
// stopped counts as gone after the stall timeout: its key is replayed to
// others soon after. One whose upstream fell silent for longer than the
// stall timeout, while it read all that came, gets the whole answer: a
// silent upstream is not a stalled client.
func (x *trialRun) judgeClients(st Step, outs []*outcome) {
	j := x.j
	j.seen(outs)
	for _, a := range st.Attempts {
		o := byID(outs, a.ID)
		if o == nil || o.exec == nil {
			j.fail("scenario", "%s (%s): %s never ran: %s", st.Scenario, a.Proto, a.ID, describeOutcome(o))
			continue
		}
		r, sent := o.res, o.exec.Sent
		switch st.Scenario {
		case scSlow:
			if r.NoAnswer || r.BrokeOff || r.Status != sent.Status || !bytes.Equal(r.Body, sent.Body) {
				j.fail("slow-reader-cut", "slow (%s): a client reading %d bytes a second got %d of %d bytes (%s)", a.Proto, a.Rate, len(r.Body), len(sent.Body), r.Err)
			}
		case scResume:
			if !r.NoAnswer && !r.BrokeOff && !bytes.Equal(r.Body, sent.Body) {
				j.fail("truncated-clean-end", "resume (%s): a client that slept %s and resumed got %d of %d bytes and a clean end", a.Proto, a.Stall, len(r.Body), len(sent.Body))
			}
		case scStall:
			probes := slices.DeleteFunc(slices.Clone(outs), func(p *outcome) bool { return p.a.Intent != a.Intent || p.a.ID == a.ID })
			x.judgeStalledKey(o, probes)
		case scSilent:
			j.checkOwnAnswer(o, "silent-upstream-cut")
		}
	}
	for _, o := range outs {
		if o.exec != nil && !slices.ContainsFunc(st.Attempts, func(a *Attempt) bool { return a.ID == o.a.ID }) {
			j.fail("duplicate", "%s: %s ran, a retry of a request that ran already", st.Scenario, o.a.ID)
		}
	}
}

// judgeStalledKey: retries of a stalled client's key get 409 until it
// counts as gone (the stall timeout after its last progress), then the
// replay.
func (x *trialRun) judgeStalledKey(stalled *outcome, probes []*outcome) {
	j := x.j
	if len(probes) == 0 {
		return
	}
	window := stallTimeout + stallTimeout/10 + time.Second
	last := probes[0]
	for _, p := range probes {
		if p.res.Sent.After(last.res.Sent) {
			last = p
		}
	}
	if last.res.Status == 409 && last.res.Sent.Sub(stalled.exec.Arrived) > window {
		j.fail("stalled-reader-holds-key", "stall (%s): a client stopped reading the answer of %s; %s later, retries still get 409", stalled.a.Proto, stalled.a.ID, last.res.Sent.Sub(stalled.exec.Arrived).Round(time.Millisecond))
		return
	}
	if last.res.Status != 409 && !isReplay(last.res, last.a) {
		j.fail("wrong-answer", "stall (%s): a retry of %s got %s, want the replay", stalled.a.Proto, stalled.a.ID, last.res.describe())
		return
	}
	if isReplay(last.res, last.a) {
		j.checkReplayContent(last, &record{exec: stalled.exec, owner: stalled.a})
	}
}

// judgeStorm: the rules of every step, and the other client's retry, the
// only waiter of its key, found a place while a storm of retries of one
// key waited: it waited for its first request (or as long as it may), it
// did not get 409 at once.
func (x *trialRun) judgeStorm(st Step, outs []*outcome) {
	j := x.j
	x.judgeStep(j.step, outs)
	otherOwner, retry := byID(outs, st.Attempts[1].ID), byID(outs, st.Attempts[len(st.Attempts)-1].ID)
	if otherOwner == nil || otherOwner.exec == nil || retry == nil || retry.exec != nil || retry.d.kind != "keyed" {
		return // the rules of every step judged them
	}
	budget, ok := waits(retry.a, retry.d.pol)
	slug := problemSlug(retry.res, retry.d.pol)
	if !ok || !(slug == "request-outstanding" || slug == "?" && retry.res.Status == 409) {
		return
	}
	// How long it could have waited: its budget, or until the first
	// request of its key was done.
	could := min(budget, otherOwner.done.Sub(retry.res.Sent))
	if waited := retry.res.Done.Sub(retry.res.Sent); waited < could/2 {
		j.fail("waiter-crowded-out", "storm: %s, the only retry of another client's key in flight, got 409 after %s while %d retries of one key waited; it may wait %s",
			retry.a.ID, waited.Round(time.Millisecond), len(st.Attempts)-3, could.Round(time.Millisecond))
	}
}

package history

import (
	"fmt"
	"strings"
)

// checkAnswers is invariants 2 and 3: every answer that names an
// execution names one of its own record and request; a first-hand answer
// is what that execution sent; a replay is what it recorded; and the
// replays of a record all agree.
func (ix *index) checkAnswers(r *Report) {
	for i := range ix.h.Intents {
		in := &ix.h.Intents[i]
		var replays []*Attempt
		for _, a := range ix.attempts[in.ID] {
			if a.Status == 0 {
				continue
			}
			if a.Execution == 0 {
				if a.Status < 300 {
					r.anomaly(ForeignAnswer, in, fmt.Sprintf("%s got %d that names no execution", a.describe(), a.Status))
				}
				continue
			}
			x := ix.execs[a.Execution]
			if msg := ix.foreign(in, a, x); msg != "" {
				r.anomaly(ForeignAnswer, in, a.describe()+": "+msg)
				continue
			}
			if a.Replayed {
				if a.Err == "" && !a.HungUp {
					replays = append(replays, a)
				}
				if msg := recordDiffers(a, x); msg != "" {
					r.anomaly(ReplayDiffers, in, fmt.Sprintf("%s: replay of #%d %s", a.describe(), x.N, msg))
				}
				continue
			}
			if msg := answerDiffers(a, x); msg != "" {
				r.anomaly(AnswerDiffers, in, fmt.Sprintf("%s: answer of #%d %s", a.describe(), x.N, msg))
			}
		}
		if msg := disagree(replays); msg != "" {
			r.anomaly(ReplayDiffers, in, "replays disagree: "+msg)
		}
	}
}

// foreign says how the answer a got for in belongs to someone else, ""
// when it is its own.
func (ix *index) foreign(in *Intent, a *Attempt, x *Execution) string {
	switch {
	case x == nil:
		return fmt.Sprintf("names execution #%d, which the upstream never ran", a.Execution)
	case x.Key != in.Key || x.Scope != in.Scope:
		who := fmt.Sprintf("key %q of scope %q", x.Key, x.Scope)
		if other := ix.byRecord[scopeKey{x.Scope, x.Key}]; other != nil {
			who += fmt.Sprintf(" (intent %d)", other.ID)
		}
		return fmt.Sprintf("the answer of #%d, made for %s", x.N, who)
	case x.Path != in.Path || x.BodyDigest != in.BodyDigest:
		return fmt.Sprintf("the answer of #%d, made for another request (%s, body %s)", x.N, x.Path, x.BodyDigest)
	case a.BodyKey != "" && (a.BodyKey != in.Key || a.BodyScope != in.Scope || a.BodyExecution != a.Execution):
		return fmt.Sprintf("X-Execution says #%d but the body says #%d for key %q of scope %q", a.Execution, a.BodyExecution, a.BodyKey, a.BodyScope)
	}
	return ""
}

// recordDiffers says how a replay differs from the execution it names.
func recordDiffers(a *Attempt, x *Execution) string {
	var diffs []string
	if a.Status != x.Status {
		diffs = append(diffs, fmt.Sprintf("status %d, the execution answered %d", a.Status, x.Status))
	}
	switch {
	case x.BrokeOff && !a.BodyOmitted:
		diffs = append(diffs, "lacks Idempotent-Body-Omitted, but the execution broke off mid-body")
	case !x.BrokeOff && a.BodyOmitted:
		diffs = append(diffs, "says Idempotent-Body-Omitted, but the execution's body was whole")
	case !x.BrokeOff && a.Err == "" && !a.HungUp && a.BodyDigest != x.AnswerDigest && !shortened(a, x):
		diffs = append(diffs, fmt.Sprintf("body %s, the execution sent %s", a.BodyDigest, x.AnswerDigest))
	}
	return strings.Join(diffs, "; ")
}

// answerDiffers says how a first-hand answer differs from what its
// execution sent.
func answerDiffers(a *Attempt, x *Execution) string {
	var diffs []string
	if a.Status != x.Status {
		diffs = append(diffs, fmt.Sprintf("status %d, the execution answered %d", a.Status, x.Status))
	}
	if !x.BrokeOff && a.Err == "" && !a.HungUp && a.BodyDigest != x.AnswerDigest && !shortened(a, x) {
		diffs = append(diffs, fmt.Sprintf("body %s, the execution sent %s", a.BodyDigest, x.AnswerDigest))
	}
	return strings.Join(diffs, "; ")
}

// disagree says how the replays of one record differ from each other.
func disagree(replays []*Attempt) string {
	type shape struct {
		exec    int64
		status  int
		body    string
		omitted bool
	}
	seen := map[shape]*Attempt{}
	var order []shape
	for _, a := range replays {
		s := shape{a.Execution, a.Status, a.BodyDigest, a.BodyOmitted}
		if _, ok := seen[s]; !ok {
			seen[s] = a
			order = append(order, s)
		}
	}
	if len(order) < 2 {
		return ""
	}
	var parts []string
	for _, s := range order {
		parts = append(parts, fmt.Sprintf("#%d %d body %s omitted %v (first %s)", s.exec, s.status, s.body, s.omitted, seen[s].describe()))
	}
	return strings.Join(parts, " vs ")
}

// describe names an attempt: "attempt 3 of sender 1 on b at 12.345s".
func (a *Attempt) describe() string {
	who := fmt.Sprintf("attempt %d of sender %d", a.Seq, a.Sender)
	if a.Sweep {
		who = fmt.Sprintf("sweep attempt %d", a.Seq)
	}
	return fmt.Sprintf("%s on %s at %s", who, a.Instance, secs(a.Start))
}

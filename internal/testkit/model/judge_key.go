package model

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// judgeKey checks the attempts of one step that took the same record key:
// at most one execution at a time, none while a record lives, and every
// other answer one the contract allows then.
func (j *judge) judgeKey(rk recKey, outs []*outcome) {
	old := j.recs[rk]
	var execs []*outcome
	for _, o := range outs {
		if o.exec != nil {
			execs = append(execs, o)
		}
	}
	slices.SortFunc(execs, func(a, b *outcome) int { return a.exec.Arrived.Compare(b.exec.Arrived) })

	// Executions: never two at once, never while a record lives.
	live := old
	var kept []*record
	for i, o := range execs {
		arrived := o.exec.Arrived
		for _, p := range execs[:i] {
			if p.exec.Finished.IsZero() || arrived.Before(p.exec.Finished.Add(-slack)) {
				j.fail("duplicate", "%s ran while %s (same key %q) was still running: two executions at once", o.a.ID, p.a.ID, rk.key)
			}
		}
		if live != nil {
			if lo, _ := live.expiry(); arrived.Before(lo) {
				if live.fp != o.d.fp {
					j.fail("ran-mismatch", "%s ran although key %q holds the record of %s for another request (want 422)", o.a.ID, rk.key, live.owner.ID)
				} else {
					j.fail("duplicate", "%s ran although key %q holds the record of %s (ttl %s): the upstream ran twice", o.a.ID, rk.key, live.owner.ID, live.ttl)
				}
			}
		}
		j.checkArrived(o, true)
		j.checkOwnAnswer(o, "wrong-answer")
		if j.frees(o) {
			live = nil
			delete(j.scopeKey(rk.scope), rk.key)
			continue
		}
		live = j.newRecord(o)
		kept = append(kept, live)
		j.all = append(j.all, live)
		j.scopeKey(rk.scope)[rk.key] = true
	}

	// Everything else the key's attempts got.
	candidates := append([]*record{}, kept...)
	if old != nil {
		candidates = append(candidates, old)
	}
	for _, o := range outs {
		if o.exec != nil {
			continue
		}
		j.judgeNonExecuting(rk, o, outs, candidates)
	}

	// The record in force after the step.
	switch {
	case len(execs) > 0 && live == nil:
		delete(j.recs, rk)
	case live != nil:
		j.recs[rk] = live
	}
	if r := j.recs[rk]; r != nil {
		if _, hi := r.expiry(); clockForModules().After(hi) {
			delete(j.recs, rk)
		}
	}
}

func (j *judge) scopeKey(scope string) map[string]bool {
	m := j.scopeKeys[scope]
	if m == nil {
		m = make(map[string]bool)
		j.scopeKeys[scope] = m
	}
	return m
}

// frees reports whether an execution frees its key: a status in
// release_on, or no valid final status.
func (j *judge) frees(o *outcome) bool {
	b := o.a.Do
	return b.FailsBeforeStatus() || b.Status == 1000 || o.d.pol.releases(b.Status)
}

// newRecord is the record an execution that keeps its key leaves.
func (j *judge) newRecord(o *outcome) *record {
	b, sent := o.a.Do, o.exec.Sent
	r := &record{fp: o.d.fp, parts: o.d.parts, exec: o.exec, owner: o.a, ttl: o.d.pol.TTL, lo: o.exec.Finished, hi: o.done}
	limit := int(o.d.pol.MaxResponseSize)
	r.omitted = b.BreaksAfterStatus() || sent != nil && len(sent.Wire) > limit && len(sent.Body) > limit
	if o.a.Mode == ReadAll && !o.res.NoAnswer && !o.res.BrokeOff && !b.BreaksAfterStatus() {
		r.answers = append(r.answers, o.res)
		r.who = append(r.who, o.a.ID)
	}
	return r
}

// holders are the attempts of outs that held rk's key in flight, and
// when: executions, and attempts whose handler panicked before the
// upstream.
func holders(outs []*outcome) []*outcome {
	var out []*outcome
	for _, o := range outs {
		if o.exec != nil || o.res.NoAnswer && o.a.Do.Panic == "before" && o.a.Mode == ReadAll {
			out = append(out, o)
		}
	}
	return out
}

func overlaps(o *outcome, h *outcome) bool {
	return h != o && !h.done.Before(o.res.Sent) && !o.res.Done.Before(h.res.Sent)
}

// waits reports whether attempt a waits for an in-flight first request,
// and for how long at most.
func waits(a *Attempt, p Policy) (time.Duration, bool) {
	for _, v := range a.headerValues("Prefer") {
		for pref := range strings.SplitSeq(v, ",") {
			name, val, ok := strings.Cut(strings.TrimSpace(pref), "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			n, err := strconv.ParseUint(strings.Trim(val, `"`), 10, 64)
			if err != nil {
				break // malformed: ignored
			}
			return min(time.Duration(min(n, 1<<40))*time.Second, p.WaitTimeout), true
		}
	}
	if p.InFlight == "wait" {
		return p.WaitTimeout, true
	}
	return 0, false
}

// judgeNonExecuting checks an attempt that did not reach the upstream.
func (j *judge) judgeNonExecuting(rk recKey, o *outcome, outs []*outcome, candidates []*record) {
	r, p := o.res, o.d.pol
	if r.NoAnswer {
		if o.a.Mode != ReadAll || o.a.Do.Panic == "before" {
			return
		}
		j.fail("no-answer", "%s got no answer (%s) and never reached the upstream", o.a.ID, r.Err)
		return
	}
	slug := problemSlug(r, p)
	switch {
	case slug == "request-outstanding" || slug == "?" && r.Status == 409:
		var holding []*outcome
		for _, h := range holders(outs) {
			if h.d.fp == o.d.fp && overlaps(o, h) {
				holding = append(holding, h)
			}
		}
		if len(holding) == 0 {
			j.fail("wrong-answer", "%s got 409 but no request with its key and body was in flight: %s", o.a.ID, r.describe())
			return
		}
		if budget, ok := waits(o.a, p); ok && budget >= time.Second {
			for _, h := range holding {
				if h.done.After(r.Done.Add(-time.Second)) {
					return
				}
			}
			j.fail("wait-ignored", "%s waits up to %s for the first request, which finished long before; it got 409", o.a.ID, budget)
		}
	case slug == "key-reused" || slug == "?" && r.Status == 422:
		var rec *record
		for _, c := range candidates {
			if c.fp != o.d.fp && j.possiblyLive(c, o) {
				rec = c
			}
		}
		for _, h := range holders(outs) {
			if h.d.fp != o.d.fp && overlaps(o, h) {
				rec = &record{parts: h.d.parts}
			}
		}
		if rec == nil {
			j.fail("wrong-answer", "%s got 422 but no record of another request held key %q: %s", o.a.ID, rk.key, r.describe())
			return
		}
		var pb struct {
			Differs []string `json:"differs"`
		}
		_ = json.Unmarshal(r.Body, &pb)
		if wrong := differsSound(pb.Differs, rec.parts, o.d.parts); len(wrong) > 0 {
			j.fail("differs-unsound", "%s: 422 differs %q names %q, which do not differ (or the request lacks)", o.a.ID, pb.Differs, wrong)
		}
	case slug == "too-many-keys" || slug == "?" && r.Status == 429:
		limit := j.cfg.Store.MaxKeysPerScope
		if limit == 0 || len(j.scopeKey(rk.scope)) < limit {
			j.fail("wrong-answer", "%s got 429 although its client holds %d keys (limit %d)", o.a.ID, len(j.scopeKey(rk.scope)), limit)
		}
	case slug != "":
		j.fail("wrong-answer", "%s: a healthy store answered %d %s: %s", o.a.ID, r.Status, slug, r.describe())
	case r.Header.Get(HeaderReq) != "" && r.Header.Get(HeaderReq) != o.a.ID:
		j.judgeReplay(rk, o, candidates)
	default:
		j.fail("wrong-answer", "%s never reached the upstream and got %s", o.a.ID, r.describe())
	}
}

// possiblyLive reports whether rec may have been live during o.
func (j *judge) possiblyLive(rec *record, o *outcome) bool {
	_, hi := rec.expiry()
	return !o.res.Sent.After(hi) && !o.res.Done.Before(rec.lo.Add(-slack))
}

// judgeReplay checks a replayed answer: of a record of this key and body
// that may have been live, marked as a replay.
func (j *judge) judgeReplay(rk recKey, o *outcome, candidates []*record) {
	r := o.res
	src := r.Header.Get(HeaderReq)
	var rec *record
	for _, c := range candidates {
		if c.owner.ID == src {
			rec = c
		}
	}
	if rec == nil {
		if d, ok := j.keyOf[src]; ok && d != rk {
			j.fail("foreign-answer", "%s (key %q) got the answer of %s, a request with another scope or key", o.a.ID, rk.key, src)
		} else {
			j.fail("wrong-answer", "%s got the answer of %s, which holds no record of this key now: %s", o.a.ID, src, r.describe())
		}
		return
	}
	if rec.fp != o.d.fp {
		j.fail("replayed-other-request", "%s got a replay of %s, a different request with the same key (want 422)", o.a.ID, src)
	}
	if !j.possiblyLive(rec, o) {
		j.fail("replayed-expired", "%s got a replay of %s after its ttl (%s) ended", o.a.ID, src, rec.ttl)
	}
	if h := o.d.pol.ReplayHeader; h != "off" && r.Header.Get(h) != "true" {
		j.fail("unmarked-replay", "%s: a replay without %s: true: %s", o.a.ID, h, r.describe())
	}
	if r.Header.Get("Content-Encoding") != "" {
		if ae, _ := o.a.header("Accept-Encoding"); !strings.Contains(ae, r.Header.Get("Content-Encoding")) {
			j.fail("replay-encoding", "%s: a replay encoded %s for a client that did not ask for it", o.a.ID, r.Header.Get("Content-Encoding"))
		}
	}
	rec.answers = append(rec.answers, r)
	rec.who = append(rec.who, o.a.ID)
	j.checkReplayContent(o, rec)
}

// checkReplayContent compares a replay with what the upstream sent.
func (j *judge) checkReplayContent(o *outcome, rec *record) {
	r, sent := o.res, rec.exec.Sent
	if r.Status != sent.Status || r.Header.Get("X-Model-Exec") != strconv.Itoa(rec.exec.Seq) {
		j.fail("replay-differs", "%s: replay of %s has status %d exec %s, the upstream sent %d exec %d", o.a.ID, rec.owner.ID, r.Status, r.Header.Get("X-Model-Exec"), sent.Status, rec.exec.Seq)
	}
	omitted := r.Header.Get("Idempotent-Body-Omitted") == "true"
	limit := int(o.d.pol.MaxResponseSize)
	mayOmit := rec.omitted || len(sent.Wire) > limit || len(sent.Body) > limit
	// A client that stopped reading (StopReading) has the status and the
	// headers, the marker among them, but never read the body or the
	// trailers: only what it read is compared.
	read := o.a.Mode == ReadAll
	switch {
	case omitted && !mayOmit:
		j.fail("replay-differs", "%s: replay of %s omits a body of %d bytes (limit %d)", o.a.ID, rec.owner.ID, len(sent.Body), limit)
	case omitted && len(r.Body) > 0:
		j.fail("replay-differs", "%s: replay of %s says its body is omitted but has %d bytes", o.a.ID, rec.owner.ID, len(r.Body))
	case !omitted && rec.omitted:
		j.fail("replay-differs", "%s: replay of %s, whose body was not recorded, lacks Idempotent-Body-Omitted", o.a.ID, rec.owner.ID)
	case !omitted && read && !slices.Equal(r.Body, sent.Body) && !(len(r.Body) == 0 && len(sent.Body) == 0):
		j.fail("replay-differs", "%s: replay of %s has body %.80q, the upstream sent %.80q", o.a.ID, rec.owner.ID, r.Body, sent.Body)
	}
	if len(sent.Trailer) > 0 && !rec.omitted && read && !trailersEqual(r.Trailer, sent.Trailer) {
		j.fail("replay-trailers", "%s: replay of %s has trailers %v, the upstream sent %v", o.a.ID, rec.owner.ID, r.Trailer, sent.Trailer)
	}
}

// volatile headers differ between answers of one record by design.
var volatile = []string{"Date", "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Trailer",
	"Vary", "Content-Encoding", "Idempotent-Body-Omitted", "Preference-Applied", "Alt-Svc", "Retry-After"}

// checkFidelity compares every answer of every record with the first: a
// replay is the recorded response, whatever outer handlers do to it.
func (j *judge) checkFidelity(recs []*record) {
	skip := append(append([]string{}, volatile...), replayHeaders(j.cfg)...)
	for _, rec := range recs {
		if len(rec.answers) < 2 {
			continue
		}
		first := rec.answers[0]
		for i, a := range rec.answers[1:] {
			if d := headerDiff(first.Header, a.Header, skip); d != "" {
				j.fail("replay-differs", "answers of %s differ: %s and %s: %s", rec.owner.ID, rec.who[0], rec.who[i+1], d)
			}
		}
	}
}

func headerDiff(a, b http.Header, skip []string) string {
	var diffs []string
	names := map[string]bool{}
	for n := range a {
		names[n] = true
	}
	for n := range b {
		names[n] = true
	}
	for _, n := range sortedKeys(names) {
		if slices.Contains(skip, n) {
			continue
		}
		if !slices.Equal(a[n], b[n]) {
			diffs = append(diffs, n+": "+strings.Join(a[n], ",")+" vs "+strings.Join(b[n], ","))
		}
	}
	return strings.Join(diffs, "; ")
}

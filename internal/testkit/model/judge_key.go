package model

import (
	"encoding/json"
	"fmt"
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
	var owners []*outcome // the attempts that took the key: handed on to the upstream
	for _, o := range outs {
		switch {
		case o.passedOpen():
			// Not the key's: the handler passed it on (fail_open).
			j.passedOpen++
			j.checkArrived(o, false)
			j.checkOwnAnswer(o, "wrong-answer")
		case o.owned():
			owners = append(owners, o)
		}
	}
	slices.SortFunc(owners, func(a, b *outcome) int { return a.start().Compare(b.start()) })

	// Owners: never two at once, never while a record lives.
	live := old
	var kept []*record
	for i, o := range owners {
		arrived := o.start()
		for _, p := range owners[:i] {
			if p.exec != nil && o.exec != nil && arrived.Before(p.heldUntil().Add(-slack)) {
				kind, spelling := spelt("duplicate", "equivalent-ran", o.a, p.a)
				j.fail(kind, "%s ran while %s (same key %q) was still running: two executions at once%s", o.a.ID, p.a.ID, rk.key, spelling)
			}
		}
		if live != nil {
			if lo, _ := live.expiry(); arrived.Before(lo) {
				switch {
				case live.unknown:
					want := "the outcome-unknown answer"
					if live.fp != o.d.fp {
						want = "422, for another request"
					}
					j.fail("ran-after-unknown", "%s ran although key %q holds the outcome-unknown record of %s (%s; ttl %s; want %s): the upstream may have run it twice",
						o.a.ID, rk.key, live.owner.ID, live.owner.Do.failure(), live.ttl, want)
				case live.fp != o.d.fp:
					j.fail("ran-mismatch", "%s ran although key %q holds the record of %s for another request (want 422)", o.a.ID, rk.key, live.owner.ID)
				default:
					kind, spelling := spelt("duplicate", "equivalent-ran", o.a, live.owner)
					j.fail(kind, "%s ran although key %q holds the record of %s (ttl %s): the upstream ran twice%s", o.a.ID, rk.key, live.owner.ID, live.ttl, spelling)
				}
			}
		}
		if o.exec != nil {
			j.checkArrived(o, true)
			j.checkOwnAnswer(o, "wrong-answer")
		} else if o.a.Do.Fail == FailRefused {
			j.checkRefused(o, "wrong-answer")
		}
		switch j.settles(o) {
		case keyFreed:
			live = nil
			delete(j.scopeKey(rk.scope), rk.key)
			continue
		case keyUnknown:
			live = j.unknownRecord(o)
		default:
			live = j.newRecord(o)
		}
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
		if o.owned() || o.passedOpen() {
			continue
		}
		j.judgeNonExecuting(rk, o, outs, candidates)
	}

	// The record in force after the step.
	switch {
	case len(owners) > 0 && live == nil:
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

// How an owner leaves its key (settles).
const (
	keyRecorded = iota // its response is recorded
	keyFreed           // the key is free again: the next request runs
	keyUnknown         // an outcome-unknown record keeps it
)

// settles says how an attempt that owned its key leaves it: freed when
// nothing reached the upstream or its status is in release_on; kept as
// an outcome-unknown record when the request reached the upstream (or may
// have) and no final status came back, unless on_unknown_outcome
// releases it; else recorded.
func (j *judge) settles(o *outcome) int {
	b := o.a.Do
	switch b.Settles() {
	case SettlesNotSent:
		return keyFreed
	case SettlesUnknown:
		if o.d.pol.releasesUnknown() {
			return keyFreed
		}
		return keyUnknown
	}
	if o.d.pol.releases(b.Status) {
		return keyFreed
	}
	return keyRecorded
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

// unknownRecord is the outcome-unknown record an owner whose request
// failed before any status leaves: written once the handler in front of
// the upstream returned (or panicked), before Caddy was done with it.
func (j *judge) unknownRecord(o *outcome) *record {
	return &record{fp: o.d.fp, parts: o.d.parts, exec: o.exec, owner: o.a, ttl: o.d.pol.TTL, lo: o.start(), hi: o.done, unknown: true}
}

// holders are the attempts of outs that held rk's key in flight: those
// handed on to the upstream (executions, a refused dial, a panic before
// it).
func holders(outs []*outcome) []*outcome {
	var out []*outcome
	for _, o := range outs {
		if o.owned() {
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
		if o.a.Mode != ReadAll {
			return
		}
		j.fail("no-answer", "%s got no answer (%s) and never reached the upstream", o.a.ID, r.Err)
		return
	}
	slug := problemSlug(r, p)
	switch {
	case slug == "outcome-unknown" || slug == "?" && r.Status == 502:
		j.judgeUnknownAnswer(rk, o, outs, candidates)
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
			kind, spelling := spelt("wrong-answer", "equivalent-mismatch", append(sameRequest(o, outs, candidates), o.a)...)
			j.fail(kind, "%s got 422 but no record of another request held key %q: %s%s", o.a.ID, rk.key, r.describe(), spelling)
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
		kind, spelling := spelt("wrong-answer", "equivalent-refused", o.a)
		j.fail(kind, "%s: a healthy store answered %d %s: %s%s", o.a.ID, r.Status, slug, r.describe(), spelling)
	case r.Header.Get(HeaderReq) != "" && r.Header.Get(HeaderReq) != o.a.ID:
		j.judgeReplay(rk, o, candidates)
	default:
		j.fail("wrong-answer", "%s never reached the upstream and got %s", o.a.ID, r.describe())
	}
}

// judgeUnknownAnswer checks an outcome-unknown answer: a record of this
// key and body whose outcome is unknown may have been live, and the
// answer is the problem the contract says (502, not retryable).
func (j *judge) judgeUnknownAnswer(rk recKey, o *outcome, outs []*outcome, candidates []*record) {
	r := o.res
	var rec *record
	for _, c := range candidates {
		if c.unknown && c.fp == o.d.fp && j.possiblyLive(c, o) {
			rec = c
		}
	}
	if rec == nil {
		j.fail("wrong-answer", "%s got the outcome-unknown answer but no request with key %q and its body failed before its status: %s", o.a.ID, rk.key, r.describe())
		return
	}
	if r.Status != 502 {
		j.fail("wrong-answer", "%s: the outcome-unknown answer has status %d, want 502: %s", o.a.ID, r.Status, r.describe())
	}
	if r.Header.Get("Content-Type") == "application/problem+json" {
		var pb struct {
			Retryable *bool `json:"retryable"`
		}
		if json.Unmarshal(r.Body, &pb) != nil || pb.Retryable == nil || *pb.Retryable {
			j.fail("wrong-answer", "%s: the outcome-unknown answer must say retryable false: %s", o.a.ID, r.describe())
		}
	}
	if h := o.d.pol.ReplayHeader; h != "off" && r.Header.Get(h) != "" {
		j.fail("wrong-answer", "%s: the outcome-unknown answer is no replay, yet carries %s", o.a.ID, h)
	}
}

// spelt returns kind, or equivalent when an attempt in question spells
// its request otherwise than plainly (form.go): the oracle takes each as
// its plain request, so an anomaly between them is one of a variant that
// HTTP calls the same request getting another outcome. The note says how
// each was spelt.
func spelt(kind, equivalent string, as ...*Attempt) (string, string) {
	var forms []string
	for _, a := range as {
		if f := a.Form.String(); f != "" {
			forms = append(forms, fmt.Sprintf("%s as (%s)", a.ID, f))
		}
	}
	if len(forms) == 0 {
		return kind, ""
	}
	return equivalent, "; sent " + strings.Join(forms, ", ") + ", which HTTP calls the same request as its plain spelling"
}

// sameRequest are the attempts that made or hold records of o's key and
// request (its fingerprint), whose spelling may have split them from o.
func sameRequest(o *outcome, outs []*outcome, candidates []*record) []*Attempt {
	var as []*Attempt
	for _, c := range candidates {
		if c.fp == o.d.fp {
			as = append(as, c.owner)
		}
	}
	for _, h := range holders(outs) {
		if h.d.fp == o.d.fp && h != o {
			as = append(as, h.a)
		}
	}
	return as
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

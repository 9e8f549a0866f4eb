package model

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Anomaly is something the contract forbids that a trial saw.
type Anomaly struct {
	Kind   string // a short class, for counting and shrinking
	Step   int
	Detail string
}

func (a Anomaly) String() string { return fmt.Sprintf("step %d: %s: %s", a.Step, a.Kind, a.Detail) }

// slack absorbs clock granularity (Redis keeps milliseconds) and the
// moments between the model's clock readings and the server's.
const slack = 50 * time.Millisecond

// record is the oracle's view of a key's record.
type record struct {
	fp      string
	parts   reqParts
	exec    *Execution
	owner   *Attempt
	omitted bool      // the body is not recorded
	lo, hi  time.Time // the completion happened between these
	ttl     time.Duration
	// answers are the full answers that are this record: the first
	// client's, if it read it whole, and every replay.
	answers []*Result
	who     []string
	// unknown: the owner's request failed before any status, after it
	// may have reached the upstream; the record keeps the key, and every
	// retry gets the outcome-unknown answer. exec is nil when it never
	// reached it as far as the model can tell (a panic before).
	unknown bool
}

// expiry bounds the record's end: certainly live before lo, certainly
// gone after hi.
func (r *record) expiry() (lo, hi time.Time) {
	return r.lo.Add(r.ttl - slack), r.hi.Add(r.ttl + slack)
}

// judge keeps the oracle's state across a trial's steps and checks each.
type judge struct {
	cfg       *Config
	up        *Upstream
	recs      map[recKey]*record
	scopeKeys map[string]map[string]bool // memory: keys held per scope
	step      int
	anomalies []Anomaly
	seenExec  map[string]bool
	keyOf     map[string]recKey // the record key of every keyed attempt
	mayLate   map[string]bool   // attempts that may reach the upstream in a later step
	// invalidStatus counts transparent answers with a status net/http
	// refuses to write: it panics on each, as it would without the module.
	invalidStatus int
	all           []*record // every record the trial made
	run           string    // the trial's token: executions without it are another trial's
	refused       int       // invalid configurations checked before the trial's own
	// passedOpen counts the executions fail_open passed on without the
	// handler (passedOpen): each must be one the handler counted in
	// fail_open_total (Env.Run checks).
	passedOpen int
}

func newJudge(cfg *Config, up *Upstream, run string) *judge {
	return &judge{cfg: cfg, up: up, run: run, recs: make(map[recKey]*record), scopeKeys: make(map[string]map[string]bool), seenExec: make(map[string]bool), keyOf: make(map[string]recKey), mayLate: make(map[string]bool)}
}

func (j *judge) fail(kind, format string, args ...any) {
	j.anomalies = append(j.anomalies, Anomaly{Kind: kind, Step: j.step, Detail: fmt.Sprintf(format, args...)})
}

// outcome is one attempt of a step with what it got.
type outcome struct {
	a    *Attempt
	res  *Result
	d    decision
	exec *Execution
	done time.Time // Caddy was done with it
	// reached is when it reached the handler in front of the upstream
	// (zero: never): a keyed attempt that did owned its key, whether the
	// upstream then ran it or not (a refused dial, a panic before it).
	reached time.Time
}

// owned reports whether o took its key and was handed on to the upstream.
func (o *outcome) owned() bool { return o.exec != nil || !o.reached.IsZero() }

// passedOpen reports whether o ran without the handler under fail_open:
// the store failed (a timeout under load, an outage), and the upstream
// got the request as the client sent it, without the handler's
// Accept-Encoding: identity. Such a run may repeat a key; it is legal
// only as one of the passes the handler counts (fail_open_total).
func (o *outcome) passedOpen() bool {
	if o.exec == nil || !o.d.pol.FailOpen {
		return false
	}
	return o.exec.Header.Get("Accept-Encoding") != "identity" && strings.Join(o.a.wireValues("Accept-Encoding"), ",") != "identity"
}

// start is when o began to act for its key: the upstream got it, or the
// handler in front of the upstream did.
func (o *outcome) start() time.Time {
	if o.exec != nil {
		return o.exec.Arrived
	}
	return o.reached
}

// heldUntil is when o stopped holding its key: once its answer ended at
// the upstream, or once Caddy was done with it when that came first (a
// response-header timeout answers 504 while the upstream still works).
func (o *outcome) heldUntil() time.Time {
	if o.exec == nil || o.exec.Finished.IsZero() || o.done.Before(o.exec.Finished) {
		return o.done
	}
	return o.exec.Finished
}

// judgeStep checks one step's attempts.
func (j *judge) judgeStep(step int, outs []*outcome) {
	j.step = step
	keyed := map[recKey][]*outcome{}
	var order []recKey
	for _, o := range outs {
		if o.exec != nil {
			j.seenExec[o.a.ID] = true
		}
		j.checkAnswerShape(o)
		switch o.d.kind {
		case "nethttp":
			if o.exec != nil || o.a.Mode == ReadAll && !o.res.NoAnswer && o.res.Status != 400 {
				j.fail("wrong-answer", "%s: %s; want net/http's 400 without running: got %s", o.a.ID, o.d.why, o.res.describe())
			}
		case "reject":
			j.checkReject(o)
		case "transparent":
			j.checkTransparent(o)
		case "keyed":
			if _, ok := keyed[o.d.rk]; !ok {
				order = append(order, o.d.rk)
			}
			keyed[o.d.rk] = append(keyed[o.d.rk], o)
		}
	}
	for _, rk := range order {
		j.judgeKey(rk, keyed[rk])
	}
	j.checkStray()
}

// checkStray fails on executions of this trial's attempts that no step
// saw: a request that ran late, or twice. An execution of another
// trial's attempt (a client that hung up there, reaching the upstream
// only now) is that trial's, not this one's.
func (j *judge) checkStray() {
	for _, e := range j.up.Executions() {
		if !strings.HasPrefix(e.Req, j.run) {
			continue
		}
		if !j.seenExec[e.Req] && !j.mayLate[e.Req] {
			j.seenExec[e.Req] = true
			j.fail("stray-execution", "the upstream ran %s (%s %s) outside its step", e.Req, e.Method, e.Path)
		}
	}
}

// checkAnswerShape checks what holds for every answer: no 500, no
// panic of the module's own (see the log check), and a problem answer is
// well formed.
func (j *judge) checkAnswerShape(o *outcome) {
	r := o.res
	if r.NoAnswer {
		return
	}
	if r.Status == 500 && r.Header.Get(HeaderReq) == "" {
		j.fail("500", "%s got a 500 of Caddy's own: %s", o.a.ID, r.describe())
	}
	if r.Header.Get("Content-Type") == "application/problem+json" {
		var p struct {
			Type   string `json:"type"`
			Status int    `json:"status"`
		}
		if err := json.Unmarshal(r.Body, &p); err != nil || p.Status != r.Status || !strings.HasPrefix(p.Type, "urn:caddy-idempotency:") {
			j.fail("bad-problem", "%s: problem body %q does not match status %d", o.a.ID, r.Body, r.Status)
		}
	}
}

// problemSlug returns the problem type of an answer, "" when it is no
// problem answer. A handle_errors rejection carries no body: "?".
func problemSlug(r *Result, pol Policy) string {
	if r.NoAnswer {
		return ""
	}
	if r.Header.Get("Content-Type") == "application/problem+json" {
		var p struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(r.Body, &p)
		return strings.TrimPrefix(p.Type, "urn:caddy-idempotency:")
	}
	if pol.HandleErrors && len(r.Body) == 0 && r.Header.Get(HeaderReq) == "" && slices.Contains([]int{400, 409, 413, 415, 422, 429, 502, 503}, r.Status) {
		return "?"
	}
	return ""
}

func (j *judge) checkReject(o *outcome) {
	slug := problemSlug(o.res, o.d.pol)
	if o.exec != nil {
		j.fail("ran-refused", "%s should be refused (%d %s: %s) without running, but the upstream ran it", o.a.ID, o.d.status, o.d.slug, o.d.why)
	}
	if o.a.Mode != ReadAll {
		return // it never looked at the answer
	}
	if o.res.NoAnswer || o.res.Status != o.d.status || slug != o.d.slug && slug != "?" {
		j.fail("wrong-answer", "%s: want %d %s (%s), got %s", o.a.ID, o.d.status, o.d.slug, o.d.why, o.res.describe())
		return
	}
	if o.d.status == 415 {
		// RFC 9110 15.5.16: the answer says which codings it decodes.
		ae := strings.ToLower(o.res.Header.Get("Accept-Encoding"))
		for _, c := range []string{"gzip", "deflate", "zstd"} {
			if !strings.Contains(ae, c) {
				j.fail("wrong-answer", "%s: a 415 for a coding must list the codings it decodes in Accept-Encoding, %s missing: %s", o.a.ID, c, o.res.describe())
			}
		}
	}
}

// checkTransparent checks an attempt no enforcing handler takes: it
// reaches the upstream as the client sent it and gets exactly the
// upstream's answer.
func (j *judge) checkTransparent(o *outcome) {
	b := o.a.Do
	if o.a.Mode == HangUp {
		// Without the module, a client that hangs up cancels the
		// request: it may reach the upstream, late, or not at all.
		j.mayLate[o.a.ID] = true
		return
	}
	if b.Panic == "before" {
		if o.exec != nil || !o.res.NoAnswer && o.a.Mode == ReadAll {
			j.fail("not-transparent", "%s: the handler in front of the upstream panics: want no answer and no execution, got %s", o.a.ID, o.res.describe())
		}
		return
	}
	if b.Fail == FailRefused {
		j.checkRefused(o, "not-transparent")
		return
	}
	if !b.ValidFinal() && b.Fail == "" {
		j.invalidStatus++ // net/http panics on it, as it would without the module
	}
	if o.exec == nil {
		j.fail("not-transparent", "%s passes through, but never reached the upstream; the client got %s; the attempt: %s", o.a.ID, o.res.describe(), o.a.short())
		return
	}
	j.checkArrived(o, false)
	j.checkOwnAnswer(o, "not-transparent")
}

// checkArrived checks that the upstream received what the client sent,
// byte for byte as it spelt it (an encoded body still encoded); identity
// says the handler ran the request (it asks for an identity body).
func (j *judge) checkArrived(o *outcome, identity bool) {
	e, a := o.exec, o.a
	if sent := a.bodyOnWire(); e.BodyErr != "" || !slices.Equal(e.Body, sent) && !(len(e.Body) == 0 && len(sent) == 0) {
		j.fail("body-changed", "%s: the upstream received %d bytes (%s), the client sent %d", a.ID, len(e.Body), e.BodyErr, len(sent))
	}
	for _, name := range []string{"Idempotency-Key", "X-Request-Key", "Content-Type", "Content-Encoding", "Authorization", "Prefer"} {
		sent := a.wireValues(name)
		got := e.Header.Values(name)
		if !slices.Equal(sent, got) && !(len(sent) == 0 && len(got) == 0) {
			j.fail("header-changed", "%s: the upstream received %s %q, the client sent %q", a.ID, name, got, sent)
		}
	}
	sentAE := strings.Join(a.wireValues("Accept-Encoding"), ",")
	gotAE := e.Header.Get("Accept-Encoding")
	if identity && gotAE != "identity" && gotAE != "" {
		j.fail("header-changed", "%s: a request the handler runs must ask for identity, the upstream saw Accept-Encoding %q", a.ID, gotAE)
	}
	if !identity && gotAE != sentAE && !(sentAE == "" && gotAE == "gzip") {
		j.fail("header-changed", "%s: the upstream received Accept-Encoding %q, the client sent %q", a.ID, gotAE, sentAE)
	}
}

// checkOwnAnswer checks that the client got the answer of its own
// execution, as the upstream sent it.
func (j *judge) checkOwnAnswer(o *outcome, kind string) {
	e, r, b := o.exec, o.res, o.a.Do
	if o.a.Mode != ReadAll {
		return
	}
	switch {
	case b.Fail == FailTimeout:
		if r.NoAnswer || r.Status != 504 || r.Header.Get(HeaderReq) != "" {
			j.fail(kind, "%s: the upstream answered after the proxy's response_header_timeout: want 504, got %s", o.a.ID, r.describe())
		}
		return
	case b.CloseBeforeStatus || b.Status == 1000:
		if r.NoAnswer || r.Status != 502 {
			j.fail(kind, "%s: the upstream gave no valid status: want 502, got %s", o.a.ID, r.describe())
		}
		return
	case !b.ValidFinal():
		if !r.NoAnswer && r.Status != 502 {
			j.fail(kind, "%s: the upstream answered status %03d: want 502 or no answer, got %s", o.a.ID, b.Status, r.describe())
		}
		return
	case b.BreakAfter >= 0 || b.Panic == "after":
		if !r.NoAnswer && (r.Status != b.Status || !r.BrokeOff && b.Status != 204) {
			j.fail(kind, "%s: the answer breaks off after status %d: got %s", o.a.ID, b.Status, r.describe())
		}
		return
	}
	if r.NoAnswer {
		j.fail(kind, "%s: the upstream answered %d, the client got %s", o.a.ID, b.Status, r.describe())
		return
	}
	if r.Status != b.Status || r.Header.Get(HeaderReq) != o.a.ID || !slices.Equal(r.Body, e.Sent.Body) && !(len(r.Body) == 0 && len(e.Sent.Body) == 0) {
		j.fail(kind, "%s: want the upstream's %d with its own body, got %s", o.a.ID, b.Status, r.describe())
	}
	if b.Trailer && !trailersEqual(r.Trailer, e.Sent.Trailer) {
		j.fail(kind, "%s: trailers %v, the upstream sent %v", o.a.ID, r.Trailer, e.Sent.Trailer)
	}
	for _, name := range replayHeaders(j.cfg) {
		if r.Header.Get(name) != "" {
			j.fail(kind, "%s: an answer that is no replay carries %s", o.a.ID, name)
		}
	}
}

// checkRefused checks an attempt whose proxy dialed an address that
// refuses connections: the upstream never ran it, and its client got
// Caddy's 502.
func (j *judge) checkRefused(o *outcome, kind string) {
	r := o.res
	if o.exec != nil {
		j.fail(kind, "%s: its proxy dials an address that refuses connections, yet the upstream ran it", o.a.ID)
	}
	if o.a.Mode == ReadAll && (r.NoAnswer || r.Status != 502 || r.Header.Get(HeaderReq) != "") {
		j.fail(kind, "%s: its proxy dials an address that refuses connections: want Caddy's 502, got %s", o.a.ID, r.describe())
	}
}

func trailersEqual(got, want http.Header) bool {
	for name := range want {
		if got.Get(name) != want.Get(name) {
			return false
		}
	}
	return true
}

// replayHeaders are the replay markers the trial's handlers use.
func replayHeaders(cfg *Config) []string {
	var out []string
	for _, p := range cfg.Layout.Handlers {
		if p.Observe {
			continue
		}
		if h := p.effective().ReplayHeader; h != "off" && !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

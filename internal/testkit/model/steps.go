package model

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Step is one moment of a trial: one attempt, or several at once.
type Step struct {
	Kind string // single, burst, sequence, wait, hangup, stall, timed
	// Attempts of the step. For wait, the first is the slow owner, sent
	// first; the others are sent once it reached the upstream.
	Attempts []*Attempt
	// Scenario is the scenario the step plays ("" for a random step;
	// see scenario.go), and Timing its schedule (nil: Kind says).
	Scenario string
	Timing   *timing
}

// intent is what one client means to do once: its scope and key, and
// the request it sends for it.
type intent struct {
	label   string // X-Model-Intent
	host    string
	auth    string // Authorization, "" none
	tenant  string // X-Tenant, "" none
	key     keyForm
	method  string
	target  string
	ctype   string // "" none
	variant string // X-Variant
	body    bodyForm
}

// keyForm is how a key is written in the request.
type keyForm struct {
	lines []string // header lines of the key header (none: no key)
	// id is the key it means when valid; hostile forms are invalid
	// whatever the policy.
	id      string
	hostile string // why it is invalid, "" when it depends on the policy
}

// bodyForm is a body and what it means.
type bodyForm struct {
	kind    string // json, invalid, text, empty
	amount  int
	nonce   int
	spell   int    // spelling of the same JSON (whitespace, member order, numbers)
	idJSON  string // raw JSON of the /id member, "" absent
	dupID   bool   // a second /id member
	size    int    // padding, to cross max_body_size
	chunked bool
}

func (b bodyForm) bytes() []byte {
	switch b.kind {
	case "invalid":
		return []byte(`{"amount": 10, "currency": "EUR"`)
	case "text":
		return []byte(fmt.Sprintf("amount=%d pad=%s", b.amount, strings.Repeat("t", b.size)))
	case "empty":
		return nil
	}
	amount := fmt.Sprint(b.amount)
	if b.spell%3 == 2 {
		amount = fmt.Sprintf("%d.0e0", b.amount) // the same number
	}
	members := []string{
		fmt.Sprintf(`"amount":%s`, amount),
		`"currency":"EUR"`,
		fmt.Sprintf(`"nonce":%d`, b.nonce),
		fmt.Sprintf(`"pad":%q`, strings.Repeat("p", b.size)),
	}
	if b.idJSON != "" {
		members = append(members, `"id":`+b.idJSON)
		if b.dupID {
			members = append(members, `"id":"other-id"`)
		}
	}
	if b.spell%2 == 1 {
		for i, j := 0, len(members)-1; i < j; i, j = i+1, j-1 {
			members[i], members[j] = members[j], members[i]
		}
		return []byte("{ " + strings.Join(members, " ,\n ") + " }")
	}
	return []byte("{" + strings.Join(members, ",") + "}")
}

// gen draws the steps of a trial.
type gen struct {
	r       *rand.Rand
	run     string // unique per run: ids, hosts and keys
	cfg     *Config
	long    bool
	intents []*intent
	n       int // attempts made

	// Version 2: r2 draws what version 1 did not have (protocols, keys
	// shared between scopes, scenarios), so that a version 1 trial is
	// drawn as before.
	v2           bool
	r2           *rand.Rand
	scenarioKeys int

	// Version 3: r3 draws what version 2 did not have (the variants of a
	// request that HTTP calls equal, the ways an upstream fails, other
	// writers of the store), so that a version 2 trial is drawn as
	// before.
	v3 bool
	r3 *rand.Rand
	// rf draws version 3's spellings of a request (form.go) and the
	// steps of variants. It is a stream of its own rather than r3, so
	// that the other additions of version 3 and these never move each
	// other's draws: a seed found with either keeps drawing its trial as
	// the other grows.
	rf *rand.Rand
}

func (g *gen) steps(count int) []Step {
	var out []Step
	for range count {
		out = append(out, g.step())
	}
	return out
}

func (g *gen) step() Step {
	if g.v3 && g.rf.IntN(6) == 0 {
		return g.variantsStep()
	}
	r := g.r
	x := r.IntN(100)
	switch {
	case x < 45:
		return Step{Kind: "single", Attempts: []*Attempt{g.attempt(g.pickIntent(), ReadAll)}}
	case x < 60:
		in := g.pickIntent()
		n := 3 + r.IntN(8)
		do := g.behaviour()
		var as []*Attempt
		for range n {
			a := g.attempt(in, ReadAll)
			a.Do = do
			as = append(as, a)
		}
		return Step{Kind: "burst", Attempts: as}
	case x < 72:
		in := g.pickIntent()
		owner := g.attempt(in, ReadAll)
		owner.Do.Delay = time.Duration(200+r.IntN(300)) * time.Millisecond
		owner.Do.Panic, owner.Do.CloseBeforeStatus = "", false
		owner.Do.Fail, owner.Do.Reset = "", false // (version 3) the others wait for its answer
		as := []*Attempt{owner}
		for range 1 + r.IntN(4) {
			w := g.attempt(in, ReadAll)
			switch r.IntN(5) {
			case 0:
				w.Header = append(w.Header, [2]string{"Prefer", "wait=5"})
			case 1:
				w.Header = append(w.Header, [2]string{"Prefer", "respond-async, wait=1"})
			case 2:
				w.Header = append(w.Header, [2]string{"Prefer", "wait=99999999999"})
			case 3:
				w.Header = append(w.Header, [2]string{"Prefer", "wait=soon"})
			}
			as = append(as, w)
		}
		return Step{Kind: "wait", Attempts: as}
	case x < 76:
		// Retries one after another: the replays of one record, which
		// must all be the same whatever outer handlers do to them.
		in := g.newIntent()
		do := g.behaviour()
		do.Location = true
		var as []*Attempt
		for range 3 + r.IntN(3) {
			a := g.attempt(in, ReadAll)
			a.Do = do
			as = append(as, a)
		}
		return Step{Kind: "sequence", Attempts: as}
	case x < 80:
		in := g.pickIntent()
		a := g.attempt(in, HangUp)
		a.Do.Delay = time.Duration(50+r.IntN(200)) * time.Millisecond
		return Step{Kind: "hangup", Attempts: []*Attempt{a}}
	case x < 83 && g.long:
		in := g.pickIntent()
		a := g.attempt(in, StopReading)
		a.Do = Behaviour{Status: 201, Size: 16 << 20, BreakAfter: -1}
		a.Stall = 20 * time.Second
		return Step{Kind: "stall", Attempts: []*Attempt{a}}
	default:
		// A fresh client with a key of an odd form, or none.
		in := g.newIntent()
		in.key = g.oddKey()
		return Step{Kind: "single", Attempts: []*Attempt{g.attempt(in, ReadAll)}}
	}
}

// pickIntent returns a known intent (a retry) or a new one; a retry may
// change the request a little or a lot.
func (g *gen) pickIntent() *intent {
	r := g.r
	if len(g.intents) == 0 || r.IntN(3) == 0 {
		return g.newIntent()
	}
	in := *g.intents[r.IntN(len(g.intents))]
	switch r.IntN(8) {
	case 0: // another spelling of the same JSON
		in.body.spell++
	case 1: // another body: 422 if the first was kept
		in.body.amount++
	case 2:
		in.body.nonce++ // ignored with fingerprint ignore /nonce
	case 3: // the quoted spelling of the same key
		if len(in.key.lines) == 1 && in.key.hostile == "" && !strings.HasPrefix(in.key.lines[0], `"`) {
			in.key.lines = []string{`"` + in.key.lines[0] + `"`}
		}
	case 4:
		in.ctype = pick(g.r, "application/json", "text/plain", "")
	}
	return &in
}

func (g *gen) newIntent() *intent {
	r := g.r
	k := len(g.intents)
	in := &intent{
		label:   fmt.Sprintf("%s-i%d", g.run, k),
		host:    fmt.Sprintf("%s-%s.test", g.run, pick(r, "a", "b")),
		auth:    pick(r, "", "Bearer alice", "Bearer bob"),
		tenant:  pick(r, g.run+"-tenant-1", g.run+"-tenant-2", g.run+"-tenant-1", ""),
		method:  pick(r, "POST", "POST", "POST", "PATCH", "PUT", "DELETE", "GET"),
		target:  pick(r, "/orders/1", "/orders/1?x=1", "/orders/2", "/other/1"),
		ctype:   pick(r, "application/json", "application/json", "application/merge-patch+json", "text/plain", ""),
		variant: pick(r, "a", "b"),
	}
	id := fmt.Sprintf("%s-k%d", g.run, k)
	if r.IntN(6) == 0 {
		id = fmt.Sprintf("%s-long-key-%d", g.run, k) // over a max_key_length of 12
	}
	in.key = keyForm{lines: []string{id}, id: id}
	if r.IntN(5) == 0 {
		in.key.lines = []string{`"` + id + `"`}
	}
	in.body = bodyForm{kind: pick(r, "json", "json", "json", "json", "invalid", "text", "empty"), amount: 10, nonce: k}
	if r.IntN(6) == 0 {
		in.body.size = 400 // over a max_body_size of 200
	}
	in.body.chunked = r.IntN(6) == 0
	if r.IntN(3) == 0 {
		// A key in the body, for key_json: the header may be left out.
		in.body.idJSON = pick(r, `"`+id+`"`, "12345", "null", `"has space"`, "1.5", `{"x":1}`)
		in.body.dupID = r.IntN(6) == 0
		if r.IntN(2) == 0 {
			in.key = keyForm{}
		}
	}
	if r.IntN(12) == 0 {
		in.key = keyForm{} // no key at all
	}
	if g.v2 && len(g.intents) > 0 && g.r2.IntN(4) == 0 {
		// Another client with a key an earlier one used: its own record.
		other := g.intents[g.r2.IntN(len(g.intents))]
		in.key = other.key
		in.auth = pick(g.r2, "Bearer carol", "Bearer dave", "")
		in.tenant = pick(g.r2, g.run+"-tenant-3", other.tenant)
	}
	g.intents = append(g.intents, in)
	return in
}

// oddKey draws a hostile key form.
func (g *gen) oddKey() keyForm {
	switch g.r.IntN(8) {
	case 0:
		return keyForm{lines: []string{""}, hostile: "empty"}
	case 1:
		return keyForm{lines: []string{"has space"}, hostile: "space"}
	case 2:
		return keyForm{lines: []string{"one, two"}, hostile: "list"}
	case 3:
		return keyForm{lines: []string{"one", "two"}, hostile: "two lines"}
	case 4:
		return keyForm{lines: []string{"k\xc3\xa9y"}, hostile: "not ASCII"}
	case 5:
		return keyForm{lines: []string{"k\x01y"}, hostile: "control byte"}
	case 6:
		return keyForm{lines: []string{`"unterminated`}, hostile: "bad string"}
	}
	return keyForm{lines: []string{strings.Repeat("k", 300)}, hostile: "too long"}
}

// attempt builds an attempt for in. Version 2 sends a well-formed one
// over HTTP/2, h2c or HTTP/3 now and then.
func (g *gen) attempt(in *intent, mode ClientMode) *Attempt {
	do := g.behaviour()
	gzip := g.r.IntN(4) == 0
	a := g.build(in, mode, do, gzip)
	if g.v2 && a.wellFormed() {
		a.Proto = pick(g.r2, H1, H1, H1, H1, H1, H2, H2C, H3)
	}
	if g.v3 && g.rf.IntN(4) == 0 {
		a.Form = g.form(a)
	}
	return a
}

// variantsStep sends a request and variants of it with its key (version
// 3): spellings HTTP calls the same request (form.go), which must share
// its outcome, and requests that differ in path, method, credential or
// site, which never may. One after another, or all at once.
func (g *gen) variantsStep() Step {
	r := g.rf
	var keyed []*intent // intents with a well-formed key, where variants tell most
	for _, in := range g.intents {
		if in.key.hostile == "" {
			keyed = append(keyed, in)
		}
	}
	var in *intent
	switch x := r.IntN(6); {
	case x < 2 && g.keyJSON():
		in = g.webhookIntent()
	case x < 4 && len(keyed) > 0:
		in = keyed[r.IntN(len(keyed))]
	default:
		in = g.newIntent()
	}
	do := Behaviour{Status: pick(r, 201, 201, 201, 200, 422, 503), Size: 80, BreakAfter: -1}
	variant := func(in *intent) *Attempt {
		a := g.build(in, ReadAll, do, false)
		if a.wellFormed() {
			a.Proto = pick(r, H1, H1, H1, H2, H2C, H3)
		}
		a.Chunked = len(a.Body) > 0 && r.IntN(3) == 0
		a.Form = g.form(a)
		return a
	}
	as := []*Attempt{g.build(in, ReadAll, do, false)}
	for range 2 + r.IntN(4) {
		other := *in
		switch r.IntN(6) {
		case 0:
			other.target = pick(r, "/orders/2", "/orders/1?x=2", "/other/1")
		case 1:
			other.method = pick(r, "POST", "PATCH", "PUT")
		case 2:
			other.auth = pick(r, "Bearer mallory", "")
			other.tenant = g.run + "-tenant-9"
		case 3:
			other.host = otherSite(in.host)
		}
		as = append(as, variant(&other))
	}
	if r.IntN(3) == 0 {
		return Step{Kind: "variants-burst", Attempts: as}
	}
	return Step{Kind: "variants", Attempts: as}
}

// keyJSON reports whether an enforcing handler of the trial takes keys
// from the body.
func (g *gen) keyJSON() bool {
	for _, p := range g.cfg.Layout.Handlers {
		if !p.Observe && p.KeyJSON != "" {
			return true
		}
	}
	return false
}

// webhookIntent is a new intent whose key is only in its JSON body, as a
// webhook's delivery id is (key_json): a delivery that its sender sends
// again, perhaps compressed otherwise. Drawn from the stream of forms.
func (g *gen) webhookIntent() *intent {
	r, k := g.rf, len(g.intents)
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	id := fmt.Sprintf("%sw%c", g.run, digits[k%36]) // within a max_key_length of 12
	in := &intent{
		label:   fmt.Sprintf("%s-i%d", g.run, k),
		host:    fmt.Sprintf("%s-%s.test", g.run, pick(r, "a", "b")),
		auth:    pick(r, "", "Bearer hooks"),
		tenant:  g.run + "-tenant-1",
		method:  "POST",
		target:  pick(r, "/orders/1", "/other/1"),
		ctype:   pick(r, "application/json", "application/json", "text/plain"),
		variant: "a",
		body:    bodyForm{kind: "json", amount: 10, nonce: k, idJSON: `"` + id + `"`},
	}
	g.intents = append(g.intents, in)
	return in
}

// otherSite is a host of another site of the run.
func otherSite(host string) string {
	if h, ok := strings.CutSuffix(host, "-a.test"); ok {
		return h + "-b.test"
	}
	return strings.TrimSuffix(host, "-b.test") + "-a.test"
}

// keyHeader is the key header the attempts send: version 1's, the
// innermost handler's that names one; version 2's, that of the outermost
// enforcing handler, which decides the scenarios' requests.
func (g *gen) keyHeader() string {
	name := "Idempotency-Key"
	for _, p := range g.cfg.Layout.Handlers {
		if g.v2 && !p.Observe {
			return p.effective().Header
		}
		if p.Header != "" {
			name = p.Header
		}
	}
	return name
}

// nextID is the id of the next attempt.
func (g *gen) nextID() string {
	g.n++
	return fmt.Sprintf("%s-r%d", g.run, g.n)
}

// build makes the attempt of in with the upstream doing do; gzip adds
// Accept-Encoding: gzip.
func (g *gen) build(in *intent, mode ClientMode, do Behaviour, gzip bool) *Attempt {
	a := &Attempt{
		ID:     g.nextID(),
		Intent: in.label,
		Method: in.method,
		Target: in.target,
		Host:   in.host,
		Mode:   mode,
		Do:     do,
	}
	hdr := func(k, v string) { a.Header = append(a.Header, [2]string{k, v}) }
	name := g.keyHeader()
	for _, line := range in.key.lines {
		hdr(name, line)
	}
	if in.auth != "" {
		hdr("Authorization", in.auth)
	}
	if in.tenant != "" {
		hdr("X-Tenant", in.tenant)
	}
	if in.ctype != "" {
		hdr("Content-Type", in.ctype)
	}
	hdr("X-Variant", in.variant)
	if gzip {
		hdr("Accept-Encoding", "gzip")
	}
	if in.method != "GET" && in.method != "DELETE" || in.body.kind != "empty" {
		a.Body = in.body.bytes()
		a.Chunked = in.body.chunked && len(a.Body) > 0
	}
	return a
}

// behaviour draws what the upstream does.
func (g *gen) behaviour() Behaviour {
	r := g.r
	b := Behaviour{Status: 201, Size: 80, BreakAfter: -1}
	switch x := r.IntN(100); {
	case x < 45:
	case x < 55:
		b.Status = pick(r, 200, 202, 204)
	case x < 65:
		b.Status = pick(r, 400, 404, 409, 422)
	case x < 75:
		b.Status = pick(r, 401, 403, 429, 408)
	case x < 85:
		b.Status = pick(r, 500, 502, 503)
	case x < 88:
		b.Status = 42 // written 042: a status Go's client accepts
	case x < 90:
		b.Status = 1000 // four digits: Go's client refuses it
	}
	if r.IntN(10) == 0 {
		b.Interim = []int{pick(r, 100, 103)}
	}
	if r.IntN(4) == 0 {
		b.Size = pick(r, 0, 500, 3000)
	}
	b.Gzip = r.IntN(10) == 0
	b.Trailer = r.IntN(10) == 0
	b.Location = r.IntN(3) == 0
	if r.IntN(5) == 0 {
		b.Delay = time.Duration(r.IntN(150)) * time.Millisecond
	}
	switch r.IntN(30) {
	case 0, 1:
		b.BreakAfter = r.IntN(40)
	case 2:
		b.CloseBeforeStatus = true
	case 3:
		b.Panic = "before"
	case 4:
		b.Panic = "after"
	}
	if g.v3 {
		// Version 3: the ways an upstream fails before its status (its
		// address refusing connections, a response-header timeout, a
		// reset once it read the request) or resets mid-body.
		switch g.r3.IntN(16) {
		case 0:
			b.Fail = FailRefused
		case 1:
			b.Fail = FailTimeout
		case 2:
			b.CloseBeforeStatus, b.Reset = true, true
		case 3:
			b.BreakAfter, b.Reset = g.r3.IntN(40), true
		}
	}
	if b.Status == 204 {
		b.Size, b.Trailer, b.Gzip, b.BreakAfter = 0, false, false, -1
	}
	return b
}

package model

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
)

// Trial is one generated configuration and request sequence.
type Trial struct {
	Seed    uint64
	Version int    // of the generator (see GenOptions.Version)
	Store   string // memory, redis, postgres
	Setting string // server settings of the store, for the report
	Config  *Config
	// Refused are configurations the generator drew that the contract
	// calls invalid: each must fail to load naming its option, before the
	// trial runs on Config (version 2; in version 1 Config itself may be
	// invalid, and the trial then runs no step).
	Refused []*Config
	Steps   []Step
	// Latency is the one-way latency of the store's paths during the
	// trial (version 2; Redis and PostgreSQL).
	Latency time.Duration
	// run is the token the generator put in every id, host and key, so
	// that a re-run can swap in a fresh one of the same length (no key's
	// length changes).
	run string
}

var runCounter atomic.Uint64

// newRunToken returns a token no other run of this process uses.
func newRunToken() string {
	return fmt.Sprintf("m%08x", uint32(runCounter.Add(1))^uint32(time.Now().UnixNano()>>10)<<12)
}

// Env is where trials run: the upstream, the ports Caddy listens on, and
// the stores' addresses.
type Env struct {
	Up *Upstream
	// Port returns a free port: each trial's config listens on a port of
	// its own, so that no request of a trial meets the server of the
	// previous config while it shuts down.
	Port      func() int
	RedisURL  string
	PostgresD string // DSN
	PGTable   string
	// Paths are the two routes from Caddy to a Redis or PostgreSQL store,
	// each a proxy a scenario can slow down, black-hole or cut: path a
	// as one Caddy instance reaches the store, path b as another would
	// (nil for the memory store).
	Paths [2]*caddyproc.Proxy
	// TLS is the certificate of Caddy's TLS server (HTTP/2, HTTP/3);
	// each trial serves it on a port of its own.
	TLS *TLSServer
	// Refuse is an address that refuses every connection: the upstream
	// of the proxy that attempts asking FailRefused take (version 3).
	Refuse string
}

// GenOptions say what trial to draw.
type GenOptions struct {
	Store   Store // its Kind
	Setting string
	Steps   int
	// Long adds the slow scenarios to version 1 (a client that stops
	// reading for 20 s); version 2 has them scaled down in every run.
	Long bool
	// Version 1 is the generator that found the regression seeds: a
	// configuration (maybe invalid), random steps. Version 2 draws per
	// store setting, keeps the invalid configurations apart, adds
	// protocols, keys shared between scopes, and Cover's scenarios.
	// Version 3 (the default) adds, from a stream of its own, the
	// request variants HTTP calls equal, the ways an upstream fails and
	// other writers of the store.
	Version int
	Cover   []string
	Latency time.Duration
}

// Generate draws a trial from seed.
func Generate(seed uint64, o GenOptions) *Trial {
	store := o.Store
	if o.Version == 1 {
		r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		run := fmt.Sprintf("g%08x", uint32(seed))
		store.MaxKeys = 900_000_000 + int(seed%90_000_000)
		store.Prefix = "model:" + run + ":"
		cfg := genConfig(r, store)
		g := &gen{r: r, run: run, cfg: cfg, long: o.Long}
		return &Trial{Seed: seed, Version: 1, Store: store.Kind, Config: cfg, Steps: g.steps(o.Steps), run: run}
	}
	// The setting is part of what is drawn: each store setting runs
	// trials of its own for the same seed.
	h := fnv.New64a()
	h.Write([]byte(store.Kind + "/" + o.Setting))
	mix := seed ^ h.Sum64()
	r := rand.New(rand.NewPCG(mix, mix^0x9e3779b97f4a7c15))
	r2 := rand.New(rand.NewPCG(mix^0xd1b54a32d192ed03, mix))
	run := fmt.Sprintf("g%08x", uint32(mix))
	store.MaxKeys = 900_000_000 + int(mix%90_000_000)
	store.Prefix = "model:" + run + ":"
	t := &Trial{Seed: seed, Version: max(o.Version, 2), Store: store.Kind, Setting: o.Setting, Latency: o.Latency, run: run}
	cfg := genConfig(r, store)
	for cfg.Invalid != "" {
		t.Refused = append(t.Refused, cfg)
		cfg = genConfig(r, store)
	}
	adapt(cfg, r2, o.Cover)
	cfg.Failures = o.Version >= 3
	t.Config = cfg
	g := &gen{r: r, r2: r2, v2: true, run: run, cfg: cfg}
	if o.Version >= 3 {
		g.v3, g.r3 = true, rand.New(rand.NewPCG(mix^0x94d049bb133111eb, mix^0xbf58476d1ce4e5b9))
		g.rf = rand.New(rand.NewPCG(mix^0x9fb21c651e98df25, mix^0xd6e8feb86659fd93))
		for i := range cfg.Layout.Handlers {
			cfg.Layout.Handlers[i].HostPortScope = g.rf.IntN(4) == 0
		}
	}
	t.Steps = g.steps(o.Steps)
	for _, kind := range o.Cover {
		if st, ok := g.scenarioStep(kind); ok {
			at := r2.IntN(len(t.Steps) + 1)
			t.Steps = slices.Insert(t.Steps, at, st)
		}
	}
	if g.v3 {
		// Drawn last, so that what version 3 drew before stays as it was.
		for i := range cfg.Layout.Handlers {
			cfg.Layout.Handlers[i].OnUnknownOutcome = pick(g.r3, "", "", "", "keep", "release")
		}
	}
	return t
}

// fresh returns a copy of t whose ids, hosts and keys carry a new run
// token, on a fresh memory store or Redis prefix.
func (t *Trial) fresh() *Trial {
	tok := newRunToken()
	swap := func(s string) string { return strings.ReplaceAll(s, t.run, tok) }
	c := *t
	c.run = tok
	c.Config = t.Config.fresh(tok)
	c.Refused = nil
	for _, r := range t.Refused {
		c.Refused = append(c.Refused, r.fresh(tok))
	}
	c.Steps = make([]Step, len(t.Steps))
	for i, st := range t.Steps {
		ns := st
		ns.Attempts = nil
		for _, a := range st.Attempts {
			b := *a
			b.ID, b.Intent, b.Host = swap(a.ID), swap(a.Intent), swap(a.Host)
			b.Header = nil
			for _, kv := range a.Header {
				b.Header = append(b.Header, [2]string{kv[0], swap(kv[1])})
			}
			b.Body = bytes.ReplaceAll(a.Body, []byte(t.run), []byte(tok))
			ns.Attempts = append(ns.Attempts, &b)
		}
		c.Steps[i] = ns
	}
	return &c
}

// jitter is the random share of the paths' latency, when set.
const jitter = 5 * time.Millisecond

// Run runs t (with a fresh run token) and returns what went wrong.
func (env *Env) Run(t *Trial) []Anomaly {
	t = t.fresh()
	env.Up.Reset()
	takeLogs()
	defer forgetTracked(t.run)
	env.heal(t.Latency)
	defer env.heal(0)
	j := newJudge(t.Config, env.Up, t.run)
	for _, bad := range t.Refused {
		env.route(bad)
		j.refused++
		env.load(j, bad, env.Port(), nil)
	}
	cfg := t.Config
	env.route(cfg)
	x := &trialRun{env: env, cfg: cfg, j: j}
	port := env.Port()
	x.addr = fmt.Sprintf("127.0.0.1:%d", port)
	if env.TLS != nil {
		srv := *env.TLS
		srv.Port = env.Port()
		x.tls = &srv
	}
	if !env.load(j, cfg, port, x.tls) {
		return j.anomalies
	}
	passesBefore := failOpenPasses()
	for i, st := range t.Steps {
		j.step, x.current = i, st
		if st.Scenario != "" && x.runScenario(st) {
			continue
		}
		outs := x.runStep(st)
		x.judgeStep(i, outs)
		if st.Kind == "stall" {
			j.judgeStall(outs)
		}
	}
	j.checkFidelity(j.all)
	if counted := failOpenPasses() - passesBefore; float64(j.passedOpen) > counted {
		j.fail("unprotected-run", "%d requests reached the upstream without the handler under fail_open, and the handler counted %v fail_open passes", j.passedOpen, counted)
	}
	for _, line := range strings.Split(takeLogs(), "\n") {
		if strings.Contains(line, "invalid WriteHeader code") && j.invalidStatus > 0 {
			j.invalidStatus--
			continue
		}
		if strings.Contains(line, "panic") && !strings.Contains(line, deliberatePanic) {
			j.fail("panic", "Caddy logged a panic: %.600s", line)
		}
	}
	return j.anomalies
}

// trialRun is a trial while it runs: where its requests go, and its judge.
type trialRun struct {
	env     *Env
	cfg     *Config
	j       *judge
	addr    string     // Caddy's plain server
	tls     *TLSServer // Caddy's TLS server (nil: none)
	current Step       // the step running
}

// send sends a over its protocol and reads the answer as its mode says.
func (x *trialRun) send(a *Attempt) *Result {
	if a.Proto == H1 || x.tls == nil {
		return Send(x.addr, a, clockForModules)
	}
	return sendHTTP(x.addr, x.tls, a.Proto, a, clockForModules)
}

// judgeStep records the record keys of a step's outcomes and judges them.
func (x *trialRun) judgeStep(i int, outs []*outcome) {
	j := x.j
	for _, o := range outs {
		if o.d.kind == "keyed" {
			j.keyOf[o.a.ID] = o.d.rk
		}
		if o.done.IsZero() {
			j.step = i
			j.fail("never-finished", "Caddy was not done with %s a minute after its client was: %s", o.a.ID, o.a.short())
			o.done = clockForModules()
		}
	}
	j.judgeStep(i, outs)
}

// route points cfg's store at the environment's servers, through the
// paths when there are.
func (env *Env) route(cfg *Config) {
	cfg.RefuseAddr = env.Refuse
	via := func(i int, url string) string {
		if env.Paths[i] == nil {
			return url
		}
		return withHost(url, env.Paths[i].Addr)
	}
	switch cfg.Store.Kind {
	case "redis":
		cfg.Store.URL, cfg.Store.Via = via(0, env.RedisURL), via(1, env.RedisURL)
	case "postgres":
		cfg.Store.DSN, cfg.Store.Via, cfg.Store.Table = via(0, env.PostgresD), via(1, env.PostgresD), env.PGTable
	}
}

// withHost returns the URL u with its host and port replaced by hostport.
func withHost(u, hostport string) string {
	parsed, err := url.Parse(u)
	if err != nil || parsed.Host == "" {
		panic(fmt.Sprintf("model: the store's address %q is not a URL", u))
	}
	parsed.Host = hostport
	return parsed.String()
}

// heal ends every fault of the paths and gives them latency.
func (env *Env) heal(latency time.Duration) {
	for _, p := range env.Paths {
		if p == nil {
			continue
		}
		p.Unstall()
		if err := p.Restore(); err != nil {
			panic(err)
		}
		if latency > 0 {
			p.SetLatency(latency, jitter)
		} else {
			p.SetLatency(0, 0)
		}
	}
}

// load loads cfg into Caddy. A config the contract calls invalid must be
// refused with an error naming the option; a valid one must load.
func (env *Env) load(j *judge, cfg *Config, port int, tls *TLSServer) (run bool) {
	js := cfg.JSON(port, env.Up.Addr, tls)
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				j.fail("config-panic", "loading the config panicked: %v", p)
				run = false
			}
		}()
		err = caddy.Load(js, true)
	}()
	switch {
	case err == nil && cfg.Invalid != "":
		j.fail("invalid-config-loaded", "a config with %s loaded; it must be refused naming %s", cfg.Mutation, cfg.Invalid)
		return true // and see what it does
	case err != nil && cfg.Invalid == "":
		j.fail("valid-config-refused", "a valid config was refused: %v", err)
		return false
	case err != nil && !strings.Contains(err.Error(), cfg.Invalid):
		j.fail("config-error-unnamed", "the config with %s was refused, but the error does not name %s: %v", cfg.Mutation, cfg.Invalid, err)
		return false
	case err != nil:
		return false
	}
	return true
}

// runStep sends a step's attempts and waits until Caddy is done with
// each.
func (x *trialRun) runStep(st Step) []*outcome {
	env := x.env
	outs := make([]*outcome, len(st.Attempts))
	var wg sync.WaitGroup
	send := func(i int) {
		defer wg.Done()
		a := st.Attempts[i]
		outs[i] = &outcome{a: a, res: x.send(a)}
	}
	switch st.Kind {
	case "wait", "stall":
		// The first attempt goes first; the others once it has reached
		// the upstream (or visibly never will).
		first := make(chan struct{})
		wg.Add(1)
		go func() {
			defer close(first)
			send(0)
		}()
		deadline := time.After(5 * time.Second)
	waitFirst:
		for env.Up.Execution(st.Attempts[0].ID) == nil {
			select {
			case <-first: // answered without reaching the upstream
				break waitFirst
			case <-deadline:
				break waitFirst
			case <-time.After(5 * time.Millisecond):
			}
		}
		if st.Kind == "stall" {
			outs = append(outs, x.probeStalled(st.Attempts[0], stallProbeWindow)...)
			break
		}
		for i := 1; i < len(st.Attempts); i++ {
			wg.Add(1)
			go send(i)
		}
	case "sequence", "variants":
		for i := range st.Attempts {
			wg.Add(1)
			send(i)
			waitDone(st.Attempts[i].ID, time.Minute)
		}
	default:
		for i := range st.Attempts {
			wg.Add(1)
			go send(i)
		}
	}
	wg.Wait()
	x.settle(outs)
	return outs
}

// settle waits until Caddy is done with each outcome's attempt, and takes
// its decision and its execution.
func (x *trialRun) settle(outs []*outcome) {
	deadline := time.Now().Add(time.Minute)
	for _, o := range outs {
		o.d = decide(x.cfg, o.a)
		var ok bool
		if o.d.kind == "nethttp" {
			o.done = o.res.Done // never reaches Caddy's handlers
		} else if o.done, ok = waitDone(o.a.ID, max(time.Until(deadline), time.Millisecond)); !ok && o.a.Mode == HangUp && !started(o.a.ID) {
			// A client that hung up at once may be gone before Caddy
			// read its request (on a loaded machine, before it was even
			// accepted): Caddy never had it.
			o.done = o.res.Done
		}
		o.exec = x.env.Up.Settled(o.a.ID, 10*time.Second)
		o.reached = reachedAt(o.a.ID)
	}
}

// stallProbeWindow is how long after a client stopped reading a retry
// may still meet its key in flight: past it, the record must be written
// (the client counted as gone) and the retry replayed.
const stallProbeWindow = 12 * time.Second

// probeStalled retries a stalled attempt's request from another
// connection until it gets something other than 409, or the window
// ends.
func (x *trialRun) probeStalled(stalled *Attempt, window time.Duration) []*outcome {
	var outs []*outcome
	end := time.Now().Add(window + window/6)
	for i := 0; time.Now().Before(end); i++ {
		b := *stalled
		b.ID = fmt.Sprintf("%s-p%d", stalled.ID, i)
		b.Mode, b.Stall = ReadAll, 0
		o := &outcome{a: &b, res: x.send(&b)}
		outs = append(outs, o)
		if o.res.Status != 409 {
			break
		}
		time.Sleep(window / 50)
	}
	return outs
}

// judgeStall checks that a client that stopped reading did not hold its
// key past the window.
func (j *judge) judgeStall(outs []*outcome) {
	if len(outs) < 2 || outs[0].exec == nil {
		return
	}
	last := outs[len(outs)-1]
	if last.res.Status == 409 && last.res.Sent.Sub(outs[0].exec.Arrived) > stallProbeWindow {
		j.fail("stalled-reader-holds-key", "a client stopped reading the answer of %s; %s later, retries still get 409", outs[0].a.ID, last.res.Sent.Sub(outs[0].exec.Arrived).Round(time.Second))
	}
}

// Describe renders t for a failure message.
func (t *Trial) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d, store %s %s, %d steps\n", t.Seed, t.Store, t.Setting, len(t.Steps))
	b.WriteString(t.Config.describe())
	for i, st := range t.Steps {
		fmt.Fprintf(&b, "step %d %s:\n", i, st.Kind)
		for _, a := range st.Attempts {
			fmt.Fprintf(&b, "  %s %s %s mode=%s do=%s headers=%q body=%.120q chunked=%v", a.ID, a.Method, a.Target, a.Mode, a.Do, a.Header, a.Body, a.Chunked)
			if f := a.Form.String(); f != "" {
				fmt.Fprintf(&b, " form=(%s)", f)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// failOpenPasses is caddy_http_idempotency_fail_open_total in all, as the
// running config's metrics registry serves it: the requests the handler
// passed on without idempotency because the store failed.
func failOpenPasses() float64 {
	ctx := caddy.ActiveContext()
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return 0
	}
	families, _ := reg.Gather()
	total := 0.0
	for _, f := range families {
		if f.GetName() != "caddy_http_idempotency_fail_open_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

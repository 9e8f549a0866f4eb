package model

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// Trial is one generated configuration and request sequence.
type Trial struct {
	Seed    uint64
	Store   string // memory, redis, postgres
	Setting string // server settings of the store, for the report
	Config  *Config
	Steps   []Step
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
}

// Generate draws a trial of steps steps for store from seed. long adds
// the slow scenarios (a client that stops reading).
func Generate(seed uint64, store Store, steps int, long bool) *Trial {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	run := fmt.Sprintf("g%08x", uint32(seed))
	store.MaxKeys = 900_000_000 + int(seed%90_000_000)
	store.Prefix = "model:" + run + ":"
	cfg := genConfig(r, store)
	g := &gen{r: r, run: run, cfg: cfg, long: long}
	return &Trial{Seed: seed, Store: store.Kind, Config: cfg, Steps: g.steps(steps), run: run}
}

// fresh returns a copy of t whose ids, hosts and keys carry a new run
// token, on a fresh memory store or Redis prefix.
func (t *Trial) fresh() *Trial {
	tok := newRunToken()
	swap := func(s string) string { return strings.ReplaceAll(s, t.run, tok) }
	c := *t
	c.run = tok
	cfg := *t.Config
	cfg.Store.MaxKeys = 900_000_000 + int(runCounter.Add(1)%90_000_000)
	cfg.Store.Prefix = "model:" + tok + ":"
	c.Config = &cfg
	c.Steps = make([]Step, len(t.Steps))
	for i, st := range t.Steps {
		ns := Step{Kind: st.Kind}
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

// Run runs t (with a fresh run token) and returns what went wrong.
func (env *Env) Run(t *Trial) []Anomaly {
	t = t.fresh()
	env.Up.Reset()
	takeLogs()
	defer forgetTracked(t.run)
	cfg := t.Config
	if cfg.Store.Kind == "redis" {
		cfg.Store.URL = env.RedisURL
	}
	if cfg.Store.Kind == "postgres" {
		cfg.Store.DSN, cfg.Store.Table = env.PostgresD, env.PGTable
	}
	j := newJudge(cfg, env.Up)
	port := env.Port()
	if !env.load(j, cfg, port) {
		return j.anomalies
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for i, st := range t.Steps {
		outs := env.runStep(addr, cfg, st)
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
		if st.Kind == "stall" {
			j.judgeStall(outs)
		}
	}
	j.checkFidelity(j.all)
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

// load loads cfg into Caddy. A config the contract calls invalid must be
// refused with an error naming the option; a valid one must load.
func (env *Env) load(j *judge, cfg *Config, port int) (run bool) {
	js := cfg.JSON(port, env.Up.Addr)
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
func (env *Env) runStep(addr string, cfg *Config, st Step) []*outcome {
	outs := make([]*outcome, len(st.Attempts))
	var wg sync.WaitGroup
	send := func(i int) {
		defer wg.Done()
		a := st.Attempts[i]
		outs[i] = &outcome{a: a, res: Send(addr, a, clockForModules)}
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
			outs = append(outs, env.probeStalled(addr, st.Attempts[0])...)
			break
		}
		for i := 1; i < len(st.Attempts); i++ {
			wg.Add(1)
			go send(i)
		}
	case "sequence":
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
	deadline := time.Now().Add(time.Minute)
	for _, o := range outs {
		o.d = decide(cfg, o.a)
		if o.d.kind == "nethttp" {
			o.done = o.res.Done // never reaches Caddy's handlers
		} else {
			o.done, _ = waitDone(o.a.ID, max(time.Until(deadline), time.Millisecond))
		}
		o.exec = env.Up.Settled(o.a.ID, 10*time.Second)
	}
	return outs
}

// stallProbeWindow is how long after a client stopped reading a retry
// may still meet its key in flight: past it, the record must be written
// (the client counted as gone) and the retry replayed.
const stallProbeWindow = 12 * time.Second

// probeStalled retries a stalled attempt's request from another
// connection until it gets something other than 409, or the window
// ends.
func (env *Env) probeStalled(addr string, stalled *Attempt) []*outcome {
	var outs []*outcome
	end := time.Now().Add(stallProbeWindow + 2*time.Second)
	for i := 0; time.Now().Before(end); i++ {
		b := *stalled
		b.ID = fmt.Sprintf("%s-p%d", stalled.ID, i)
		b.Mode, b.Stall = ReadAll, 0
		o := &outcome{a: &b, res: Send(addr, &b, clockForModules)}
		outs = append(outs, o)
		if o.res.Status != 409 {
			break
		}
		time.Sleep(250 * time.Millisecond)
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
			fmt.Fprintf(&b, "  %s %s %s mode=%s do=%s headers=%q body=%.120q chunked=%v\n", a.ID, a.Method, a.Target, a.Mode, a.Do, a.Header, a.Body, a.Chunked)
		}
	}
	return b.String()
}

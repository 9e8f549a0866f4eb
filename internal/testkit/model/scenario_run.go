package model

import (
	"context"
	"fmt"
	"math"
	"os/exec"
	"runtime"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// stallTimeout is the client stall timeout the model runs Caddy with
// (knobs.ClientStallTimeout, 10 s in production): its slow and sleeping
// clients take seconds instead of minutes, with the same ratios.
const stallTimeout = 2 * time.Second

// afterOwner, as a timing, sends an attempt once Caddy is done with the
// attempts before it that are not sent after the owner themselves.
const afterOwner = math.MaxFloat64

// runScenario runs a scenario step and judges it; false when the step is
// one the random steps' runner and judge take as it is.
func (x *trialRun) runScenario(st Step) bool {
	switch st.Scenario {
	case scRetry, scUpstream:
		return false
	case scTTL:
		x.runTTL(st)
	case scLocked:
		x.runLocked(st)
	case scFill:
		outs := x.runStep(st)
		x.judgeFill(outs)
	case scSlow, scResume, scStall, scSilent:
		x.runClients(st)
	case scStorm:
		x.judgeStorm(st, x.runTimed(st))
	case scTakeover:
		x.judgeTakeover(x.runTimed(st))
	case scAftercare:
		x.judgeAftercare(x.runTimed(st))
	case scPause:
		x.judgePause(st, x.runTimed(st))
	default: // lease, partition, scale, lockedlease: the rules of every step
		x.judgeStep(x.j.step, x.runTimed(st))
	}
	return true
}

// lease is the lock_timeout of the handler that keys a's request.
func (x *trialRun) lease(a *Attempt) time.Duration {
	if d := decide(x.cfg, a); d.kind == "keyed" {
		return d.pol.LockTimeout
	}
	return time.Second
}

// runTimed runs a step on its timing: the attempts timed before zero and
// the first at once; the others, and the fault, that many leases after
// the first reached the upstream (the anchor).
func (x *trialRun) runTimed(st Step) []*outcome {
	tm := st.Timing
	lease := x.lease(st.Attempts[0])
	at := func(leases float64) time.Duration { return time.Duration(leases * float64(lease)) }
	var (
		mu   sync.Mutex
		outs []*outcome
		wg   sync.WaitGroup
	)
	send := func(a *Attempt) *Result {
		if a.Leases > 0 {
			c := *a
			c.Do.Delay = at(a.Leases)
			a = &c
		}
		o := &outcome{a: a, res: x.send(a)}
		mu.Lock()
		outs = append(outs, o)
		mu.Unlock()
		return o.res
	}
	goSend := func(a *Attempt) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send(a)
		}()
	}
	first := st.Attempts[0]
	goSend(first)
	for i, a := range st.Attempts[1:] {
		if tm.At[i+1] < 0 {
			goSend(a)
		}
	}
	anchor := x.anchor(first)
	later := func(d time.Duration, f func()) {
		wg.Add(1)
		time.AfterFunc(max(time.Until(anchor.Add(d)), 0), func() {
			defer wg.Done()
			f()
		})
	}
	if f := tm.Fault; f != nil {
		later(at(f.From), func() { x.fault(f) })
		later(at(f.To), func() { x.heal(f) })
	}
	last := len(st.Attempts) - 1
	for i, a := range st.Attempts[1:] {
		switch d := tm.At[i+1]; {
		case d < 0:
		case d == afterOwner:
			before := st.Attempts[:i+1]
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k, b := range before {
					if k == 0 || tm.At[k] != afterOwner {
						waitDone(b.ID, time.Minute)
					}
				}
				send(a)
			}()
		case i+1 == last && tm.Every > 0:
			// A client retrying while the fault heals, until it gets the
			// record.
			later(at(d), func() {
				for n := 0; ; n++ {
					b := *a
					b.ID = fmt.Sprintf("%s-t%d", a.ID, n)
					res := send(&b)
					if isReplay(res, &b) || time.Now().After(anchor.Add(at(tm.Until))) {
						return
					}
					time.Sleep(at(tm.Every))
				}
			})
		default:
			later(at(d), func() { send(a) })
		}
	}
	wg.Wait()
	if tm.Fault != nil {
		x.heal(tm.Fault)
	}
	x.settle(outs)
	return outs
}

// anchor waits for a to reach the upstream and returns when it did; if
// it never does (refused, failed), when Caddy was done with it.
func (x *trialRun) anchor(a *Attempt) time.Time {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if e := x.env.Up.Execution(a.ID); e != nil {
			return e.Arrived
		}
		if at, ok := waitDone(a.ID, 2*time.Millisecond); ok {
			return at
		}
	}
	return time.Now()
}

// isReplay reports whether res is a replay (the answer of another
// attempt).
func isReplay(res *Result, a *Attempt) bool {
	return !res.NoAnswer && res.Header.Get(HeaderReq) != "" && res.Header.Get(HeaderReq) != a.ID
}

// faultsHeld are the lock and cpu faults in force: what ends each.
var faultsHeld sync.Map // *fault -> func()

// fault starts f on its paths.
func (x *trialRun) fault(f *fault) {
	switch f.Kind {
	case "lock":
		faultsHeld.Store(f, x.lockRow(x.current.Attempts[0]))
		return
	case "cpu":
		faultsHeld.Store(f, busyCores())
		return
	}
	for i, p := range x.env.Paths {
		if p == nil || !(f.Paths == "ab" || f.Paths == "a" && i == 0 || f.Paths == "b" && i == 1) {
			continue
		}
		switch f.Kind {
		case "stall":
			p.Stall()
		case "cut":
			p.Cut()
		}
	}
}

// heal ends f.
func (x *trialRun) heal(f *fault) {
	if end, ok := faultsHeld.LoadAndDelete(f); ok {
		end.(func())()
		return
	}
	if f.Kind == "lock" || f.Kind == "cpu" {
		return
	}
	for i, p := range x.env.Paths {
		if p == nil || !(f.Paths == "ab" || f.Paths == "a" && i == 0 || f.Paths == "b" && i == 1) {
			continue
		}
		p.Unstall()
		if err := p.Restore(); err != nil {
			panic(err)
		}
	}
}

// lockRow locks the in-flight row of a's key in an outside transaction
// (an operator's BEGIN; SELECT ... FOR UPDATE) and returns what lets it
// go. A row that is not there (a's request was refused) locks nothing.
func (x *trialRun) lockRow(a *Attempt) func() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	conn, err := pgx.Connect(ctx, x.env.PostgresD)
	if err != nil {
		cancel()
		x.j.fail("harness", "connecting to PostgreSQL: %v", err)
		return func() {}
	}
	end := func() {
		_ = conn.Close(context.Background())
		cancel()
	}
	tx, err := conn.Begin(ctx)
	if err == nil {
		table := pgx.Identifier{x.cfg.Store.Table}.Sanitize()
		_, err = tx.Exec(ctx, `SELECT 1 FROM `+table+` WHERE key = $1 AND state = 1 FOR UPDATE`, decide(x.cfg, a).rk.key)
	}
	if err != nil {
		x.j.fail("harness", "locking the row of %s: %v", a.ID, err)
		end()
		return func() {}
	}
	return func() {
		_ = tx.Rollback(ctx)
		end()
	}
}

// busyCores keeps every core busy with processes of its own until the
// function it returns is called.
func busyCores() func() {
	var cmds []*exec.Cmd
	for range runtime.NumCPU() {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if cmd.Start() == nil {
			cmds = append(cmds, cmd)
		}
	}
	return func() {
		for _, cmd := range cmds {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}
}

// runTTL sends the first attempt, waits until its record has outlived its
// ttl, and sends the second: it runs again (a new record), never replays.
func (x *trialRun) runTTL(st Step) {
	first := st.Attempts[0]
	o1 := &outcome{a: first, res: x.send(first)}
	x.settle([]*outcome{o1})
	x.judgeStep(x.j.step, []*outcome{o1})
	if o1.d.kind == "keyed" {
		// The record's expiry is at most its completion (before Caddy
		// was done) plus its ttl.
		time.Sleep(time.Until(o1.done.Add(o1.d.pol.TTL + 2*slack)))
	}
	o2 := &outcome{a: st.Attempts[1], res: x.send(st.Attempts[1])}
	x.settle([]*outcome{o2})
	x.judgeStep(x.j.step, []*outcome{o2})
}

// lockHold is how long the locked scenario's outside transaction holds
// its row: past the store's statement timeout, so that a request held up
// behind it (not only the locked key's) meets its deadline while it lasts.
const lockHold = 3 * time.Second

// runLocked: an outside transaction holds an uncommitted row of the
// locked key (as a client's retry or an operator's open transaction
// would) while the locked key is sent twice and unrelated new keys
// arrive, each twice. The unrelated keys are answered as on a free store;
// the locked key gets 409 or 503, and runs at most once.
//
// Version 3 draws (st.Timing) how the row is held (an uncommitted insert
// of the key, or a lapsed lease's row held FOR UPDATE), for how long
// (past the timeout, or less than the lock wait), and up to 20 requests
// for the locked key at once.
func (x *trialRun) runLocked(st Step) {
	kind, hold, copies := "insert", lockHold, 2
	if tm := st.Timing; tm != nil {
		kind, hold, copies = tm.Lock, tm.Hold, tm.Copies
	}
	warm, locked, rest := st.Attempts[0], st.Attempts[1:1+copies], st.Attempts[1+copies:]
	ow := &outcome{a: warm, res: x.send(warm)}
	x.settle([]*outcome{ow})
	x.judgeStep(x.j.step, []*outcome{ow})
	if ow.d.kind != "keyed" || ow.exec == nil {
		return // no record to learn the scope from
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, x.env.PostgresD)
	if err != nil {
		x.j.fail("harness", "connecting to PostgreSQL: %v", err)
		return
	}
	defer conn.Close(context.Background())
	table := pgx.Identifier{x.cfg.Store.Table}.Sanitize()
	var scope string
	if err := conn.QueryRow(ctx, `SELECT scope FROM `+table+` WHERE key = $1`, ow.d.rk.key).Scan(&scope); err != nil {
		x.j.fail("harness", "reading the scope of %s: %v", warm.ID, err)
		return
	}
	lockedKey := decide(x.cfg, locked[0]).rk.key
	if kind == "lapsed" {
		// A lapsed lease (a crashed owner's), committed; its row is held
		// below.
		if _, err := conn.Exec(ctx, `INSERT INTO `+table+` (scope, key, fingerprint, state, token, created_at, expires_at)
VALUES ($1, $2, '\x00', 1, 1, now() - interval '1 minute', now() - interval '1 second')`, scope, lockedKey); err != nil {
			x.j.fail("harness", "writing a lapsed lease of %s: %v", lockedKey, err)
			return
		}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		x.j.fail("harness", "BEGIN: %v", err)
		return
	}
	if kind == "lapsed" {
		_, err = tx.Exec(ctx, `SELECT 1 FROM `+table+` WHERE scope = $1 AND key = $2 FOR UPDATE`, scope, lockedKey)
	} else {
		_, err = tx.Exec(ctx, `INSERT INTO `+table+` (scope, key, fingerprint, state, token, created_at, expires_at)
VALUES ($1, $2, '\x00', 1, 1, now(), now() + interval '1 hour')`, scope, lockedKey)
	}
	if err != nil {
		x.j.fail("harness", "locking %s: %v", lockedKey, err)
		_ = tx.Rollback(ctx)
		return
	}
	held := time.Now()
	outs := make([]*outcome, 0, len(st.Attempts)-1)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, a := range st.Attempts[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := &outcome{a: a, res: x.send(a)}
			mu.Lock()
			outs = append(outs, o)
			mu.Unlock()
		}()
	}
	// The unrelated keys are answered while the row is held (a long
	// hold).
	for _, a := range rest {
		waitDone(a.ID, hold+30*time.Second)
	}
	unrelatedDone := time.Now()
	time.Sleep(time.Until(held.Add(hold)))
	_ = tx.Rollback(ctx)
	wg.Wait()
	x.settle(outs)
	x.judgeLocked(outs, locked, unrelatedDone.Sub(held), hold)
}

// runClients runs a step of clients that read slowly, sleep and resume,
// or stop reading, one per protocol, and judges each.
func (x *trialRun) runClients(st Step) {
	outs := make([]*outcome, len(st.Attempts))
	var wg sync.WaitGroup
	for i, a := range st.Attempts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = &outcome{a: a, res: x.send(a)}
		}()
	}
	var probes []*outcome
	if st.Scenario == scStall {
		// While the clients stall, retries of their keys from other
		// connections meet them in flight until they count as gone; then
		// the record is written and replayed.
		var pwg sync.WaitGroup
		var mu sync.Mutex
		for _, a := range st.Attempts {
			pwg.Add(1)
			go func() {
				defer pwg.Done()
				x.anchor(a)
				p := x.probeStalled(a, stallTimeout+stallTimeout/10+time.Second)
				mu.Lock()
				probes = append(probes, p...)
				mu.Unlock()
			}()
		}
		pwg.Wait()
	}
	wg.Wait()
	outs = append(outs, probes...)
	x.settle(outs)
	x.judgeClients(st, outs)
}

package model

import (
	"fmt"
	"slices"
	"time"
)

// Scenarios are steps of production's scale and timing that random
// requests rarely make: a request that outlives its lease, a store that
// stalls or goes away for part of it, many leases at once, a record that
// outlives its ttl, a row locked by someone else, clients that read
// slowly or sleep, made-up credentials. Each is a script of attempts and
// store faults timed from the moment the first request reaches the
// upstream, judged by the rules of its kind (scenario_judge.go). The
// generator (version 2) puts some in every trial; which ones, the store
// decides (scenarioKinds) and the trial's number spreads them (cover).
const (
	scLease     = "lease"     // a request outlives lock_timeout; retries on both paths meet it in flight
	scPartition = "partition" // path a black-holed for half a lease while its request runs
	scTakeover  = "takeover"  // path a cut for longer than a lease: path b takes the key over, the owner is fenced
	scAftercare = "aftercare" // path a cut as its request's answer is recorded
	scTTL       = "ttl"       // a record outlives its ttl
	scScale     = "scale"     // many long requests at once, retried on the other path
	scPause     = "pause"     // the store paused for a moment under a burst
	scLocked    = "locked"    // a PostgreSQL row locked by an outside transaction
	scFill      = "fill"      // made-up credentials answered 404 fill a small memory store
	scSlow      = "slow"      // clients reading slowly, over every protocol
	scResume    = "resume"    // clients that sleep past the stall timeout and resume, over every protocol
	scStall     = "stall"     // a client that stops reading, over every protocol
	scRetry     = "retry"     // a key retried with another body, and one freed by a 5xx
	scUpstream  = "upstream"  // (version 3) every way an upstream fails, over every protocol, each retried

	// Version 3.
	scLockedLease = "lockedlease" // the row of a live, renewing lease locked from outside for longer than the lease
	scSilent      = "silent"      // upstreams silent past the stall timeout after their headers or first bytes, over every protocol (version 3)
	scStorm       = "storm"       // one client's retry storm on its key while another client's retry waits (version 3)
)

// scenarioKinds are the scenarios a store's trials cover, spread over
// the trials of a run (cover). Kinds that version 3 adds come after
// version 2's, and only in version 3, so that a version 2 seed covers
// what it covered.
func scenarioKinds(store, setting string, version int) []string {
	kinds := scenarioKindsV2(store, setting)
	if version < 3 {
		return kinds
	}
	kinds = append(kinds, scUpstream)
	if store == "postgres" && setting == "" {
		kinds = append(kinds, scLockedLease)
	}
	switch {
	case store == "memory":
		// What a client's side or the handler's places show; the store
		// changes nothing of either.
		kinds = append(kinds, scSilent, scStorm)
	case setting == "":
		// Waiters wait on the store: Redis's notifications, PostgreSQL's
		// shared poll.
		kinds = append(kinds, scStorm)
	}
	return kinds
}

// scenarioKindsV2 are version 2's kinds.
func scenarioKindsV2(store, setting string) []string {
	switch {
	case store == "memory":
		return []string{scLease, scTTL, scScale, scFill, scSlow, scResume, scStall, scRetry}
	case setting != "":
		// The isolation settings of PostgreSQL and Redis's persistence
		// change how the store decides, not how it is reached.
		kinds := []string{scLease, scTakeover, scAftercare, scRetry}
		if store == "postgres" {
			kinds = append(kinds, scLocked)
		}
		return kinds
	case store == "redis":
		return []string{scLease, scPartition, scTakeover, scAftercare, scTTL, scScale, scPause, scRetry}
	}
	return []string{scLease, scPartition, scTakeover, scAftercare, scTTL, scScale, scPause, scLocked, scRetry}
}

// cover returns the scenario kinds of trial i of n: every kind lands in
// some trial of the run, the first of them in trial 0.
func cover(kinds []string, i, n int) []string {
	var out []string
	for k, kind := range kinds {
		if k%max(n, 1) == i%max(n, 1) {
			out = append(out, kind)
		}
	}
	return out
}

// needsLease reports whether a scenario kind times itself on the lease.
func needsLease(kind string) bool {
	return slices.Contains([]string{scLease, scPartition, scTakeover, scAftercare, scScale, scPause, scLockedLease, scStorm}, kind)
}

// fault is something done to the store's paths during a step. (A path's
// latency is the trial's: Trial.Latency.)
type fault struct {
	// stall (a black hole, or the store paused: bytes held), cut
	// (connections refused and closed); version 3: lock (the row of the
	// step's first attempt locked by an outside transaction), cpu (every
	// core kept busy by other processes, as on CI and shared hosts).
	Kind  string
	Paths string // a, b or ab
	// From and To are when it starts and ends, in leases after the step's
	// anchor (the first request reaching the upstream).
	From, To float64
}

// timing is a scenario's schedule: when each attempt is sent, in leases
// after the anchor (the first attempt, sent at once, reaching the
// upstream); negative: at once, with the first.
type timing struct {
	At    []float64
	Fault *fault
	// Every, when set, resends the last attempt that often (in leases)
	// until Until (in leases) or until it gets a replay: a client
	// retrying while a fault heals.
	Every, Until float64

	// The locked scenario's, version 3: how the row is locked ("insert":
	// an uncommitted insert of the key; "lapsed": a lapsed lease's row
	// held FOR UPDATE), for how long, and how many of the step's first
	// attempts after the warm-up are the locked key's.
	Lock   string
	Hold   time.Duration
	Copies int
}

// scenarioStep draws a step of kind for the trial. It returns false when
// the trial's configuration cannot run it.
func (g *gen) scenarioStep(kind string) (Step, bool) {
	r := g.r2
	st := Step{Kind: kind, Scenario: kind}
	switch kind {
	case scLease:
		in := g.scenarioIntent()
		owner := g.scenarioAttempt(in, "a", Behaviour{Status: 201, Size: 200, BreakAfter: -1})
		owner.Leases = 2.3
		st.Attempts = []*Attempt{owner, g.scenarioAttempt(in, "b", g.fast()), g.scenarioAttempt(in, "a", g.fast())}
		st.Timing = &timing{At: []float64{0, 1.2, 1.7}}
	case scPartition:
		// Path a black-holed from 0.7 to 1.2 leases: its renewals are held
		// there, none lands in time but those sent before. With renewals a
		// tenth of a lease apart the lease holds until 1.7 at least; with
		// one a lease it lapsed at 1.0, and the retry on path b at 1.1
		// would take it over.
		in := g.scenarioIntent()
		owner := g.scenarioAttempt(in, "a", Behaviour{Status: 201, Size: 200, BreakAfter: -1})
		owner.Leases = 2
		st.Attempts = []*Attempt{owner, g.scenarioAttempt(in, "b", g.fast())}
		st.Timing = &timing{At: []float64{0, 1.1}, Fault: &fault{Kind: "stall", Paths: "a", From: 0.7, To: 1.2}}
	case scTakeover:
		// Path a cut from 0.3 to 2.3 leases: its lease lapses by 1.4; path
		// b takes the key over at 1.8 and runs until 3.5; the owner's
		// answer comes at 3, while the taker still runs, and must be
		// fenced: later replays are path b's.
		in := g.scenarioIntent()
		owner := g.scenarioAttempt(in, "a", Behaviour{Status: 201, Size: 200, BreakAfter: -1})
		owner.Leases = 3
		taker := g.scenarioAttempt(in, "b", Behaviour{Status: 201, Size: 120, BreakAfter: -1})
		taker.Leases = 1.7
		st.Attempts = []*Attempt{owner, taker, g.scenarioAttempt(in, "a", g.fast()), g.scenarioAttempt(in, "b", g.fast())}
		st.Timing = &timing{At: []float64{0, 1.8, afterOwner, afterOwner}, Fault: &fault{Kind: pick(r, "cut", "stall"), Paths: "a", From: 0.3, To: 2.3}}
	case scAftercare:
		// Path a cut from 1.0 to 1.5 leases; its request's answer comes at
		// 1.2, when the record cannot be written: the write waits in
		// aftercare, its lease renewed, and lands once path a is back.
		// Path b retries all along: 409, then the replay; never a run.
		in := g.scenarioIntent()
		owner := g.scenarioAttempt(in, "a", Behaviour{Status: 201, Size: 200, BreakAfter: -1})
		owner.Leases = 1.2
		st.Attempts = []*Attempt{owner, g.scenarioAttempt(in, "b", g.fast())}
		st.Timing = &timing{At: []float64{0, 1.1}, Fault: &fault{Kind: pick(r, "cut", "stall"), Paths: "a", From: 1.0, To: 1.5}, Every: 0.1, Until: 6}
	case scTTL:
		in := g.scenarioIntent()
		st.Attempts = []*Attempt{g.scenarioAttempt(in, "a", g.fast()), g.scenarioAttempt(in, pick(r, "a", "b"), g.fast())}
		st.Kind = "sequence" // the second after the record's ttl (see Env.runTTL)
	case scScale:
		n := 60 + r.IntN(90)
		if g.cfg.Store.Kind == "memory" {
			n = 150 + r.IntN(150)
		}
		for range n {
			in := g.scenarioIntent()
			a := g.scenarioAttempt(in, "a", Behaviour{Status: 201, Size: 100, BreakAfter: -1})
			a.Leases = 2.5
			st.Attempts = append(st.Attempts, a)
		}
		busy := g.v3 && g.r3.IntN(2) == 0
		for i := range n {
			retry := *st.Attempts[i]
			retry.ID = g.nextID()
			retry.Path = "b"
			retry.Do, retry.Leases = g.fast(), 0
			if g.cfg.Store.Kind == "memory" {
				retry.Path = "a"
			}
			st.Attempts = append(st.Attempts, &retry)
		}
		st.Timing = &timing{At: make([]float64, 2*n)}
		for i := range n {
			st.Timing.At[i] = -1 // all at once
			st.Timing.At[n+i] = 1.3
		}
		if busy {
			// With the cores taken by other processes all along.
			st.Timing.Fault = &fault{Kind: "cpu", Paths: "ab", From: 0, To: 2.5}
		}
	case scPause:
		// Both paths stalled for a fifth of a lease under a burst of new
		// keys, each sent twice; then each once more.
		n := 10 + r.IntN(20)
		var ins []*intent
		for range n {
			ins = append(ins, g.scenarioIntent())
		}
		for range 3 {
			for _, in := range ins {
				a := g.scenarioAttempt(in, pick(r, "a", "b"), g.fast())
				a.Do.Delay = time.Duration(r.IntN(100)) * time.Millisecond
				st.Attempts = append(st.Attempts, a)
			}
		}
		st.Timing = &timing{At: make([]float64, 3*n), Fault: &fault{Kind: "stall", Paths: "ab", From: 0.1, To: 0.3}}
		for i := range n {
			st.Timing.At[i], st.Timing.At[n+i], st.Timing.At[2*n+i] = -1, 0.15, 1.5
		}
	case scLocked:
		// The key is locked by an outside transaction holding an
		// uncommitted row of it, while unrelated new keys arrive, each
		// sent twice (a double submit); see Env.runLocked.
		// The first attempt, of another key of the same scope, tells the
		// scope's hash (the scenarios' intents share one).
		warm, locked := g.scenarioIntent(), g.scenarioIntent()
		st.Attempts = []*Attempt{g.scenarioAttempt(warm, "a", g.fast()), g.scenarioAttempt(locked, "a", g.fast()), g.scenarioAttempt(locked, "a", g.fast())}
		if g.v3 {
			// Version 3: up to 20 concurrent requests for the locked key,
			// its row held by an uncommitted insert or as a lapsed
			// lease's, for longer than the store's timeout or for less
			// than its lock wait.
			r3 := g.r3
			st.Timing = &timing{Lock: pick(r3, "insert", "lapsed"), Hold: pick(r3, lockHold, 200*time.Millisecond), Copies: 2 + r3.IntN(19)}
			for range st.Timing.Copies - 2 {
				c := *st.Attempts[1]
				c.ID = g.nextID()
				st.Attempts = append(st.Attempts, &c)
			}
		}
		for range 30 + r.IntN(30) {
			in := g.scenarioIntent()
			a := g.scenarioAttempt(in, "a", g.fast())
			b := *a
			b.ID = g.nextID()
			st.Attempts = append(st.Attempts, a, &b)
		}
	case scLockedLease:
		// The owner runs for 3.2 leases on path a, renewing; from 0.3 to
		// 1.9 leases an outside transaction holds its row (its renewals
		// cannot land, and the lease lapses), while path b retries every
		// 0.05 lease (100 ms at lock_timeout 2s) until 4 leases. When the
		// lock goes, the owner's renewal must land before any takeover:
		// one execution, the retries 409 and then the replay.
		in := g.scenarioIntent()
		owner := g.scenarioAttempt(in, "a", Behaviour{Status: 201, Size: 200, BreakAfter: -1})
		owner.Leases = 3.2
		st.Attempts = []*Attempt{owner, g.scenarioAttempt(in, "b", g.fast())}
		st.Timing = &timing{At: []float64{0, 0.35}, Fault: &fault{Kind: "lock", Paths: "a", From: 0.3, To: 1.9}, Every: 0.05, Until: 4}
	case scFill:
		// Made-up credentials, each a scope of its own, fill the fill
		// site's store with refusals; then a real client's new key.
		for i := range g.cfg.Store.FillKeys {
			in := g.scenarioIntent()
			in.auth = fmt.Sprintf("Bearer %s-fake-%d", g.run, i)
			a := g.scenarioAttempt(in, "", Behaviour{Status: 404, Size: 60, BreakAfter: -1})
			a.Site = "fill"
			st.Attempts = append(st.Attempts, a)
		}
		real := g.scenarioAttempt(g.scenarioIntent(), "", g.fast())
		real.Site = "fill"
		st.Attempts = append(st.Attempts, real)
		st.Kind = "sequence"
	case scSlow, scResume, scStall:
		// One client per protocol, each on a streamed answer larger than
		// the connection's buffers: reading slowly, sleeping past the
		// stall timeout then resuming, or stopping for good.
		for _, p := range []Proto{H1, H2, H2C, H3} {
			in := g.scenarioIntent()
			a := g.scenarioAttempt(in, "a", Behaviour{Status: 201, Size: slowAnswer, BreakAfter: -1, ChunkDelay: time.Millisecond})
			a.Proto = p
			switch kind {
			case scSlow:
				a.Mode, a.Rate = SlowRead, slowRate
			case scResume:
				a.Mode, a.Stall = StallResume, 2*stallTimeout
			case scStall:
				a.Mode, a.Stall = StopReading, 3*stallTimeout
			}
			st.Attempts = append(st.Attempts, a)
		}
	case scRetry:
		// A key answered, then retried with another body (422), and a key
		// freed by a 5xx, retried (it runs again).
		in := g.scenarioIntent()
		first := g.scenarioAttempt(in, "a", g.fast())
		other := *in
		other.body.amount += 7
		second := g.scenarioAttempt(&other, pick(r, "a", "b"), g.fast())
		freed := g.scenarioIntent()
		fail := g.scenarioAttempt(freed, "a", Behaviour{Status: pick(r, 500, 502, 503), Size: 80, BreakAfter: -1})
		again := g.scenarioAttempt(freed, pick(r, "a", "b"), g.fast())
		st.Attempts = []*Attempt{first, second, g.scenarioAttempt(in, "a", g.fast()), fail, again}
		st.Kind = "sequence"
	case scUpstream:
		// Each way an upstream fails, over each protocol a client
		// speaks, then a retry of the same request: the retry runs when
		// nothing reached the upstream (a refused connection) or the
		// upstream's own 5xx freed the key; it gets the outcome-unknown
		// answer when the request reached the upstream and no status came
		// back (a response-header timeout, a reset or an EOF after the
		// request); the recorded status when it broke off mid-body.
		if !g.v3 {
			return Step{}, false
		}
		for _, p := range []Proto{H1, H2, H2C, H3} {
			for _, fail := range upstreamFailures() {
				in := g.scenarioIntent()
				first := g.scenarioAttempt(in, "a", fail)
				first.Proto = p
				retry := g.scenarioAttempt(in, pick(g.r3, "a", "b"), g.fast())
				retry.Proto = pick(g.r3, H1, H2, H2C, H3)
				st.Attempts = append(st.Attempts, first, retry)
			}
		}
		st.Kind = "sequence"
	case scSilent:
		// One client per protocol, each reading as the answer comes; its
		// upstream sends nothing for longer than the stall timeout once
		// its headers are out (chunked) or its first bytes (sized).
		r3 := g.r3
		for _, p := range []Proto{H1, H2, H2C, H3} {
			do := Behaviour{Status: 201, Size: 16<<10 + r3.IntN(16<<10), BreakAfter: -1}
			do.Silence = stallTimeout*3/2 + time.Duration(r3.IntN(int(2*stallTimeout)))
			do.SilenceAfter = pick(r3, 0, 0, 1+r3.IntN(8<<10))
			a := g.scenarioAttempt(g.scenarioIntent(), "a", do)
			a.Proto = p
			st.Attempts = append(st.Attempts, a)
		}
	case scStorm:
		// Two first requests, of the storm's client and of another
		// client, run for a lease and a half; a third of a lease in, the
		// storm: more retries of the first key than the 1,000 a handler
		// keeps waiting, with small bodies or bodies of tens of KiB; once
		// they wait, the other client's retry, which must find a place
		// and wait too. Every retry asks to wait (Prefer), whatever
		// in_flight says.
		r3 := g.r3
		storm, other := g.scenarioIntent(), g.scenarioIntent()
		other.auth = "Bearer other-client"
		if r3.IntN(2) == 0 {
			storm.body.size = 16<<10 + r3.IntN(32<<10)
		}
		owner := g.scenarioAttempt(storm, "a", g.fast())
		owner.Leases = 1.5
		otherOwner := g.scenarioAttempt(other, "a", g.fast())
		otherOwner.Leases = 1.5
		st.Attempts = []*Attempt{owner, otherOwner}
		st.Timing = &timing{At: []float64{0, -1}}
		for range 1020 + r3.IntN(40) {
			a := g.scenarioAttempt(storm, "a", g.fast())
			a.Header = append(a.Header, [2]string{"Prefer", "wait=30"})
			st.Attempts = append(st.Attempts, a)
			st.Timing.At = append(st.Timing.At, 0.3)
		}
		retry := g.scenarioAttempt(other, "a", g.fast())
		retry.Header = append(retry.Header, [2]string{"Prefer", "wait=30"})
		st.Attempts = append(st.Attempts, retry)
		st.Timing.At = append(st.Timing.At, 0.7)
	default:
		return Step{}, false
	}
	return st, true
}

// upstreamFailures are the ways an upstream fails that the upstream
// scenario plays: before its status (its address refusing connections,
// a response-header timeout, a reset or an EOF once it read the
// request), mid-body (a reset), and its own 5xx.
func upstreamFailures() []Behaviour {
	plain := Behaviour{Status: 201, Size: 90, BreakAfter: -1}
	refused, timeout, reset, eof, midBody, fivexx := plain, plain, plain, plain, plain, plain
	refused.Fail = FailRefused
	timeout.Fail = FailTimeout
	reset.CloseBeforeStatus, reset.Reset = true, true
	eof.CloseBeforeStatus = true
	midBody.BreakAfter, midBody.Reset = 10, true
	fivexx.Status = 502
	return []Behaviour{refused, timeout, reset, eof, midBody, fivexx}
}

// Sizes of the slow scenarios, against the model's stall timeout
// (stallTimeout): an answer several times what the connection buffers
// hold, read at a rate that takes a 4 KiB piece well within the timeout
// and a 32 KiB write well beyond it.
const (
	slowAnswer = 128 << 10
	slowRate   = 12 << 10
)

// fast is a plain 201 behaviour.
func (g *gen) fast() Behaviour { return Behaviour{Status: 201, Size: 90, BreakAfter: -1} }

// scenarioIntent is a new intent of a well-formed request that the
// trial's enforcing handlers key: a JSON POST with a key header.
func (g *gen) scenarioIntent() *intent {
	k := g.scenarioKeys
	g.scenarioKeys++
	// Within a max_key_length of 12: the run's 9 characters, and 3.
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	id := fmt.Sprintf("%ss%c%c", g.run, digits[k/36%36], digits[k%36])
	in := &intent{
		label:   fmt.Sprintf("%s-sc%d", g.run, k),
		host:    g.run + "-a.test",
		auth:    "Bearer scenario",
		tenant:  g.run + "-tenant-s",
		key:     keyForm{lines: []string{id}, id: id},
		method:  "POST",
		target:  "/orders/1",
		ctype:   "application/json",
		variant: "a",
		body:    bodyForm{kind: "json", amount: 10, nonce: 1000 + k},
	}
	return in
}

// scenarioAttempt is an attempt of in on path, the upstream doing do.
func (g *gen) scenarioAttempt(in *intent, path string, do Behaviour) *Attempt {
	a := g.build(in, ReadAll, do, false)
	a.Path = path
	return a
}

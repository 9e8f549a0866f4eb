package main

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/soak/history"
)

// planned is one fault of the schedule.
type planned struct {
	At       time.Duration // from the start of the run
	Kind     history.FaultKind
	Instance string
	Store    string
	// For is how long the fault lasts: a pause, a stall or a cut; how
	// long a killed instance or store stays down before its restart.
	For time.Duration
	// Variant is the config a reload loads (an index in variants), or
	// how a lock holds its row (lockInsert, lockTakeover).
	Variant int
	// Latency and Jitter are a latency fault's one-way delay.
	Latency, Jitter time.Duration
}

func (p planned) String() string {
	target := p.Instance
	switch {
	case p.Instance != "" && p.Store != "":
		target = p.Instance + "-" + p.Store
	case p.Store != "":
		target = p.Store
	}
	s := fmt.Sprintf("%8.3fs %-13s %-11s", p.At.Seconds(), p.Kind, target)
	switch p.Kind {
	case history.Reload:
		return s + " " + variants[p.Variant].String()
	case history.Latency:
		return s + fmt.Sprintf(" %.3fs, %s + %s one way", p.For.Seconds(), p.Latency, p.Jitter)
	case history.Lock:
		return s + fmt.Sprintf(" %.3fs, %s", p.For.Seconds(), []string{"an uncommitted insert", "a lapsed row for update"}[p.Variant])
	}
	return s + fmt.Sprintf(" %.3fs", p.For.Seconds())
}

// scheduleOptions shape a schedule.
type scheduleOptions struct {
	seed        int64
	length      time.Duration // faults start within it
	every       time.Duration // mean gap between faults
	instances   []string
	lockTimeout time.Duration
	// storeTimeout is the stores' statement timeout: a lock outlasts it.
	storeTimeout time.Duration
	// kinds are the faults drawn (nil: every kind), by their weights.
	kinds map[history.FaultKind]bool
	// quiet are windows in which no fault may be under way: the scale
	// waves, judged on scale and timing alone (an outage would excuse
	// what they find).
	quiet []window
}

// window is a stretch of a run, from its start.
type window struct{ from, to time.Duration }

// overlaps reports whether [from, to] meets any of ws.
func overlaps(ws []window, from, to time.Duration) bool {
	for _, w := range ws {
		if from < w.to && to > w.from {
			return true
		}
	}
	return false
}

// faultWeights are how often each kind of fault is drawn, in percent.
// Link faults come first: a store outage of a fraction of lock_timeout is
// the fault leases must survive.
var faultWeights = []struct {
	kind   history.FaultKind
	weight int
}{
	{history.Stall, 26},
	{history.Cut, 16},
	{history.Pause, 14},
	{history.Reload, 10},
	{history.Kill, 8},
	{history.StoreRestart, 8},
	{history.StoreKill, 8},
	{history.Latency, 6},
	{history.Lock, 4},
}

// restartAllowance is what a schedule expects a restart to take, so that
// it does not plan a fault on a target still coming back.
const restartAllowance = 3 * time.Second

// plan draws the schedule of a run from its seed alone: the same seed
// gives the same faults at the same times. One target (an instance, a
// link between an instance and a store, a store) has one fault at a time.
func plan(o scheduleOptions) []planned {
	rng := rand.New(rand.NewPCG(uint64(o.seed), 0x5eed))
	L := o.lockTimeout
	frac := func(lo, hi float64) time.Duration { return time.Duration((lo + rng.Float64()*(hi-lo)) * float64(L)) }
	busy := map[string]time.Duration{} // target: until when
	var out []planned
	if o.kinds != nil && len(o.kinds) == 0 {
		return nil // -faults none
	}
	at := 3 * time.Second // let the first requests through first
	for {
		gap := time.Duration(rng.ExpFloat64() * float64(o.every))
		at += min(max(gap, 200*time.Millisecond), 4*o.every)
		if at >= o.length {
			return out
		}
		for range 5 { // a few draws for a target that is free
			p := planned{At: at, Kind: drawKind(rng, o.kinds), Instance: o.instances[rng.IntN(len(o.instances))],
				Store: []string{history.Redis, history.Postgres}[rng.IntN(2)]}
			var target string
			var lasts time.Duration
			switch p.Kind {
			case history.Stall, history.Cut:
				p.For = frac(0.1, 1.2)
				target, lasts = "link "+p.Instance+"-"+p.Store, p.For
			case history.Pause:
				// Below and above the tolerance.
				if rng.IntN(10) < 6 {
					p.For = frac(0.1, 0.7)
				} else {
					p.For = frac(0.8, 1.5)
				}
				p.Store = ""
				target, lasts = "instance "+p.Instance, p.For
			case history.Kill:
				p.For, p.Store = time.Duration(rng.Int64N(int64(2*time.Second))), ""
				target, lasts = "instance "+p.Instance, p.For+restartAllowance
			case history.Reload:
				p.Variant, p.Store = rng.IntN(len(variants)), ""
				target, lasts = "instance "+p.Instance, time.Second
			case history.StoreRestart:
				p.Instance = ""
				target, lasts = "store "+p.Store, restartAllowance
			case history.StoreKill:
				p.For, p.Instance = time.Duration(rng.Int64N(int64(time.Second))), ""
				target, lasts = "store "+p.Store, p.For+restartAllowance
			case history.Latency:
				// 10-80 ms round trip, with jitter, for 1-4 lock_timeouts.
				p.For = frac(1, 4)
				p.Latency = time.Duration(5+rng.IntN(36)) * time.Millisecond
				p.Jitter = time.Duration(rng.Int64N(int64(p.Latency/2) + 1)).Round(time.Millisecond)
				target, lasts = "link "+p.Instance+"-"+p.Store, p.For
			case history.Lock:
				// Past the statement timeout: a request held up behind
				// the row meets its deadline while it lasts.
				st := cmp.Or(o.storeTimeout, 2*time.Second)
				p.For = time.Duration((1.2 + 1.3*rng.Float64()) * float64(st))
				p.Instance, p.Store, p.Variant = "", history.Postgres, rng.IntN(2)
				target, lasts = "store "+p.Store, p.For+time.Second
			}
			if busy[target] > at || overlaps(o.quiet, at, at+lasts) {
				continue
			}
			busy[target] = at + lasts
			out = append(out, p)
			break
		}
	}
}

func drawKind(rng *rand.Rand, kinds map[history.FaultKind]bool) history.FaultKind {
	total := 0
	for _, w := range faultWeights {
		if kinds == nil || kinds[w.kind] {
			total += w.weight
		}
	}
	n := rng.IntN(total)
	for _, w := range faultWeights {
		if kinds != nil && !kinds[w.kind] {
			continue
		}
		if n < w.weight {
			return w.kind
		}
		n -= w.weight
	}
	panic("unreachable")
}

// parseKinds reads the -faults flag: fault kinds separated by commas,
// "all" for every one, "none" for none.
func parseKinds(s string) (map[history.FaultKind]bool, error) {
	if s == "" || s == "all" {
		return nil, nil
	}
	if s == "none" {
		return map[history.FaultKind]bool{}, nil
	}
	known := map[history.FaultKind]bool{}
	for _, w := range faultWeights {
		known[w.kind] = true
	}
	kinds := map[history.FaultKind]bool{}
	for _, name := range strings.Split(s, ",") {
		k := history.FaultKind(strings.TrimSpace(name))
		if !known[k] {
			return nil, fmt.Errorf("unknown fault %q (known: stall, cut, pause, reload, kill, store-restart, store-kill, latency, lock)", k)
		}
		kinds[k] = true
	}
	return kinds, nil
}

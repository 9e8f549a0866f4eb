package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/soak/history"
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
	// Variant is the config a reload loads (an index in variants).
	Variant int
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
	if p.Kind == history.Reload {
		return s + " " + variants[p.Variant].String()
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
	// kinds are the faults drawn (nil: every kind), by their weights.
	kinds map[history.FaultKind]bool
}

// faultWeights are how often each kind of fault is drawn, in percent.
// Link faults come first: a store outage of a fraction of lock_timeout is
// the fault leases must survive.
var faultWeights = []struct {
	kind   history.FaultKind
	weight int
}{
	{history.Stall, 28},
	{history.Cut, 18},
	{history.Pause, 16},
	{history.Reload, 12},
	{history.Kill, 8},
	{history.StoreRestart, 9},
	{history.StoreKill, 9},
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
			}
			if busy[target] > at {
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
// "all" for every one.
func parseKinds(s string) (map[history.FaultKind]bool, error) {
	if s == "" || s == "all" {
		return nil, nil
	}
	known := map[history.FaultKind]bool{}
	for _, w := range faultWeights {
		known[w.kind] = true
	}
	kinds := map[history.FaultKind]bool{}
	for _, name := range strings.Split(s, ",") {
		k := history.FaultKind(strings.TrimSpace(name))
		if !known[k] {
			return nil, fmt.Errorf("unknown fault %q (known: stall, cut, pause, reload, kill, store-restart, store-kill)", k)
		}
		kinds[k] = true
	}
	return kinds, nil
}

package main

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/soak/history"
)

func testSchedule(seed int64) []planned {
	return plan(scheduleOptions{seed: seed, length: 3 * time.Minute, every: 1500 * time.Millisecond,
		instances: []string{"a", "b", "c"}, lockTimeout: 3 * time.Second, storeTimeout: 2 * time.Second})
}

func TestTheSameSeedGivesTheSameSchedule(t *testing.T) {
	a, b := testSchedule(42), testSchedule(42)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two schedules of seed 42 differ")
	}
	if reflect.DeepEqual(a, testSchedule(43)) {
		t.Fatal("seeds 42 and 43 give the same schedule")
	}
}

func TestAScheduleHasEveryFaultOneAtATimePerTarget(t *testing.T) {
	L := 3 * time.Second
	s := testSchedule(7)
	seen := map[history.FaultKind]int{}
	short, long := 0, 0 // link faults and pauses against the tolerance
	until := map[string]time.Duration{}
	for _, p := range s {
		seen[p.Kind]++
		if p.At < 0 || p.At >= 3*time.Minute {
			t.Errorf("%v: outside the run", p)
		}
		switch p.Kind {
		case history.Stall, history.Cut, history.Pause:
			if p.For < L/10 || p.For > 3*L/2 {
				t.Errorf("%v: lasts outside 0.1-1.5 lock_timeout", p)
			}
			if p.For < 3*L/4 {
				short++
			} else {
				long++
			}
		}
		switch p.Kind {
		case history.Latency:
			if p.For < L || p.For > 4*L || p.Latency < 5*time.Millisecond || p.Latency > 40*time.Millisecond || p.Jitter > p.Latency/2 {
				t.Errorf("%v: not 1-4 lock_timeouts of 10-80 ms round trip with jitter up to half", p)
			}
		case history.Lock:
			if p.Store != history.Postgres || p.Instance != "" || p.For < 2*time.Second || p.For > 5*time.Second {
				t.Errorf("%v: not a PostgreSQL row held past the statement timeout (2s)", p)
			}
		}
		target := p.Instance + "/" + p.Store
		if p.Kind.OnALink() {
			target = "link " + target
		}
		if until[target] > p.At {
			t.Errorf("%v: its target is still busy", p)
		}
		until[target] = p.At + p.For
		switch p.Kind {
		case history.Kill, history.StoreKill, history.StoreRestart:
			until[target] += restartAllowance
		case history.Reload:
			until[target] += time.Second
		}
	}
	for _, w := range faultWeights {
		if seen[w.kind] == 0 {
			t.Errorf("no %s in %d faults", w.kind, len(s))
		}
	}
	if short == 0 || long == 0 {
		t.Errorf("%d outages below the tolerance and %d above; want both", short, long)
	}
	if len(s) < 60 {
		t.Errorf("%d faults in 3 minutes, want one every 1.5s or so", len(s))
	}
}

func TestTheSameSeedGivesTheSameWorkload(t *testing.T) {
	L := 3 * time.Second
	for worker := range 3 {
		for n := range 50 {
			a, b := newIntent(9, worker, n, 1, L), newIntent(9, worker, n, 1, L)
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("worker %d intent %d differs between two draws", worker, n)
			}
		}
	}
	r1, r2 := rngFor(9, 2, 1, 3), rngFor(9, 2, 1, 3)
	for range 100 {
		if drawBehaviour(r1, L) != drawBehaviour(r2, L) {
			t.Fatal("behaviours of the same source differ")
		}
	}
}

func TestTheWorkloadHasEveryBehaviour(t *testing.T) {
	L := 3 * time.Second
	rng := rngFor(1, 2)
	var slow, lease, fives, breaks, hangs, impatient int
	fails := map[string]int{}
	for range 2000 {
		b := drawBehaviour(rng, L)
		fails[b.fail]++
		switch {
		case b.delay > L:
			lease++
		case b.delay > L/3:
			slow++
		}
		if b.status >= 500 {
			fives++
		}
		if b.breakOff {
			breaks++
		}
		if b.hangUp > 0 {
			hangs++
		}
		if b.timeout < patience(L) {
			impatient++
		}
	}
	for name, n := range map[string]int{"slower than a renewal period": slow, "slower than the lease": lease,
		"5xx": fives, "broken off": breaks, "hung up": hangs, "impatient": impatient} {
		if n < 40 {
			t.Errorf("%d attempts %s in 2000", n, name)
		}
	}
	for _, f := range []string{history.FailTimeout, history.FailReset, history.FailEOF, history.FailRefused, history.FailResetBody} {
		if fails[f] < 10 {
			t.Errorf("%d attempts whose upstream fails by %s in 2000", fails[f], f)
		}
	}
	shared, multi, open := 0, 0, 0
	for n := range 1000 {
		in := newIntent(1, 0, n, n, L)
		if strings.HasPrefix(in.Key, "shared-") {
			shared++
		}
		if in.Senders > 1 {
			multi++
		}
		if in.FailOpen {
			open++
		}
	}
	if shared == 0 || multi == 0 || open == 0 {
		t.Errorf("in 1000 intents: %d shared keys, %d with several senders, %d on the fail_open route", shared, multi, open)
	}
}

func TestAScheduleCanBeLimitedToSomeFaults(t *testing.T) {
	kinds, err := parseKinds("stall,store-kill")
	if err != nil {
		t.Fatal(err)
	}
	s := plan(scheduleOptions{seed: 3, length: time.Minute, every: time.Second,
		instances: []string{"a", "b"}, lockTimeout: 3 * time.Second, kinds: kinds})
	seen := map[history.FaultKind]int{}
	for _, p := range s {
		seen[p.Kind]++
	}
	if len(seen) != 2 || seen[history.Stall] == 0 || seen[history.StoreKill] == 0 {
		t.Fatalf("drew %v, want stalls and store kills only", seen)
	}
	if _, err := parseKinds("stall,nap"); err == nil {
		t.Fatal("an unknown fault is accepted")
	}
	none, err := parseKinds("none")
	if err != nil {
		t.Fatal(err)
	}
	if s := plan(scheduleOptions{seed: 3, length: time.Minute, every: time.Second,
		instances: []string{"a", "b"}, lockTimeout: 3 * time.Second, kinds: none}); len(s) != 0 {
		t.Fatalf("-faults none planned %d faults", len(s))
	}
}

func TestNoFaultIsUnderWayDuringAScaleWave(t *testing.T) {
	L := 3 * time.Second
	q := waveQuiet(3*time.Minute, 0, 1, L)
	if q.from > 90*time.Second || q.to < 90*time.Second+3*L {
		t.Fatalf("the quiet window %v does not hold a wave at 90s of 3 lock_timeouts", q)
	}
	s := plan(scheduleOptions{seed: 7, length: 3 * time.Minute, every: time.Second,
		instances: []string{"a", "b", "c"}, lockTimeout: L, storeTimeout: 2 * time.Second, quiet: []window{q}})
	if len(s) < 60 {
		t.Fatalf("%d faults in 3 minutes", len(s))
	}
	for _, p := range s {
		end := p.At + p.For
		switch p.Kind {
		case history.Kill, history.StoreKill, history.StoreRestart:
			end += restartAllowance
		case history.Reload:
			end += time.Second
		}
		if p.At < q.to && end > q.from {
			t.Errorf("%v: under way in the quiet window [%s-%s]", p, q.from, q.to)
		}
	}
}

func TestSlowClientsCoverEveryProtocolAndWayOfReading(t *testing.T) {
	L := 3 * time.Second
	const workers = 4
	seen := map[string]bool{}
	for w := range workers {
		for n := range 4 {
			in, sp, takes := slowIntent(1, w, workers, n, L)
			rd := sp.reader
			mode := rd.mode
			if sp.first.hangUp > 0 {
				mode = "hang-up"
			}
			if sp.first.silence > 0 {
				mode = "silent"
				if sp.first.silence < 12*time.Second || sp.first.silence > 25*time.Second || in.silence != sp.first.silence {
					t.Errorf("%s: an upstream silent for %s", in.Key, sp.first.silence)
				}
			}
			seen[rd.proto.String()+" "+mode] = true
			if in.size < 48<<10 || in.size > 1_000_000 {
				t.Errorf("%s: a %d-byte answer", in.Key, in.size)
			}
			switch mode {
			case history.ReadSlow:
				if rd.rate < 1000 || rd.rate > 3000 || takes < 40*time.Second || takes > 75*time.Second {
					t.Errorf("%s: reads %d B/s for %s", in.Key, rd.rate, takes)
				}
			case history.ReadStall:
				if rd.stall < 12*time.Second || rd.stall > 25*time.Second {
					t.Errorf("%s: stalls %s", in.Key, rd.stall)
				}
			}
			if a, _, _ := slowIntent(1, w, workers, n, L); !reflect.DeepEqual(a, in) {
				t.Errorf("%s: two draws differ", in.Key)
			}
		}
	}
	if len(seen) != len(slowCombos) {
		t.Errorf("4 slow clients of each of %d workers cover %d of the %d protocols and ways of reading: %v", workers, len(seen), len(slowCombos), seen)
	}
}

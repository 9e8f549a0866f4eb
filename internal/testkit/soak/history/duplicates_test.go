package history

import (
	"strings"
	"testing"
)

func TestOneExecutionAndItsReplaysAreNoAnomaly(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 2, 201)
	h.got("a", 1, 1, 201, false)
	h.problem("b", 1.5, 409, ProblemOutstanding)
	h.got("c", 3, 1, 201, true)
	expect(t, h.sweep(1), "")
}

func TestASecondExecutionWithoutAFaultIsADuplicate(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 5, 201)
	h.exec(2, "b", 4.5, 5, 201)
	r := expect(t, h, "duplicate-execution")
	if s := r.Anomalies[0].Summary; !strings.Contains(s, "#2 on b") || !strings.Contains(s, "no fault of a") {
		t.Errorf("summary %q does not say what ran twice and that no fault was near", s)
	}
}

func TestAnExecutionAfterAReleasingAnswerIsExcused(t *testing.T) {
	for _, status := range []int{500, 502, 503, 429, 401} {
		h := newHistory()
		h.exec(1, "a", 1, 2, status)
		h.exec(2, "b", 2.1, 2.5, 201)
		expect(t, h, "", Released)
	}
}

func TestAnExecutionThatStartsBeforeTheReleasingOneEndedIsNotExcusedByIt(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 5, 503)
	h.exec(2, "b", 4.5, 5, 201)
	expect(t, h, "duplicate-execution")
}

// A request that reached the upstream and got no status back (its proxy's
// response-header timeout, a reset or an EOF once the upstream read it)
// left its outcome unknown: the key is kept, and a later execution is a
// duplicate whatever the upstream answered late.
func TestAnExecutionAfterAnUnknownOutcomeIsADuplicate(t *testing.T) {
	for _, tt := range []struct {
		failed string
		status int
	}{{FailReset, 0}, {FailEOF, 0}, {FailTimeout, 201}, {FailTimeout, 503}} {
		h := newHistory()
		h.exec(1, "a", 1, 2, tt.status).Failed = tt.failed
		h.exec(2, "b", 3, 3.1, 201)
		r := expect(t, h, "duplicate-execution")
		if s := r.Anomalies[0].Summary; !strings.Contains(s, "outcome was unknown ("+tt.failed) {
			t.Errorf("%s: summary %q does not say the outcome was unknown", tt.failed, s)
		}
	}
	// A reset mid-body came after the status: the record keeps the key
	// as any broken-off answer does.
	h := newHistory()
	e := h.exec(1, "a", 1, 2, 201)
	e.Failed, e.BrokeOff = FailResetBody, true
	h.exec(2, "b", 3, 3.1, 201)
	expect(t, h, "duplicate-execution")
}

func TestABrokenOffAnswerKeepsTheKey(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 2, 201).BrokeOff = true
	h.exec(2, "b", 3, 3.1, 201)
	expect(t, h, "duplicate-execution")
}

func TestTheHoldersInstanceKilledExcusesTheNextExecution(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 5, 201)
	h.exec(2, "b", 4.5, 5, 201)
	h.fault(Kill, "a", "", 2, 3)
	expect(t, h, "", Killed)

	// Another instance's death excuses nothing, nor a death before the
	// holder ran (it ran on the restarted instance), nor one after.
	for _, f := range []Fault{
		{Kind: Kill, Instance: "c", Start: sec(2), End: sec(3)},
		{Kind: Kill, Instance: "a", Start: sec(0), End: sec(0.9)},
		{Kind: Kill, Instance: "a", Start: sec(4.6), End: sec(6)},
	} {
		h.Faults = []Fault{f}
		expect(t, h, "duplicate-execution")
	}
}

// The tolerance is 0.75 x 3s = 2.25s: an outage of the holder's instance
// and its store at least that long excuses; a shorter one, or one of
// another instance, link or store, or outside the window, does not.
func TestOutagesExcuseOnlyFromTheToleranceOnAndOnlyTheHoldersOwn(t *testing.T) {
	tests := []struct {
		name   string
		store  string
		fault  Fault
		excuse bool
	}{
		{"pause of the holder", Postgres, Fault{Kind: Pause, Instance: "a", Start: sec(2), End: sec(4.3)}, true},
		{"short pause of the holder", Postgres, Fault{Kind: Pause, Instance: "a", Start: sec(2), End: sec(4.2)}, false},
		{"pause of another instance", Postgres, Fault{Kind: Pause, Instance: "b", Start: sec(2), End: sec(4.3)}, false},
		{"stall of the holder's link", Postgres, Fault{Kind: Stall, Instance: "a", Store: Postgres, Start: sec(1.5), End: sec(4)}, true},
		{"short stall of the holder's link", Postgres, Fault{Kind: Stall, Instance: "a", Store: Postgres, Start: sec(2), End: sec(3)}, false},
		{"stall of its link to the other store", Postgres, Fault{Kind: Stall, Instance: "a", Store: Redis, Start: sec(1), End: sec(4)}, false},
		{"cut of the holder's link", Redis, Fault{Kind: Cut, Instance: "a", Store: Redis, Start: sec(1), End: sec(2.3)}, true}, // + 1s reconnect
		{"Redis stall: no reconnect allowance (dials succeed)", Redis, Fault{Kind: Stall, Instance: "a", Store: Redis, Start: sec(1), End: sec(2.3)}, false},
		{"short cut of the holder's link", Postgres, Fault{Kind: Cut, Instance: "a", Store: Postgres, Start: sec(1), End: sec(2.3)}, false},
		{"PostgreSQL restart", Postgres, Fault{Kind: StoreRestart, Store: Postgres, Start: sec(2), End: sec(4.5)}, true},
		{"short PostgreSQL kill", Postgres, Fault{Kind: StoreKill, Store: Postgres, Start: sec(2), End: sec(3.5)}, false},
		{"Redis restart with its reconnect allowance", Redis, Fault{Kind: StoreRestart, Store: Redis, Start: sec(2), End: sec(3.3)}, true},
		{"short Redis restart even with the allowance", Redis, Fault{Kind: StoreRestart, Store: Redis, Start: sec(2), End: sec(3.2)}, false},
		{"restart of the other store", Postgres, Fault{Kind: StoreRestart, Store: Redis, Start: sec(2), End: sec(5)}, false},
		{"long stall after the second execution started", Postgres, Fault{Kind: Stall, Instance: "a", Store: Postgres, Start: sec(6.1), End: sec(9)}, false},
		{"long stall before the holder ran", Postgres, Fault{Kind: Stall, Instance: "a", Store: Postgres, Start: sec(0), End: sec(0.9)}, false},
		{"reload", Postgres, Fault{Kind: Reload, Instance: "a", Start: sec(2), End: sec(5)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistory().on(tt.store, false)
			h.exec(1, "a", 1, 7, 201)
			h.exec(2, "b", 6, 6.5, 201)
			h.Faults = []Fault{tt.fault}
			if tt.excuse {
				r := expect(t, h, "", LongOutage)
				if !strings.Contains(r.Excused[0].Detail, string(tt.fault.Kind)) {
					t.Errorf("the excuse %q does not name the fault", r.Excused[0].Detail)
				}
			} else {
				expect(t, h, "duplicate-execution")
			}
		})
	}
}

func TestOutagesCloseTogetherAddUp(t *testing.T) {
	for _, tt := range []struct {
		gap    float64
		excuse bool
	}{{0.5, true}, {1.5, false}} { // a renewal period is 1s
		h := newHistory()
		h.exec(1, "a", 1, 9, 201)
		h.exec(2, "b", 8, 8.5, 201)
		h.fault(Stall, "a", Postgres, 2, 3.2)
		h.fault(Pause, "a", "", 3.2+tt.gap, 4.4+tt.gap)
		if tt.excuse {
			expect(t, h, "", LongOutage)
		} else {
			expect(t, h, "duplicate-execution")
		}
	}
}

func TestFailOpenDuringAStoreFaultIsExcused(t *testing.T) {
	h := newHistory().on(Redis, true)
	h.exec(1, "a", 1, 2, 201)
	h.exec(2, "b", 5, 5.1, 201) // during b's short stall: unprotected
	h.exec(3, "c", 9, 9.1, 201) // the key is a's: a duplicate
	h.fault(Stall, "b", Redis, 4.5, 5.5)
	expect(t, h, "duplicate-execution", FailOpen)

	// The first ran unprotected: the next one takes the key, excused.
	h = newHistory().on(Redis, true)
	h.exec(1, "a", 1, 2, 201)
	h.exec(2, "b", 5, 5.1, 201)
	h.fault(Cut, "a", Redis, 0.5, 0.8)
	expect(t, h, "", FailOpen)

	// On a fail_closed route a short stall excuses nothing.
	h = newHistory().on(Redis, false)
	h.exec(1, "a", 1, 2, 201)
	h.exec(2, "b", 5, 5.1, 201)
	h.fault(Stall, "b", Redis, 4.5, 5.5)
	expect(t, h, "duplicate-execution")
}

func TestEachExecutionIsJudgedAgainstTheOneBeforeIt(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 2, 500)     // frees the key
	h.exec(2, "b", 3, 4, 201)     // excused: released
	h.exec(3, "c", 10, 10.1, 201) // the key was b's: a duplicate
	h.fault(Kill, "a", "", 5, 6)  // not the holder's
	r := expect(t, h, "duplicate-execution", Released)
	if e := r.Excused[0]; e.Execution != 2 || e.Previous != 1 {
		t.Errorf("excused #%d after #%d, want #2 after #1", e.Execution, e.Previous)
	}
	if s := r.Anomalies[0].Summary; !strings.Contains(s, "#3 on c") || !strings.Contains(s, "#2 on b") {
		t.Errorf("summary %q, want #3 judged against #2", s)
	}
}

func TestScopesAreSeparateRecords(t *testing.T) {
	h := newHistory()
	h.Intents = append(h.Intents, Intent{ID: 2, Scope: "Bearer c2", Key: "k1", Path: "/postgres/orders", Store: Postgres, BodyDigest: "req1"})
	h.exec(1, "a", 1, 2, 201)
	x := h.exec(2, "b", 1.5, 2.5, 201)
	x.Scope = "Bearer c2"
	expect(t, h, "")
}

// The stores of the soak lose nothing on a restart: once an execution was
// replayed its record was complete, and no fault excuses running it again.
func TestACompletedRecordNeverRunsAgainWhateverTheFault(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 2, 201)
	h.got("b", 3, 1, 201, true)
	h.exec(2, "b", 6, 6.5, 201)
	h.fault(Kill, "a", "", 4, 5)
	h.fault(StoreKill, "", Postgres, 4, 9)
	r := expect(t, h, "duplicate-execution")
	if !strings.Contains(r.Anomalies[0].Summary, "record was complete") {
		t.Errorf("summary %q does not say the record was complete", r.Anomalies[0].Summary)
	}
}

// A request that took its key just before its instance froze for longer
// than the tolerance runs its upstream after the freeze, while a retry
// already took the key over: the stall, which ends before either
// execution starts, excuses the second.
func TestAStallBetweenTheReservationAndTheUpstreamExcusesTheNextExecution(t *testing.T) {
	h := newHistory()
	h.got("a", 10.0, 1, 201, false).End = sec(13.1) // took the key at 10.0, answered after the stall
	h.fault(Pause, "a", "", 10.05, 13.06)           // 3.01s > lock_timeout
	h.exec(1, "a", 13.07, 13.1, 201)
	h.exec(2, "a", 13.08, 19.0, 201)
	h.got("a", 10.3, 2, 201, false).End = sec(19.0)
	expect(t, h.sweep(2), "", LongOutage)

	// The same two executions with no fault: a duplicate.
	h = newHistory()
	h.got("a", 10.0, 1, 201, false).End = sec(13.1)
	h.exec(1, "a", 13.07, 13.1, 201)
	h.exec(2, "a", 13.08, 19.0, 201)
	h.got("a", 10.3, 2, 201, false).End = sec(19.0)
	expect(t, h.sweep(2), "duplicate-execution")
}

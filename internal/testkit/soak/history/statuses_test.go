package history

import "testing"

func TestModuleAnswersAreJudgedByTheirSituation(t *testing.T) {
	type fault = Fault
	stallA := func(store string) fault {
		return fault{Kind: Stall, Instance: "a", Store: store, Start: sec(10), End: sec(11)}
	}
	tests := []struct {
		name    string
		store   string
		open    bool
		faults  []fault
		at      float64 // when the attempt started (it lasts 10ms)
		status  int
		problem string
		want    string
	}{
		{"409 outstanding", Postgres, false, nil, 5, 409, ProblemOutstanding, ""},
		{"409 of another type", Postgres, false, nil, 5, 409, "urn:x", "unexpected-status"},
		{"503 during a stall of its link", Postgres, false, []fault{stallA(Postgres)}, 10.5, 503, ProblemStoreUnavailable, ""},
		{"503 within the store timeout after it", Postgres, false, []fault{stallA(Postgres)}, 13.4, 503, ProblemStoreUnavailable, ""},
		{"503 long after it", Postgres, false, []fault{stallA(Postgres)}, 13.6, 503, ProblemStoreUnavailable, "unlisted-5xx"},
		{"503 after a Redis fault, within the reconnect allowance", Redis, false, []fault{stallA(Redis)}, 14.4, 503, ProblemStoreUnavailable, ""},
		{"503 before the fault", Postgres, false, []fault{stallA(Postgres)}, 9, 503, ProblemStoreUnavailable, "unlisted-5xx"},
		{"503 during a stall of another instance's link", Postgres, false, []fault{{Kind: Stall, Instance: "b", Store: Postgres, Start: sec(10), End: sec(11)}}, 10.5, 503, ProblemStoreUnavailable, "unlisted-5xx"},
		{"503 during a stall of the link to the other store", Postgres, false, []fault{stallA(Redis)}, 10.5, 503, ProblemStoreUnavailable, "unlisted-5xx"},
		{"503 during a store restart", Postgres, false, []fault{{Kind: StoreKill, Store: Postgres, Start: sec(10), End: sec(12)}}, 11, 503, ProblemStoreUnavailable, ""},
		{"503 just after the instance was paused", Postgres, false, []fault{{Kind: Pause, Instance: "a", Start: sec(9), End: sec(10)}}, 9.5, 503, ProblemStoreUnavailable, ""},
		{"503 after a kill", Postgres, false, []fault{{Kind: Kill, Instance: "a", Start: sec(9), End: sec(10)}}, 10.5, 503, ProblemStoreUnavailable, "unlisted-5xx"},
		{"503 on a fail_open route", Redis, true, []fault{stallA(Redis)}, 10.5, 503, ProblemStoreUnavailable, "unlisted-5xx"},
		{"503 store-full", Postgres, false, []fault{stallA(Postgres)}, 10.5, 503, "urn:caddy-idempotency:store-full", "unlisted-5xx"},
		{"502 with no upstream failure", Postgres, false, nil, 5, 502, "", "unlisted-5xx"},
		{"500", Postgres, false, nil, 5, 500, "", "unlisted-5xx"},
		{"504", Postgres, false, []fault{stallA(Postgres)}, 10.5, 504, "", "unlisted-5xx"},
		{"422 for the same body", Postgres, false, nil, 5, 422, "urn:caddy-idempotency:key-reused", "unexpected-status"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistory().on(tt.store, tt.open)
			h.Faults = tt.faults
			h.problem("a", tt.at, tt.status, tt.problem)
			expect(t, h, tt.want)
		})
	}
}

func TestUpstreamStatusesAreFirstHandOnly(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 2, 503)
	h.got("a", 1, 1, 503, false)
	expect(t, h, "")

	h = newHistory()
	h.exec(1, "a", 1, 2, 503)
	h.got("a", 3, 1, 503, true)
	expect(t, h, "unlisted-5xx")
}

func TestA502ForAnUpstreamThatFailedBeforeItsStatusIsListed(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 2, 0).Failed = FailReset
	h.problem("a", 1, 502, "")
	expect(t, h, "")

	// A refused dial never reaches the upstream: its 502 is listed for
	// the attempt that asked for it.
	h = newHistory()
	h.problem("a", 1, 502, "").AskFail = FailRefused
	expect(t, h, "")
}

// The outcome-unknown 502 is listed once a request of its key reached
// the upstream and got no status back, and only then; a 504 only for an
// attempt that asked its proxy to time out.
func TestTheOutcomeUnknownAnswersAreListedAfterAnUnknownOutcome(t *testing.T) {
	for _, failed := range []string{FailReset, FailEOF, FailTimeout} {
		h := newHistory()
		h.exec(1, "a", 1, 2, 201).Failed = failed
		h.problem("b", 1.5, 502, ProblemOutcomeUnknown)
		h.problem("a", 3, 502, ProblemOutcomeUnknown)
		expect(t, h, "")
	}
	h := newHistory()
	h.exec(1, "a", 1, 2, 201)
	h.problem("b", 3, 502, ProblemOutcomeUnknown)
	expect(t, h, "unlisted-5xx")

	h = newHistory()
	h.exec(1, "a", 5, 6, 201).Failed = FailReset
	h.problem("b", 3, 502, ProblemOutcomeUnknown)
	expect(t, h, "unlisted-5xx") // before the failure

	h = newHistory()
	h.problem("a", 3, 504, "").AskFail = FailTimeout
	expect(t, h, "")
}

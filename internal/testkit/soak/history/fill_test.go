package history

import (
	"fmt"
	"strings"
	"testing"
)

// fillHistory has a memory store of max_keys 4 on each instance, and
// made-up sources' refusals (404, a scope each) recorded on instance a,
// one of them at 1s..1.1s, the next a tenth later, and so on; intent 0
// is a real client's new key on a.
func fillHistory(madeUp int) *History {
	h := newHistory()
	h.Params.MemoryMaxKeys = 4
	h.Intents[0].Store, h.Intents[0].Path, h.Intents[0].Instance, h.Intents[0].Source = Memory, "/memory/orders", "a", SourceFill
	for i := range madeUp {
		m := h.intent(fmt.Sprintf("Bearer fake-%d", i), "k", Memory, SourceMadeUp, "a")
		at := 1 + float64(i)/10
		x := h.execOf(m, int64(10+i), "a", at, at+0.05, 404, 60)
		h.gotOf(m, "a", at, at+0.05, x, false)
	}
	return h
}

func TestANewKeyRefusedByAStoreThatMadeUpSourcesFilledIsAnAnomaly(t *testing.T) {
	h := fillHistory(4)
	h.problem("a", 5, 503, ProblemStoreFull)
	h.problem("a", 6, 503, ProblemStoreFull)
	r := expect(t, h, "store-filled-by-refusals")
	if s := r.Anomalies[0].Summary; !strings.Contains(s, "2 attempts") || !strings.Contains(s, "held 4 of the 4 records") {
		t.Errorf("summary %q does not count the refusals and the made-up records", s)
	}

	// Half the store is enough: the other half real records.
	h = fillHistory(2)
	for i := range 2 {
		k := h.intent("Bearer c1", fmt.Sprintf("real-%d", i), Memory, SourceFill, "a")
		h.execOf(k, int64(20+i), "a", 2, 2.1, 201, 90)
	}
	h.problem("a", 5, 503, ProblemStoreFull)
	expect(t, h, "store-filled-by-refusals")

	// The sweep meets the same refusal: reported once, not as stuck too.
	h = fillHistory(4)
	h.problem("a", 5, 503, ProblemStoreFull)
	h.SweepStart = sec(100)
	for i := range h.Intents[1:] {
		x := &h.Executions[i]
		h.gotOf(i+1, "a", 100, 100.1, x, true).Sweep = true
	}
	h.problem("a", 100, 503, ProblemStoreFull).Sweep = true
	expect(t, h, "store-filled-by-refusals")
}

func TestAStoreFullOfRealRecordsMayRefuseANewKey(t *testing.T) {
	// Three real records and one refusal: the store is full, as the
	// documentation says it may be (max_keys; 503 store-full).
	h := fillHistory(1)
	for i := range 3 {
		k := h.intent("Bearer c1", fmt.Sprintf("real-%d", i), Memory, SourceFill, "a")
		h.execOf(k, int64(20+i), "a", 2, 2.1, 201, 90)
	}
	h.problem("a", 5, 503, ProblemStoreFull)
	expect(t, h, "")

	// Nothing held: the made-up records died with their instance, or
	// they are another instance's. A refusal then is unlisted.
	h = fillHistory(4)
	h.fault(Kill, "a", "", 3, 4)
	h.problem("a", 5, 503, ProblemStoreFull)
	expect(t, h, "unlisted-5xx")
	h = fillHistory(4)
	h.Intents[0].Instance = "b"
	h.problem("b", 5, 503, ProblemStoreFull)
	expect(t, h, "unlisted-5xx")
}

func TestANewKeyThatRunsOnAFilledStoreKeepsThePromise(t *testing.T) {
	h := fillHistory(4)
	x := h.exec(1, "a", 5, 5.1, 201)
	h.got("a", 5, 1, 201, false)
	_ = x
	expect(t, h, "")
}

// A memory store dies with its instance: a key that runs again after
// its instance was killed is excused, even though it had been replayed;
// without the kill, it is a duplicate.
func TestAMemoryRecordRunsAgainOnlyAfterItsInstanceWasKilled(t *testing.T) {
	h := fillHistory(0)
	h.exec(1, "a", 1, 1.1, 201)
	h.got("a", 1, 1, 201, false)
	h.got("a", 2, 1, 201, true)
	h.exec(2, "a", 10, 10.1, 201)
	h.fault(Kill, "a", "", 5, 6)
	expect(t, h, "", Killed)

	h.Faults = nil
	expect(t, h, "duplicate-execution")
}

package history

import (
	"strings"
	"testing"
)

// stormHistory is a storm's key running on instance a from 10 to 19 s,
// and another client's key running there from 10 to 19 s, whose retry on
// a at 12 s got 409 after d seconds.
func stormHistory(instance string, d float64) *History {
	h := &History{Params: newHistory().Params, NemesisEnd: sec(90)}
	storm := h.intent("Bearer storm", "storm-1", Postgres, SourceStorm, "")
	other := h.intent("Bearer other", "other-1", Postgres, SourceStormOther, "")
	xs := h.execOf(storm, 1, "a", 10, 19, 201, 64)
	h.gotOf(storm, "a", 10, 19, xs, false)
	for i := range 3 {
		h.problemOf(storm, "a", 11, 11.01, 409, ProblemOutstanding)
		h.gotOf(storm, "a", 11+float64(i)/10, 19, xs, true)
	}
	xo := h.execOf(other, 2, "a", 10, 19, 201, 64)
	h.gotOf(other, "a", 10, 19, xo, false)
	h.problemOf(other, instance, 12, 12+d, 409, ProblemOutstanding)
	h.gotOf(other, instance, 20, 20.01, xo, true)
	return h
}

func TestARetryRefusedAtOnceDuringAStormIsAnAnomaly(t *testing.T) {
	r := expect(t, stormHistory("a", 0.01), "waiter-crowded-out")
	if s := r.Anomalies[0].Summary; !strings.Contains(s, "may wait 7.000s") || !strings.Contains(s, "after 0.010s") {
		t.Errorf("summary %q does not say how long the retry could wait and how soon it was refused", s)
	}
	// It waited (wait_timeout is 10 s; the first request ran 7 s more).
	expect(t, stormHistory("a", 7), "")
	// On another instance, where no storm waits.
	expect(t, stormHistory("b", 0.01), "")
	// A fault of its instance's link around it.
	h := stormHistory("a", 0.01)
	h.fault(Stall, "a", Postgres, 11.5, 12.5)
	expect(t, h, "")
}

package history

import (
	"strings"
	"testing"
)

func TestEveryIntentMustGetAFinalAnswerInTheSweep(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 2, 201)
	expect(t, h.sweep(1), "")

	// A 409 first, then the replay: final.
	h = newHistory()
	h.exec(1, "a", 1, 2, 201)
	h.SweepStart = sec(100)
	h.problem("a", 100, 409, ProblemOutstanding).Sweep = true
	h.got("b", 101, 1, 201, true).Sweep = true
	expect(t, h, "")

	// A key whose outcome is unknown: the outcome-unknown answer is its
	// final answer.
	h = newHistory()
	h.exec(1, "a", 1, 2, 0).Failed = FailReset
	h.SweepStart = sec(100)
	h.problem("b", 100, 502, ProblemOutcomeUnknown).Sweep = true
	expect(t, h, "")

	// A key freed on the sweep runs again: final (and excused).
	h = newHistory()
	h.exec(1, "a", 1, 2, 503)
	h.exec(2, "a", 100, 100.1, 201)
	h.SweepStart = sec(100)
	h.got("a", 100, 2, 201, false).Sweep = true
	expect(t, h, "", Released)
}

func TestKeysWithoutAFinalAnswerAfterTheSweepAreStuck(t *testing.T) {
	for _, tt := range []struct {
		name string
		last func(h *History) *Attempt
		says string
	}{
		{"409 forever", func(h *History) *Attempt { return h.problem("a", 101, 409, ProblemOutstanding) }, "still 409"},
		{"503", func(h *History) *Attempt { return h.problem("a", 101, 503, ProblemStoreUnavailable) }, "503"},
		{"an error", func(h *History) *Attempt {
			a := h.problem("a", 101, 0, "")
			a.Err = "connection refused"
			return a
		}, "connection refused"},
		{"an upstream 5xx", func(h *History) *Attempt { return h.got("a", 101, 1, 500, false) }, "500"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistory()
			h.exec(1, "a", 101, 101.1, 500)
			h.SweepStart = sec(100)
			h.problem("a", 100, 409, ProblemOutstanding).Sweep = true
			tt.last(h).Sweep = true
			r := Check(h)
			if r.Count(StuckKey) != 1 {
				t.Fatalf("anomalies %q, want one stuck-key", kinds(r))
			}
			for _, a := range r.Anomalies {
				if a.Kind == StuckKey && (!strings.Contains(a.Summary, tt.says) || !strings.Contains(a.Summary, "2 sweep attempts")) {
					t.Errorf("summary %q, want it to say %q and count the attempts", a.Summary, tt.says)
				}
			}
		})
	}
}

func TestAnIntentTheSweepNeverSentIsStuck(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 2, 201)
	h.SweepStart = sec(100)
	expect(t, h, "stuck-key")
}

func TestARunThatEndedBeforeItsSweepIsNotJudgedOnLiveness(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 2, 201)
	expect(t, h, "")
}

func TestACaddyCrashIsAnAnomaly(t *testing.T) {
	h := newHistory()
	h.Crashes = []Crash{{Instance: "b", At: sec(3), What: "panic: boom"}}
	expect(t, h, "caddy-crash")
}

// A made-up credential never comes back: the sweep leaves it out, and
// that is no stuck key.
func TestMadeUpCredentialsAreNotSwept(t *testing.T) {
	h := fillHistory(1)
	h.exec(1, "a", 5, 5.1, 201)
	h.got("a", 5, 1, 201, false)
	expect(t, h.sweep(1), "")
}

package history

import (
	"strings"
	"testing"
)

func TestReplaysMustBeTheRecordedAnswer(t *testing.T) {
	tests := []struct {
		name   string
		broke  bool // the execution broke off mid-body
		change func(a *Attempt)
		want   string
	}{
		{"the same", false, func(a *Attempt) {}, ""},
		{"another body", false, func(a *Attempt) { a.BodyDigest = "other" }, "replay-differs"},
		{"another status", false, func(a *Attempt) { a.Status = 200 }, "replay-differs"},
		{"body omitted for a whole answer", false, func(a *Attempt) { a.BodyOmitted, a.BodyDigest = true, "" }, "replay-differs"},
		{"a broken-off answer without the body", true, func(a *Attempt) { a.BodyOmitted, a.BodyDigest = true, "" }, ""},
		{"a broken-off answer not marked", true, func(a *Attempt) { a.BodyDigest = "" }, "replay-differs"},
		{"a replay cut short by the client", false, func(a *Attempt) { a.BodyDigest, a.Err = "part", "unexpected EOF" }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistory()
			h.exec(1, "a", 1, 2, 201).BrokeOff = tt.broke
			tt.change(h.got("b", 3, 1, 201, true))
			expect(t, h, tt.want)
		})
	}
}

func TestReplaysOfOneRecordMustAgree(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 5, 201)
	h.exec(2, "b", 4.5, 5, 201)
	h.fault(Kill, "a", "", 2, 3) // would excuse the second run...
	h.got("c", 6, 1, 201, true)
	h.got("c", 7, 2, 201, true) // ...but two records were replayed
	r := expect(t, h, "duplicate-execution,replay-differs")
	if s := r.Anomalies[1].Summary; !strings.Contains(s, "#1") || !strings.Contains(s, "#2") {
		t.Errorf("summary %q does not name both", s)
	}
}

func TestAnswersForAnotherKeyScopeOrRequestAreForeign(t *testing.T) {
	tests := []struct {
		name   string
		change func(h *History, a *Attempt)
	}{
		{"an execution that never ran", func(h *History, a *Attempt) { a.Execution = 9 }},
		{"another key", func(h *History, a *Attempt) { h.Executions[0].Key = "k2" }},
		{"another scope", func(h *History, a *Attempt) { h.Executions[0].Scope = "Bearer c2" }},
		{"another body", func(h *History, a *Attempt) { h.Executions[0].BodyDigest = "req2" }},
		{"another route", func(h *History, a *Attempt) { h.Executions[0].Path = "/redis/orders" }},
		{"a body naming another key", func(h *History, a *Attempt) { a.BodyKey, a.BodyScope, a.BodyExecution = "k2", "Bearer c1", 1 }},
		{"a body naming another scope", func(h *History, a *Attempt) { a.BodyKey, a.BodyScope, a.BodyExecution = "k1", "Bearer c2", 1 }},
		{"a 2xx that names no execution", func(h *History, a *Attempt) { a.Execution = 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistory()
			h.exec(1, "a", 1, 2, 201)
			a := h.got("a", 1, 1, 201, false)
			tt.change(h, a)
			expect(t, h, "foreign-answer")
		})
	}
	// The body naming the right one is fine.
	h := newHistory()
	h.exec(1, "a", 1, 2, 201)
	a := h.got("a", 1, 1, 201, true)
	a.BodyKey, a.BodyScope, a.BodyExecution = "k1", "Bearer c1", 1
	expect(t, h, "")
}

func TestAFirstHandAnswerMustBeWhatItsExecutionSent(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 2, 201)
	h.got("a", 1, 1, 200, false)
	expect(t, h, "answer-differs")

	h = newHistory()
	h.exec(1, "a", 1, 2, 201)
	h.got("a", 1, 1, 201, false).BodyDigest = "other"
	expect(t, h, "answer-differs")

	// A broken-off answer: the client got the status and an error.
	h = newHistory()
	h.exec(1, "a", 1, 2, 201).BrokeOff = true
	a := h.got("a", 1, 1, 201, false)
	a.BodyDigest, a.Err = "part", "unexpected EOF"
	expect(t, h, "")
}

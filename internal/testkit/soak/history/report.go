package history

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// maxTimeline bounds the lines of one anomaly's timeline.
const maxTimeline = 60

// Write prints the report: counts per fault kind, the workload, the
// excused duplicates with their exceptions, counts per anomaly kind, each
// anomaly with its timeline, and last the line "N anomalies".
func (r *Report) Write(w io.Writer, h *History) {
	ix := newIndex(h)
	fmt.Fprintf(w, "== faults (seed %d, lock_timeout %s, tolerance %.2f = %s)\n",
		h.Params.Seed, h.Params.LockTimeout, h.Params.Tolerance, secs(h.tolerated()))
	for _, c := range faultCounts(h) {
		fmt.Fprintf(w, "  %-16s %5d%s\n", c.kind, c.n, c.note)
	}

	replays := 0
	for _, a := range h.Attempts {
		if a.Replayed {
			replays++
		}
	}
	fmt.Fprintf(w, "== workload\n  %d intents, %d attempts (%d replayed), %d executions\n",
		len(h.Intents), len(h.Attempts), replays, len(h.Executions))
	if p := h.Params; p.StoreLatency > 0 || p.StoreJitter > 0 {
		fmt.Fprintf(w, "  every store link %s away one way (jitter %s)\n", p.StoreLatency, p.StoreJitter)
	}
	for _, c := range countBy(h.Intents, func(in Intent) string { return sourceName(in.Source) }) {
		fmt.Fprintf(w, "  %-20s %5d intents\n", c.kind, c.n)
	}
	for _, c := range countBy(h.Attempts, func(a Attempt) string { return clientName(&a) }) {
		if c.kind != "" {
			fmt.Fprintf(w, "  %-20s %5d attempts\n", c.kind, c.n)
		}
	}

	fmt.Fprintf(w, "== duplicate executions excused by a documented exception: %d\n", len(r.Excused))
	for _, c := range countBy(r.Excused, func(e Excused) string { return string(e.Exception) }) {
		fmt.Fprintf(w, "  %-26s %5d\n", c.kind, c.n)
	}
	for _, e := range r.Excused {
		fmt.Fprintf(w, "  key %q scope %q: #%d after #%d, %s: %s\n", e.Key, e.Scope, e.Execution, e.Previous, e.Exception, e.Detail)
	}

	fmt.Fprintf(w, "== anomalies by kind\n")
	for _, c := range countBy(r.Anomalies, func(a Anomaly) string { return string(a.Kind) }) {
		fmt.Fprintf(w, "  %-24s %5d%s\n", c.kind, c.n, bySource(ix, r.Anomalies, AnomalyKind(c.kind)))
	}
	if len(r.Anomalies) > 0 {
		fmt.Fprintf(w, "== anomalies\n")
	}
	for i, a := range r.Anomalies {
		fmt.Fprintf(w, "[%d] %s", i+1, a.Kind)
		if a.Intent >= 0 {
			fmt.Fprintf(w, " intent %d key %q scope %q", a.Intent, a.Key, a.Scope)
		}
		fmt.Fprintf(w, "\n    %s\n", a.Summary)
		if in := ix.intents[a.Intent]; in != nil {
			for _, line := range ix.timeline(in) {
				fmt.Fprintf(w, "      %s\n", line)
			}
		}
	}
	fmt.Fprintf(w, "%d anomalies\n", len(r.Anomalies))
}

// sourceName names an intent's source for the report.
func sourceName(s string) string {
	if s == SourceWorker {
		return "worker"
	}
	return s
}

// clientName names how an attempt's client spoke and read, "" for the
// steady workload's.
func clientName(a *Attempt) string {
	if a.Proto == "" && a.Read == "" {
		return ""
	}
	read := a.Read
	if read == "" {
		read = "reads at once"
	}
	return "client " + a.proto() + " " + read
}

// bySource counts the anomalies of kind by the source of their intent:
// "  (scale 3, worker 1)".
func bySource(ix *index, as []Anomaly, kind AnomalyKind) string {
	var parts []string
	for _, c := range countBy(as, func(a Anomaly) string {
		if a.Kind != kind {
			return ""
		}
		if in := ix.intents[a.Intent]; in != nil {
			return sourceName(in.Source)
		}
		return "-"
	}) {
		if c.kind != "" {
			parts = append(parts, fmt.Sprintf("%s %d", c.kind, c.n))
		}
	}
	return "  (" + strings.Join(parts, ", ") + ")"
}

type count struct {
	kind string
	n    int
	note string
}

// countBy counts items per kind, in name order.
func countBy[T any](items []T, kind func(T) string) []count {
	m := map[string]int{}
	for _, it := range items {
		m[kind(it)]++
	}
	var cs []count
	for k, n := range m {
		cs = append(cs, count{kind: k, n: n})
	}
	slices.SortFunc(cs, func(a, b count) int { return cmp.Compare(a.kind, b.kind) })
	return cs
}

// faultCounts counts the nemesis's faults per kind (with how many lasted
// at least the tolerance), and the faults the workload makes itself:
// upstream answers broken off mid-body, upstream 5xx, client hang-ups.
func faultCounts(h *History) []count {
	cs := countBy(h.Faults, func(f Fault) string { return string(f.Kind) })
	for i := range cs {
		switch FaultKind(cs[i].kind) {
		case Pause, Stall, Cut, StoreRestart, StoreKill:
			long := 0
			for _, f := range h.Faults {
				if string(f.Kind) == cs[i].kind && f.End-f.Start >= h.tolerated() {
					long++
				}
			}
			cs[i].note = fmt.Sprintf("  (%d of them >= %s)", long, secs(h.tolerated()))
		}
	}
	var aborts, hangUps, fives, unknown int
	for _, x := range h.Executions {
		if x.BrokeOff {
			aborts++
		}
		if x.unknownOutcome() {
			unknown++
		}
	}
	fails := map[string]int{}
	for _, a := range h.Attempts {
		if a.HungUp {
			hangUps++
		}
		if a.AskStatus >= 500 {
			fives++
		}
		if a.AskFail != "" {
			fails[a.AskFail]++
		}
	}
	cs = append(cs,
		count{kind: "upstream-abort", n: aborts, note: "  (executions that broke off mid-body)"},
		count{kind: "upstream-5xx", n: fives, note: "  (attempts that asked the upstream for a 5xx)"},
		count{kind: "upstream-unknown", n: unknown, note: "  (executions that got no status back: a response-header timeout, a reset or an EOF after the request)"})
	for _, f := range []string{FailTimeout, FailReset, FailEOF, FailRefused, FailResetBody} {
		cs = append(cs, count{kind: "asked-" + f, n: fails[f], note: "  (attempts that asked the upstream or its proxy to fail so)"})
	}
	return append(cs, count{kind: "client-hang-up", n: hangUps})
}

// event is one line of a timeline.
type event struct {
	at   time.Duration
	line string
}

// timeline lists what happened to an intent: its executions, its
// attempts (runs of 409 folded into one line) and the faults of the
// instances involved and of its store from a lock_timeout before its
// first execution or attempt to one after its last before the sweep.
func (ix *index) timeline(in *Intent) []string {
	var evs []event
	instances := map[string]bool{}
	var from, to time.Duration = -1, 0
	span := func(s, e time.Duration) {
		if from < 0 || s < from {
			from = s
		}
		to = max(to, e)
	}
	for _, x := range ix.runs[scopeKey{in.Scope, in.Key}] {
		instances[x.Instance] = true
		span(x.Start, x.End)
		line := fmt.Sprintf("execution #%d on %s [%s-%s] answered %d (%d bytes)", x.N, x.Instance, secs(x.Start), secs(x.End), x.Status, x.AnswerBytes)
		if x.BrokeOff {
			line += ", broke off mid-body"
		}
		if x.unknownOutcome() {
			line += ", no status reached its proxy (" + x.Failed + "): outcome unknown"
		}
		evs = append(evs, event{x.Start, line})
	}
	var run []*Attempt // consecutive 409s
	flush := func() {
		switch len(run) {
		case 0:
		case 1:
			evs = append(evs, event{run[0].Start, attemptLine(run[0])})
		default:
			evs = append(evs, event{run[0].Start, fmt.Sprintf("%d attempts [%s-%s] got 409", len(run), secs(run[0].Start), secs(run[len(run)-1].End))})
		}
		run = nil
	}
	for _, a := range ix.attempts[in.ID] {
		instances[a.Instance] = true
		if !a.Sweep { // the sweep comes long after the faults
			span(a.Start, a.End)
		}
		if a.Status == 409 {
			run = append(run, a)
			continue
		}
		flush()
		evs = append(evs, event{a.Start, attemptLine(a)})
	}
	flush()
	lt := ix.h.Params.LockTimeout
	for i := range ix.h.Faults {
		f := &ix.h.Faults[i]
		if f.End < from-lt || f.Start > to+lt {
			continue
		}
		if instances[f.Instance] && (f.Store == "" || f.Store == in.Store) || f.Instance == "" && f.Store == in.Store {
			evs = append(evs, event{f.Start, "fault " + f.Describe()})
		}
	}
	slices.SortStableFunc(evs, func(a, b event) int { return cmp.Compare(a.at, b.at) })
	lines := make([]string, 0, len(evs))
	for _, e := range evs {
		lines = append(lines, secs(e.at)+"  "+e.line)
	}
	if len(lines) > maxTimeline {
		half := maxTimeline / 2
		lines = append(append(lines[:half:half], fmt.Sprintf("... %d lines left out ...", len(lines)-maxTimeline)), lines[len(lines)-half:]...)
	}
	return lines
}

// attemptLine describes one attempt and what it asked for and got.
func attemptLine(a *Attempt) string {
	var ask []string
	if m := a.mode(); m != "" {
		ask = append(ask, m)
	}
	if a.AskSize > 0 {
		ask = append(ask, fmt.Sprintf("size %d", a.AskSize))
	}
	if a.AskDelay > 0 {
		ask = append(ask, "delay "+secs(a.AskDelay))
	}
	if a.AskStatus > 0 {
		ask = append(ask, fmt.Sprintf("status %d", a.AskStatus))
	}
	if a.AskBreak {
		ask = append(ask, "break off")
	}
	if a.AskFail != "" {
		ask = append(ask, "fail "+a.AskFail)
	}
	if a.HungUp {
		ask = append(ask, "client hangs up")
	}
	asked := ""
	if len(ask) > 0 {
		asked = " (" + strings.Join(ask, ", ") + ")"
	}
	return fmt.Sprintf("%s%s [-%s]: %s", a.describe(), asked, secs(a.End), a.outcome())
}

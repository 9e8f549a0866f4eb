package history

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A history with every excuse and every listed answer in it, as a soak
// without a bug would record: no anomaly.
func TestAHistoryThatKeepsThePromiseHasNoAnomalies(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 2, 503)     // frees the key
	h.got("a", 1, 1, 503, false)  // the upstream's 503, first-hand
	h.exec(2, "b", 2.2, 6, 201)   // a kill takes b's lease...
	h.fault(Kill, "b", "", 3, 4)  //
	h.exec(3, "c", 5.5, 5.6, 201) // ...and c runs again
	h.problem("a", 2.5, 409, ProblemOutstanding)
	h.problem("c", 4, 503, ProblemStoreUnavailable) // during a stall of c's link
	h.fault(Stall, "c", Postgres, 3.5, 4.5)
	h.got("c", 5.5, 3, 201, false)
	h.got("a", 7, 3, 201, true)
	h.got("b", 8, 3, 201, true)
	h.fault(Reload, "a", "", 9, 9.2)
	expect(t, h.sweep(3), "", Released, Killed)
}

func TestTheReportCountsFaultsAndAnomaliesAndEndsWithTheirNumber(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 6, 201)
	h.exec(2, "b", 5, 5.1, 503)             // a duplicate...
	h.exec(3, "a", 30, 30.1, 201)           // ...which freed the key: excused
	h.fault(Stall, "a", Postgres, 1.5, 2.5) // 1s: below the tolerance
	h.fault(Stall, "c", Postgres, 1.5, 4.5)
	h.fault(Kill, "c", "", 20, 21)
	a := h.got("b", 5, 2, 503, false)
	a.AskDelay, a.AskStatus = sec(0.1), 503
	r := Check(h)
	var out bytes.Buffer
	r.Write(&out, h)
	text := out.String()
	for _, want := range []string{
		"stall                2  (1 of them >= 2.250s)",
		"kill                 1",
		"duplicate-execution          1  (worker 1)",
		"released                       1",
		`[1] duplicate-execution intent 1 key "k1" scope "Bearer c1"`,
		"stall a-postgres 1.000s [1.500s-2.500s], an outage of 1.000s",
		"1.000s  execution #1 on a [1.000s-6.000s] answered 201",
		"1.500s  fault stall a-postgres",
		"attempt 1 of sender 1 on b at 5.000s (delay 0.100s, status 503)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the report lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "fault stall c-postgres") {
		t.Errorf("the timeline names a fault of an instance the key never met:\n%s", text)
	}
	if !strings.HasSuffix(text, "\n1 anomalies\n") {
		t.Errorf("the report does not end with the count:\n%s", text)
	}
}

// The report counts intents by source, the clients of other protocols
// and reading modes, and anomalies by the source of their intent.
func TestTheReportCountsBySourceAndClient(t *testing.T) {
	h := newHistory()
	h.Params.StoreLatency = sec(0.03)
	s := h.intent("Bearer scale", "s-1", Postgres, SourceScale, "")
	h.execOf(s, 1, "a", 1, 8, 201, 90)
	h.execOf(s, 2, "b", 5, 5.1, 201, 90)
	x := h.execOf(0, 3, "a", 1, 40, 201, bigAnswer)
	a := h.gotOf(0, "a", 1, 40, x, false)
	a.Proto, a.Read, a.ReadRate, a.AskSize = "h2", ReadSlow, 2000, bigAnswer
	a.BodyBytes, a.BodyDigest, a.Err = 20_000, "part", "stream error"
	var out bytes.Buffer
	Check(h).Write(&out, h)
	text := out.String()
	for _, want := range []string{
		"every store link 30ms away one way",
		"scale                    1 intents",
		"worker                   1 intents",
		"client h2 slow           1 attempts",
		"duplicate-execution          1  (scale 1)",
		"slow-reader-cut              1  (worker 1)",
		"(h2, reads 2000 B/s, size 900000) [-40.000s]: 201 new #3 20000 bytes (stream error)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the report lacks %q:\n%s", want, text)
		}
	}
}

func TestAHistoryLoadsAsSaved(t *testing.T) {
	h := newHistory()
	h.exec(1, "a", 1, 2, 201).BrokeOff = true
	h.fault(Pause, "a", "", 1, 2)
	path := filepath.Join(t.TempDir(), "history.json")
	if err := h.Save(path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	if got.Params != h.Params || len(got.Executions) != 1 || got.Executions[0] != h.Executions[0] || got.Faults[0] != h.Faults[0] {
		t.Fatalf("loaded %+v, saved %+v", got, h)
	}
}

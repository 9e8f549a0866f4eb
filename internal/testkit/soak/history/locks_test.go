package history

import (
	"strings"
	"testing"
)

// lockHistory is newHistory's intent k1 (PostgreSQL) beside the locked
// key's intent, whose row an outside transaction holds from 10s to 14s.
func lockHistory() (h *History, locked int) {
	h = newHistory()
	locked = h.intent("Bearer lock", "lock-1", Postgres, SourceLocked, "")
	h.Faults = append(h.Faults, Fault{Kind: Lock, Store: Postgres, Start: sec(10), End: sec(14), Key: "lock-1", Scope: "Bearer lock"})
	return h, locked
}

func TestAnotherKeyRefusedWhileARowIsLockedIsAnAnomaly(t *testing.T) {
	h, _ := lockHistory()
	h.problem("a", 11, 503, ProblemStoreUnavailable)
	h.problem("b", 12, 503, ProblemStoreUnavailable)
	r := expect(t, h, "held-up-by-lock")
	if s := r.Anomalies[0].Summary; !strings.Contains(s, `lock postgres row "lock-1"`) || !strings.Contains(s, "2 attempts") {
		t.Errorf("summary %q does not name the lock and count the refusals", s)
	}

	// A 409 with no other request of its key in flight.
	h, _ = lockHistory()
	h.problem("a", 11, 409, ProblemOutstanding)
	expect(t, h, "held-up-by-lock")

	// A request that began before the lock and was still waiting.
	h, _ = lockHistory()
	a := h.problem("a", 9.5, 503, ProblemStoreUnavailable)
	a.End = sec(12)
	expect(t, h, "held-up-by-lock")
}

func TestRefusalsThatTheLockDoesNotExplainAreExcusedOrJudgedElsewhere(t *testing.T) {
	// The locked key itself may wait, get 409 or 503.
	h, locked := lockHistory()
	h.problemOf(locked, "a", 10.5, 12.5, 503, ProblemStoreUnavailable)
	h.problemOf(locked, "b", 11, 11.1, 409, ProblemOutstanding)
	x := h.execOf(locked, 1, "a", 14.1, 14.2, 201, 100)
	h.gotOf(locked, "a", 13, 14.3, x, false)
	expect(t, h, "")

	// A 503 that a stall of its own link explains.
	h, _ = lockHistory()
	h.fault(Stall, "a", Postgres, 10.5, 11.5)
	h.problem("a", 11, 503, ProblemStoreUnavailable)
	expect(t, h, "")

	// A 409 while another request of its key runs (a double submit).
	h, _ = lockHistory()
	h.exec(1, "b", 10.5, 13, 201)
	h.got("b", 10.4, 1, 201, false).End = sec(13)
	h.problem("a", 11, 409, ProblemOutstanding)
	expect(t, h, "")

	// A 503 of another key after the lock was let go is no lock's: an
	// unlisted 5xx, as without one.
	h, _ = lockHistory()
	h.problem("a", 20, 503, ProblemStoreUnavailable)
	expect(t, h, "unlisted-5xx")
}

func TestOtherKeysAnsweredWhileARowIsLockedKeepThePromise(t *testing.T) {
	h, locked := lockHistory()
	h.problemOf(locked, "a", 10.5, 10.6, 409, ProblemOutstanding)
	h.exec(1, "a", 11, 11.2, 201)
	h.got("a", 11, 1, 201, false)
	h.got("b", 12, 1, 201, true)
	expect(t, h, "")
}

// A latency fault is no outage: it excuses neither a duplicate nor a
// 503, and a lock of another key names itself in a duplicate's summary.
func TestLatencyExcusesNothing(t *testing.T) {
	h := newHistory()
	h.fault(Latency, "a", Postgres, 1, 9)
	h.exec(1, "a", 1, 8, 201)
	h.exec(2, "b", 5, 5.1, 201)
	h.problem("a", 3, 503, ProblemStoreUnavailable)
	expect(t, h, "duplicate-execution,unlisted-5xx")

	h, _ = lockHistory()
	h.on(Postgres, true)
	h.exec(1, "a", 10.5, 11, 201)
	h.exec(2, "b", 10.6, 11, 201)
	r := expect(t, h, "duplicate-execution")
	if s := r.Anomalies[0].Summary; !strings.Contains(s, "a row of another key was locked meanwhile") {
		t.Errorf("summary %q does not name the lock in between", s)
	}
}

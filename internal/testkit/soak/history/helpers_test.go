package history

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The tests write histories by hand: times are offsets in seconds, no
// clock is read.

const lockTimeout = 3 * time.Second // tolerance 0.75: 2.25s

func sec(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// newHistory is a history with one intent on PostgreSQL (fail_closed):
// key k1 of scope "Bearer c1", sweep run at 100s.
func newHistory() *History {
	return &History{
		Params: Params{Seed: 1, LockTimeout: lockTimeout, Tolerance: 0.75,
			StoreTimeout: 2 * time.Second, RedisReconnect: time.Second},
		Intents:    []Intent{{ID: 1, Scope: "Bearer c1", Key: "k1", Path: "/postgres/orders", Store: Postgres, BodyDigest: "req1", Senders: 1}},
		NemesisEnd: sec(90),
	}
}

// on moves the first intent to store (fail_open when open).
func (h *History) on(store string, open bool) *History {
	h.Intents[0].Store, h.Intents[0].FailOpen = store, open
	h.Intents[0].Path = "/" + store + "/orders"
	return h
}

// exec adds an execution of the first intent: #n on instance from start
// to end (seconds), answering status with body "ans<n>".
func (h *History) exec(n int64, instance string, start, end float64, status int) *Execution {
	in := h.Intents[0]
	h.Executions = append(h.Executions, Execution{N: n, Key: in.Key, Scope: in.Scope, Path: in.Path,
		Instance: instance, BodyDigest: in.BodyDigest, Start: sec(start), End: sec(end), Status: status,
		AnswerDigest: "ans" + string(rune('0'+n))})
	return &h.Executions[len(h.Executions)-1]
}

// got adds an attempt of the first intent that got the answer of
// execution n (replayed or first-hand) with status, its body whole.
func (h *History) got(instance string, at float64, n int64, status int, replayed bool) *Attempt {
	h.Attempts = append(h.Attempts, Attempt{Intent: h.Intents[0].ID, Sender: 1, Seq: len(h.Attempts) + 1,
		Instance: instance, Start: sec(at), End: sec(at + 0.01), Status: status, Replayed: replayed,
		Execution: n, BodyDigest: "ans" + string(rune('0'+n))})
	return &h.Attempts[len(h.Attempts)-1]
}

// problem adds an attempt of the first intent answered by the module.
func (h *History) problem(instance string, at float64, status int, typ string) *Attempt {
	h.Attempts = append(h.Attempts, Attempt{Intent: h.Intents[0].ID, Sender: 1, Seq: len(h.Attempts) + 1,
		Instance: instance, Start: sec(at), End: sec(at + 0.01), Status: status, Problem: typ})
	return &h.Attempts[len(h.Attempts)-1]
}

// fault adds a fault from start to end (seconds).
func (h *History) fault(kind FaultKind, instance, store string, start, end float64) {
	h.Faults = append(h.Faults, Fault{Kind: kind, Instance: instance, Store: store, Start: sec(start), End: sec(end)})
}

// sweep runs the liveness sweep at 100s: one replay of execution n.
func (h *History) sweep(n int64) *History {
	h.SweepStart = sec(100)
	a := h.got("a", 100, n, 201, true)
	a.Sweep = true
	return h
}

// kinds is the report's anomaly kinds, in order.
func kinds(r *Report) string {
	var ks []string
	for _, a := range r.Anomalies {
		ks = append(ks, string(a.Kind))
	}
	return strings.Join(ks, ",")
}

// expect fails unless the report holds exactly the anomaly kinds want
// (comma-separated, "" for none) and the exceptions excused (in order).
func expect(t *testing.T, h *History, want string, excused ...Exception) *Report {
	t.Helper()
	r := Check(h)
	if got := kinds(r); got != want {
		t.Errorf("anomalies %q, want %q", got, want)
		for _, a := range r.Anomalies {
			t.Logf("  %s: %s", a.Kind, a.Summary)
		}
	}
	var got []Exception
	for _, e := range r.Excused {
		got = append(got, e.Exception)
	}
	if strings.Join(toStrings(got), ",") != strings.Join(toStrings(excused), ",") {
		t.Errorf("excused %v, want %v", got, excused)
		for _, e := range r.Excused {
			t.Logf("  %s: %s", e.Exception, e.Detail)
		}
	}
	return r
}

func toStrings(es []Exception) []string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = string(e)
	}
	return s
}

// intent adds an intent of key in scope on store (pinned to instance
// when not ""), from source, and returns its index in h.Intents.
func (h *History) intent(scope, key, store, source, instance string) int {
	id := len(h.Intents) + 1
	h.Intents = append(h.Intents, Intent{ID: id, Scope: scope, Key: key, Path: "/" + store + "/orders", Store: store,
		BodyDigest: "req-" + key, Senders: 1, Source: source, Instance: instance})
	return len(h.Intents) - 1
}

// execOf adds an execution of intent i (an index in h.Intents): #n on
// instance from start to end, answering status with bytes body bytes.
func (h *History) execOf(i int, n int64, instance string, start, end float64, status, bytes int) *Execution {
	in := h.Intents[i]
	h.Executions = append(h.Executions, Execution{N: n, Key: in.Key, Scope: in.Scope, Path: in.Path,
		Instance: instance, BodyDigest: in.BodyDigest, Start: sec(start), End: sec(end), Status: status,
		AnswerDigest: fmt.Sprintf("ans%d", n), AnswerBytes: bytes})
	return &h.Executions[len(h.Executions)-1]
}

// gotOf adds an attempt of intent i that got the whole answer of
// execution x (replayed or first-hand), from at to end.
func (h *History) gotOf(i int, instance string, at, end float64, x *Execution, replayed bool) *Attempt {
	h.Attempts = append(h.Attempts, Attempt{Intent: h.Intents[i].ID, Sender: 1, Seq: len(h.Attempts) + 1,
		Instance: instance, Start: sec(at), End: sec(end), Status: x.Status, Replayed: replayed,
		Execution: x.N, BodyDigest: x.AnswerDigest, BodyBytes: x.AnswerBytes})
	return &h.Attempts[len(h.Attempts)-1]
}

// problemOf adds an attempt of intent i answered by the module.
func (h *History) problemOf(i int, instance string, at, end float64, status int, typ string) *Attempt {
	h.Attempts = append(h.Attempts, Attempt{Intent: h.Intents[i].ID, Sender: 1, Seq: len(h.Attempts) + 1,
		Instance: instance, Start: sec(at), End: sec(end), Status: status, Problem: typ})
	return &h.Attempts[len(h.Attempts)-1]
}

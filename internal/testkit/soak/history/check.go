package history

import (
	"slices"
	"time"
)

// AnomalyKind names a broken promise.
type AnomalyKind string

// Anomaly kinds.
const (
	// DuplicateExecution: the upstream ran a (scope, key) again and no
	// documented exception excuses it.
	DuplicateExecution AnomalyKind = "duplicate-execution"
	// ReplayDiffers: replays of a key disagree with each other or with
	// the execution they name.
	ReplayDiffers AnomalyKind = "replay-differs"
	// ForeignAnswer: a client got an answer made for another key, scope
	// or request, or one no execution made.
	ForeignAnswer AnomalyKind = "foreign-answer"
	// AnswerDiffers: a client's first-hand answer is not what its
	// execution sent.
	AnswerDiffers AnomalyKind = "answer-differs"
	// StuckKey: after the faults stopped and a quiet period, an intent
	// still got no final answer.
	StuckKey AnomalyKind = "stuck-key"
	// Unlisted5xx: a 5xx the documentation does not list for the
	// situation.
	Unlisted5xx AnomalyKind = "unlisted-5xx"
	// UnexpectedStatus: another answer of the module that this workload
	// must never get (a 422 for a retry with the same body, a 400, ...).
	UnexpectedStatus AnomalyKind = "unexpected-status"
	// CaddyCrash: an instance panicked or exited on its own.
	CaddyCrash AnomalyKind = "caddy-crash"
	// TruncatedCleanEnd: a body accepted as complete (a clean end, no
	// error) that is shorter than what the upstream sent for it, or a
	// first-hand answer that ended cleanly although the upstream broke
	// off mid-body: a response cut short must be aborted, never ended.
	TruncatedCleanEnd AnomalyKind = "truncated-clean-end"
	// SlowReaderCut: a client that read steadily, however slowly, had
	// its answer cut: a client is gone only after 10 s without taking a
	// byte.
	SlowReaderCut AnomalyKind = "slow-reader-cut"
	// SilentUpstreamCut: a client that read its answer as it came had it
	// cut while the upstream sent nothing for longer than the stall
	// timeout: a silent upstream is not a stalled client.
	SilentUpstreamCut AnomalyKind = "silent-upstream-cut"
	// WaiterCrowdedOut: while one key's storm of retries waited on an
	// instance, another key's retry there, which may wait for its first
	// request, got 409 at once: one key's waiters took every place.
	WaiterCrowdedOut AnomalyKind = "waiter-crowded-out"
	// HeldUpByLock: while an outside transaction held one PostgreSQL row
	// locked, a request of another key was refused (409, 503).
	HeldUpByLock AnomalyKind = "held-up-by-lock"
	// StoreFilledByRefusals: a new key was refused store-full while the
	// refusals of made-up sources (each a scope of its own) held most of
	// the store.
	StoreFilledByRefusals AnomalyKind = "store-filled-by-refusals"
)

// Anomaly is one broken promise, with what a reader needs to find it.
type Anomaly struct {
	Kind    AnomalyKind
	Intent  int // -1: none
	Key     string
	Scope   string
	Summary string
}

// Exception names a documented reason for a key to run again.
type Exception string

// Exceptions (docs/guarantees.md, "Not guaranteed").
const (
	// Released: the previous execution answered a release_on status (5xx
	// by default) or failed before any status, which frees the key.
	Released Exception = "released"
	// Killed: the instance that held the lease was killed.
	Killed Exception = "instance-killed"
	// LongOutage: the instance that held the lease was stalled or cut off
	// from the store, or the store was down, for at least tolerance x
	// lock_timeout.
	LongOutage Exception = "outage-beyond-tolerance"
	// FailOpen: one of the two ran unprotected, under on_storage_error
	// fail_open during a store fault.
	FailOpen Exception = "fail-open"
)

// Excused is a duplicate execution and the exception that excuses it.
type Excused struct {
	Key, Scope string
	Execution  int64 // the duplicate
	Previous   int64 // the execution before it (0: none)
	Exception  Exception
	Detail     string
}

// Report is what Check found.
type Report struct {
	Anomalies []Anomaly
	Excused   []Excused
}

// Check judges h against every invariant.
func Check(h *History) *Report {
	ix := newIndex(h)
	r := &Report{}
	ix.checkDuplicates(r)
	ix.checkAnswers(r)
	ix.checkBodies(r)
	ix.checkStatuses(r)
	ix.checkLocks(r)
	ix.checkStorms(r)
	filled := ix.checkFill(r)
	ix.checkLiveness(r, filled)
	for _, c := range h.Crashes {
		r.Anomalies = append(r.Anomalies, Anomaly{Kind: CaddyCrash, Intent: -1,
			Summary: "caddy " + c.Instance + " at " + secs(c.At) + ": " + c.What})
	}
	return r
}

// scopeKey names a record.
type scopeKey struct{ scope, key string }

// index holds the lookups every invariant needs.
type index struct {
	h        *History
	intents  map[int]*Intent
	byRecord map[scopeKey]*Intent
	execs    map[int64]*Execution
	// runs are the executions of each record, by start.
	runs map[scopeKey][]*Execution
	// attempts are each intent's attempts, by start.
	attempts map[int][]*Attempt
}

func newIndex(h *History) *index {
	ix := &index{h: h, intents: map[int]*Intent{}, byRecord: map[scopeKey]*Intent{},
		execs: map[int64]*Execution{}, runs: map[scopeKey][]*Execution{}, attempts: map[int][]*Attempt{}}
	for i := range h.Intents {
		in := &h.Intents[i]
		ix.intents[in.ID] = in
		ix.byRecord[scopeKey{in.Scope, in.Key}] = in
	}
	for i := range h.Executions {
		x := &h.Executions[i]
		ix.execs[x.N] = x
		if x.Key != "" {
			k := scopeKey{x.Scope, x.Key}
			ix.runs[k] = append(ix.runs[k], x)
		}
	}
	for _, xs := range ix.runs {
		slices.SortStableFunc(xs, func(a, b *Execution) int {
			if a.Start != b.Start {
				return int(a.Start - b.Start)
			}
			return int(a.N - b.N)
		})
	}
	for i := range h.Attempts {
		a := &h.Attempts[i]
		ix.attempts[a.Intent] = append(ix.attempts[a.Intent], a)
	}
	for _, as := range ix.attempts {
		slices.SortStableFunc(as, func(a, b *Attempt) int { return int(a.Start - b.Start) })
	}
	return ix
}

// anomaly adds an anomaly about intent in (nil: none).
func (r *Report) anomaly(kind AnomalyKind, in *Intent, summary string) {
	a := Anomaly{Kind: kind, Intent: -1, Summary: summary}
	if in != nil {
		a.Intent, a.Key, a.Scope = in.ID, in.Key, in.Scope
	}
	r.Anomalies = append(r.Anomalies, a)
}

// killedBetween returns a kill of instance that began between from and
// to, nil if none.
func (h *History) killedBetween(instance string, from, to time.Duration) *Fault {
	for i := range h.Faults {
		f := &h.Faults[i]
		if f.Kind == Kill && f.Instance == instance && f.Start >= from && f.Start <= to {
			return f
		}
	}
	return nil
}

// Count returns how many anomalies of kind the report holds.
func (r *Report) Count(kind AnomalyKind) int {
	n := 0
	for _, a := range r.Anomalies {
		if a.Kind == kind {
			n++
		}
	}
	return n
}

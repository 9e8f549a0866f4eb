package main

import (
	"sync"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/soak/history"
)

// recorder keeps the history of a run as it happens. Every time in it is
// an offset from start, read from this process's monotonic clock: the
// clients, the upstream and the nemesis all live here.
type recorder struct {
	start time.Time
	mu    sync.Mutex
	h     history.History
}

func newRecorder(p history.Params) *recorder {
	return &recorder{start: time.Now(), h: history.History{Params: p}}
}

// now is the offset of this moment.
func (r *recorder) now() time.Duration { return time.Since(r.start) }

// at is the offset of t.
func (r *recorder) at(t time.Time) time.Duration { return t.Sub(r.start) }

func (r *recorder) intent(in history.Intent) {
	r.mu.Lock()
	r.h.Intents = append(r.h.Intents, in)
	r.mu.Unlock()
}

func (r *recorder) attempt(a history.Attempt) {
	r.mu.Lock()
	r.h.Attempts = append(r.h.Attempts, a)
	r.mu.Unlock()
}

func (r *recorder) fault(f history.Fault) {
	r.mu.Lock()
	r.h.Faults = append(r.h.Faults, f)
	r.mu.Unlock()
}

func (r *recorder) crash(c history.Crash) {
	r.mu.Lock()
	r.h.Crashes = append(r.h.Crashes, c)
	r.mu.Unlock()
}

// execution is the upstream's OnExecution: it logs what the upstream did
// and for whom.
func (r *recorder) execution(x caddyproc.Execution) {
	e := history.Execution{
		N:            x.N,
		Key:          x.Header.Get("Idempotency-Key"),
		Scope:        x.Header.Get("Authorization"),
		Path:         x.Path,
		Instance:     x.Header.Get(instanceHeader),
		BodyDigest:   digest(x.Body),
		Start:        r.at(x.Start),
		End:          r.at(x.End),
		Status:       x.Status,
		AnswerDigest: digest(x.Answer),
		AnswerBytes:  len(x.Answer),
		BrokeOff:     x.BrokeOff,
		Failed:       x.Failed,
	}
	if x.Header.Get("X-Upstream-Fail") == history.FailTimeout {
		// Its proxy gave up on its headers before it answered.
		e.Failed = history.FailTimeout
	}
	r.mu.Lock()
	r.h.Executions = append(r.h.Executions, e)
	r.mu.Unlock()
}

// mark sets the phase times.
func (r *recorder) mark(set func(h *history.History)) {
	r.mu.Lock()
	set(&r.h)
	r.mu.Unlock()
}

// counts is progress for the log.
func (r *recorder) counts() (intents, attempts, executions, faults int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.h.Intents), len(r.h.Attempts), len(r.h.Executions), len(r.h.Faults)
}

// snapshot is a copy of the history so far.
func (r *recorder) snapshot() *history.History {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.h
	h.Intents = append([]history.Intent(nil), r.h.Intents...)
	h.Attempts = append([]history.Attempt(nil), r.h.Attempts...)
	h.Executions = append([]history.Execution(nil), r.h.Executions...)
	h.Faults = append([]history.Fault(nil), r.h.Faults...)
	h.Crashes = append([]history.Crash(nil), r.h.Crashes...)
	return &h
}

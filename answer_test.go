package idempotency

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// situation is one thing that can happen to a request before the next
// handler would run: a refusal of its key, a store failure, or what the
// store said of the key.
type situation struct {
	name     string
	failOpen bool
	answer   func(h *Handler) answer
}

// situations lists every row of the answer table.
func situations() []situation {
	refused := func(ref refusal) func(*Handler) answer {
		return func(h *Handler) answer { return h.policy.refusalAnswer(&ref) }
	}
	required := func(ref refusal) func(*Handler) answer {
		return func(h *Handler) answer {
			p := h.policy
			p.required = true
			return p.refusalAnswer(&ref)
		}
	}
	storeErr := func(err error) func(*Handler) answer {
		return func(h *Handler) answer { return h.policy.storeErrorAnswer(err) }
	}
	reserved := func(o storage.Outcome, replayed outcome) func(*Handler) answer {
		return func(*Handler) answer { return reservationAnswer(storage.Reservation{Outcome: o}, replayed) }
	}
	unknown := func(replayed outcome) func(*Handler) answer {
		return func(*Handler) answer {
			rec := &storage.Record{State: storage.Completed, Response: &storage.Response{Status: http.StatusGatewayTimeout, OutcomeUnknown: true}}
			return reservationAnswer(storage.Reservation{Outcome: storage.Replay, Record: rec}, replayed)
		}
	}
	unavailable := fmt.Errorf("dial: %w", storage.ErrUnavailable)
	return []situation{
		{"no key, not required", false, refused(refusal{why: noKey})},
		{"no key, required", false, required(refusal{why: noKey})},
		{"malformed key", false, refused(refusal{why: keyMalformed, err: errors.New("bad")})},
		{"no client identity", false, refused(refusal{why: noScope})},
		{"body not JSON", false, refused(refusal{why: bodyNotJSON})},
		{"body too large", false, refused(refusal{why: bodyTooLarge})},
		{"body unreadable", false, refused(refusal{why: bodyUnreadable, err: errors.New("unexpected EOF")})},
		{"key at key_json ambiguous", false, refused(refusal{why: keyAmbiguous, err: errors.New("two")})},
		{"key at key_json not a key", false, refused(refusal{why: keyJSONInvalid, what: "is not a string"})},
		{"store closed by a reload", false, refused(refusal{why: storeClosed})},
		{"client's share full", false, storeErr(storage.ErrScopeFull)},
		{"store full", false, storeErr(storage.ErrFull)},
		{"store full, fail_open", true, storeErr(storage.ErrFull)},
		{"store unreachable", false, storeErr(unavailable)},
		{"store unreachable, fail_open", true, storeErr(unavailable)},
		{"store answered with an error, fail_open", true, storeErr(fmt.Errorf("decode: %w", storage.ErrCorrupt))},
		{"record locked by another transaction", false, storeErr(fmt.Errorf("lock: %w", storage.ErrBusy))},
		{"record locked by another transaction, fail_open", true, storeErr(fmt.Errorf("lock: %w", storage.ErrBusy))},
		{"new key", false, reserved(storage.Acquired, outcomeReplayed)},
		{"completed key", false, reserved(storage.Replay, outcomeReplayed)},
		{"completed key after a wait", false, reserved(storage.Replay, outcomeWaited)},
		{"key in flight", false, reserved(storage.Conflict, outcomeReplayed)},
		{"key reused for another request", false, reserved(storage.Mismatch, outcomeReplayed)},
		{"key whose outcome is unknown", false, unknown(outcomeReplayed)},
		{"key whose outcome is unknown, after a wait", false, unknown(outcomeWaited)},
	}
}

// TestEveryOutcomeHasItsRowInBothModes acts on every row of the answer
// table in enforce mode and in observe mode: every outcome comes from
// some row; enforce mode answers each as the behaviour table says (a
// problem with its status and Retry-After, a replay, the next handler);
// observe mode records the same outcome and hands every request but a
// new key's on to the next handler untouched.
func TestEveryOutcomeHasItsRowInBothModes(t *testing.T) {
	seen := map[outcome]bool{}
	for _, s := range situations() {
		t.Run(s.name, func(t *testing.T) {
			for _, mode := range []string{modeEnforce, modeObserve} {
				h := &Handler{Mode: mode}
				if s.failOpen {
					h.OnStorageError = failOpen
				}
				h = provision(t, h)
				a := s.answer(h)
				seen[a.outcome] = true
				code, outcome, nextRan := actOn(t, h, a)

				if mode == modeObserve {
					if a.action == actRun {
						continue // the first request runs as in enforce mode
					}
					if !nextRan || code != http.StatusTeapot || outcome != string(a.outcome) {
						t.Errorf("observe: next ran %v, status %d, outcome %q; want the next handler's 418 and outcome %q", nextRan, code, outcome, a.outcome)
					}
					continue
				}
				switch a.action {
				case actReject:
					if nextRan || code != a.problem.status || outcome != string(a.outcome) {
						t.Errorf("enforce: next ran %v, status %d, outcome %q; want %d and outcome %q", nextRan, code, outcome, a.problem.status, a.outcome)
					}
					// A full store cannot tell when room returns: it says
					// nothing; an unknown outcome never clears by waiting.
					if code != http.StatusBadRequest && code != http.StatusRequestEntityTooLarge && code != http.StatusUnprocessableEntity &&
						a.problem != problemStoreFull && a.problem != problemOutcomeUnknown && a.retryAfter == "" {
						t.Errorf("enforce: a %d without Retry-After", code)
					}
					if a.problem == problemOutcomeUnknown && (a.retryAfter != "" || a.problem.retryable()) {
						t.Errorf("enforce: the outcome-unknown answer invites a retry (Retry-After %q, retryable %v)", a.retryAfter, a.problem.retryable())
					}
				case actPass, actRun:
					if !nextRan || outcome != string(a.outcome) {
						t.Errorf("enforce: next ran %v, outcome %q; want the next handler and outcome %q", nextRan, outcome, a.outcome)
					}
				case actReplay:
					if nextRan || code != http.StatusCreated || outcome != string(a.outcome) {
						t.Errorf("enforce: next ran %v, status %d, outcome %q; want the recorded 201 and outcome %q", nextRan, code, outcome, a.outcome)
					}
				case actFail:
					if nextRan || code != http.StatusInternalServerError {
						t.Errorf("enforce: next ran %v, status %d; want the error handed to Caddy", nextRan, code)
					}
				}
			}
		})
	}
	for _, o := range outcomes {
		if !seen[o] {
			t.Errorf("outcome %q has no row in the answer table", o)
		}
	}
}

// actOn acts on a in h's mode for a request with a fresh key, and
// returns the status, the outcome placeholder and whether the next
// handler ran.
func actOn(t *testing.T, h *Handler, a answer) (code int, outcome string, nextRan bool) {
	t.Helper()
	w := httptest.NewRecorder()
	repl := caddy.NewReplacer()
	r := caddyhttp.PrepareRequest(request("answer-"+hashHex(t.Name() + h.Mode)[:16], `{}`), repl, w, nil)
	k, ref := h.keyRequest(new(keyedRequest), r, repl)
	if ref != nil {
		t.Fatalf("keying the test request: %+v", ref)
	}
	defer k.done()
	x := exchange{h: h, w: w, r: r, repl: repl, k: k}
	x.next = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		nextRan = true
		w.WriteHeader(http.StatusTeapot)
		return nil
	})
	switch a.action {
	case actRun:
		res, err := h.rawStore().Reserve(t.Context(), k.key, k.fp, time.Minute)
		if err != nil || res.Outcome != storage.Acquired {
			t.Fatalf("reserving the test key: %v %v", res.Outcome, err)
		}
		x.res = res
	case actReplay, actReject:
		x.res = storage.Reservation{Record: &storage.Record{State: storage.Completed, Response: &storage.Response{Status: http.StatusCreated}}}
	}
	err := h.policy.mode.carryOut(&x, a)
	if err != nil {
		var he caddyhttp.HandlerError
		if errors.As(err, &he) {
			w.WriteHeader(he.StatusCode)
		} else {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}
	outcome, _ = repl.GetString(placeholderOutcome)
	return w.Code, strings.TrimSpace(outcome), nextRan
}

// TestEveryRefusalHasItsRow: each reason keyed.go gives for a request it
// cannot key is a row of the answer table, not the unknown refusal's
// error.
func TestEveryRefusalHasItsRow(t *testing.T) {
	h := provision(t, &Handler{KeyJSON: "/id"})
	for why := noKey; why <= bodyNotJSON; why++ {
		a := h.policy.refusalAnswer(&refusal{why: why, err: errors.New("e")})
		if a.action == actFail && why != bodyUnreadable {
			t.Errorf("refusal %d: no row of its own (%v)", why, a.err)
		}
	}
}

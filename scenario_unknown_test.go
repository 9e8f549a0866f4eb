package idempotency

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// keyOf is the store key h gives r.
func (h *Handler) keyOf(t *testing.T, r *http.Request) storage.Key {
	t.Helper()
	repl := caddy.NewReplacer()
	r = caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), nil)
	k, ref := h.keyRequest(new(keyedRequest), r, repl)
	if ref != nil {
		t.Fatalf("keying the test request: %+v", ref)
	}
	defer k.done()
	return k.key
}

// With replay_cache, an outcome-unknown record is cached as any completed
// record, answered the same from the cache, and dropped from it by the
// release (on the instance that releases it).
func TestAnUnknownOutcomeFromTheReplayCacheAndItsRelease(t *testing.T) {
	sharedBackends(t).run(func(t *testing.T, b *testStore) {
		h := b.handlerWith(t, &Handler{}, `"replay_cache":{"max_entries":100,"ttl":"1m"}`)
		fail := true
		up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
			if fail {
				return caddyhttp.Error(http.StatusBadGateway, errors.New("read tcp: connection reset by peer"))
			}
			w.WriteHeader(http.StatusCreated)
			return nil
		}}
		serve(h, up, request("cached", "{}"))
		fail = false
		for i := range 3 { // the first from the store, the others from the cache
			if w := serve(h, up, request("cached", "{}")); w.Code != http.StatusBadGateway || problemOf(t, w).Type != problemOutcomeUnknown.typeURI() {
				t.Fatalf("retry %d: %d, want the outcome-unknown 502", i+1, w.Code)
			}
		}
		code, body := adminCall(t, http.MethodDelete, "/idempotency/outcome_unknown?key_hash="+h.keyOf(t, request("cached", "{}")).Hash())
		if code != http.StatusOK {
			t.Fatalf("release: %d %v", code, body)
		}
		if w := serve(h, up, request("cached", "{}")); w.Code != http.StatusCreated || up.Calls.Load() != 2 {
			t.Fatalf("after the release: %d, %d runs; want it run, not the cached record", w.Code, up.Calls.Load())
		}
	})
}

// Only the lease's owner writes the outcome-unknown record: a request
// whose lease was taken over (its record deleted, the key taken by
// another) never overwrites the new owner's record; its write is fenced.
func TestAnUnknownOutcomeNeverOverwritesATakenOverKey(t *testing.T) {
	backends(t).run(func(t *testing.T, b *testStore) {
		h := b.handler(t, &Handler{})
		started, proceed := make(chan struct{}), make(chan struct{})
		var calls atomic.Int64
		up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
			if calls.Add(1) == 1 {
				close(started)
				<-proceed
				return errors.New("read tcp: connection reset by peer")
			}
			w.WriteHeader(http.StatusCreated)
			return nil
		}}
		first := make(chan int)
		go func() { first <- serve(h, up, request("k", "{}")).Code }()
		<-started
		key := h.keyOf(t, request("k", "{}"))
		if err := h.rawStore().Delete(t.Context(), key); err != nil {
			t.Fatalf("delete: %v", err)
		}
		if w := serve(h, up, request("k", "{}")); w.Code != http.StatusCreated {
			t.Fatalf("the taker: %d", w.Code)
		}
		close(proceed)
		<-first
		if w := serve(h, up, request("k", "{}")); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("after the first's failure: %d replayed=%q; want the taker's record replayed", w.Code, w.Header().Get("Idempotent-Replayed"))
		}
	})
}

// An unknown outcome is counted (caddy_http_idempotency_unknown_outcomes_total,
// by action) and logged at WARN with its key hash and the failure, so
// that operators find the keys; its retries count as outcome_unknown.
func TestAnUnknownOutcomeIsCountedAndLogged(t *testing.T) {
	for _, action := range []string{unknownOutcomeKeep, unknownOutcomeRelease} {
		t.Run(action, func(t *testing.T) {
			core, logs := observer.New(zapcore.DebugLevel)
			h := isolated(t, &Handler{OnUnknownOutcome: action})
			h.logger = zap.New(core)
			h.useStore(h.rawStore())
			m := serverMetricsNamed(unknownServer)
			counter := m.unknownKept
			if action == unknownOutcomeRelease {
				counter = m.unknownReleased
			}
			before, retriesBefore := counterValue(counter), testCounter(outcomeUnknown)
			fail := true
			up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
				if fail {
					fail = false
					return caddyhttp.Error(http.StatusGatewayTimeout, timeoutError{})
				}
				w.WriteHeader(http.StatusCreated)
				return nil
			}}
			kh := h.keyOf(t, request("counted", "{}")).Hash()
			serve(h, up, request("counted", "{}"))
			serve(h, up, request("counted", "{}"))
			if got := counterValue(counter) - before; got != 1 {
				t.Fatalf("unknown_outcomes_total{action=%q} rose by %v, want 1", map[string]string{unknownOutcomeKeep: "kept", unknownOutcomeRelease: "released"}[action], got)
			}
			lines := logs.FilterLevelExact(zapcore.WarnLevel).FilterMessageSnippet("outcome is unknown").FilterField(zap.String("key_hash", kh)).All()
			if len(lines) != 1 || lines[0].ContextMap()["failure"] == nil {
				t.Fatalf("%d WARN lines of the unknown outcome with key_hash %s and the failure: %v", len(lines), kh, logs.All())
			}
			wantRetries := 1.0
			if action == unknownOutcomeRelease {
				wantRetries = 0 // the retry ran
			}
			if got := testCounter(outcomeUnknown) - retriesBefore; got != wantRetries {
				t.Fatalf("requests_total{outcome=outcome_unknown} rose by %v, want %v", got, wantRetries)
			}
		})
	}
}

// Observe mode keeps the outcome-unknown record in its own namespace and
// classifies the retries as outcome_unknown, but hands every request on
// as if it were absent: the retry runs.
func TestObserveModeClassifiesTheRetriesOfAnUnknownOutcome(t *testing.T) {
	h := isolated(t, &Handler{Mode: modeObserve})
	before := testObserved(outcomeUnknown)
	fail := true
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		if fail {
			fail = false
			return caddyhttp.Error(http.StatusBadGateway, errors.New("read: connection reset by peer"))
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	}}
	serve(h, up, request("observed", "{}"))
	if w := serve(h, up, request("observed", "{}")); w.Code != http.StatusCreated || up.Calls.Load() != 2 {
		t.Fatalf("observe mode: the retry got %d after %d runs; want it run", w.Code, up.Calls.Load())
	}
	if got := testObserved(outcomeUnknown) - before; got != 1 {
		t.Fatalf("observed_total{outcome=outcome_unknown} rose by %v, want 1", got)
	}
}

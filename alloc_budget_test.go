//go:build !race

// The race detector changes allocation counts (its sync.Pool drops a
// share of what is put back), so the budgets hold in a run without it:
// make test's unit part runs this test again without -race.

package idempotency

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Allocation budgets of the handler's own work per request through
// ServeHTTP on the memory store (issue 42): what a request costs over
// building it (benchRequest and its writer, measured alike and
// subtracted). The next handler's allocations count too (nopNext: the
// upstream's header and body, as reverse_proxy's would). A change that
// adds an allocation on one of these paths fails the test; one that
// takes some away should lower its budget. docs/performance.md,
// "Allocation budgets", keeps the figures.
//
// The targets are 12 for a 409 and a 422. Of their budgets, 8
// are Caddy's {http.request.uuid} (the problem's instance: the uuid, its
// string, and its access-log field), which the contract requires; the
// handler's own share is 9 and 12 (docs/performance.md).
const (
	budgetReplay   = 12 // a memory replay (target 12)
	budgetNewKey   = 24 // a new key: reserve, run the next handler (its trace: 3), record (target 24)
	budgetConflict = 17 // a 409: the key is in flight, in_flight reject (target 12: 9 own, 8 the request id)
	budgetMismatch = 20 // a 422: the key was used for another body (target 12: 12 own, 8 the request id)
)

// budgetRuns is how many requests each count is averaged over. The
// average is rounded down, so that a rare allocation (a pool refilled
// after a garbage collection, a store's map growing) does not count.
const budgetRuns = 500

func TestAllocationBudget(t *testing.T) {
	body := benchJSON()
	next := nopNext()
	t.Run("replay", func(t *testing.T) {
		h := benchHandler(t)
		serveStatus(t, h, "replayed", body, next, http.StatusCreated)
		checkBudget(t, budgetReplay, func() []byte { return body }, h, fixedKey("replayed"), next, http.StatusCreated)
	})
	t.Run("new key", func(t *testing.T) {
		h := benchHandler(t)
		checkBudget(t, budgetNewKey, func() []byte { return body }, h, freshKeys("new"), next, http.StatusCreated)
	})
	t.Run("conflict", func(t *testing.T) {
		h := benchHandler(t, func(h *Handler) { h.InFlight = inFlightReject })
		entered, release := make(chan struct{}), make(chan struct{})
		held := make(chan error, 1)
		go func() {
			w := newBenchWriter()
			held <- h.ServeHTTP(w, benchRequest("held", body, w), caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				close(entered)
				<-release
				return next.ServeHTTP(w, r)
			}))
		}()
		<-entered
		checkBudget(t, budgetConflict, func() []byte { return body }, h, fixedKey("held"), next, http.StatusConflict)
		close(release)
		if err := <-held; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("mismatch", func(t *testing.T) {
		h := benchHandler(t)
		serveStatus(t, h, "reused", body, next, http.StatusCreated)
		other := append([]byte(`{"amount":7,`), body[1:]...)
		checkBudget(t, budgetMismatch, func() []byte { return other }, h, fixedKey("reused"), next, http.StatusUnprocessableEntity)
	})
}

// fixedKey sends every request with key.
func fixedKey(key string) func(int) string { return func(int) string { return key } }

// freshKeys gives every request a key of its own, made before the count.
func freshKeys(prefix string) func(int) string {
	keys := make([]string, budgetRuns+2) // AllocsPerRun runs once more to warm up
	for i := range keys {
		keys[i] = prefix + "-" + strconv.Itoa(i)
	}
	return func(i int) string { return keys[i] }
}

// serveStatus serves one request and fails t unless it is answered
// with want.
func serveStatus(t *testing.T, h *Handler, key string, body []byte, next caddyhttp.Handler, want int) {
	t.Helper()
	w := newBenchWriter()
	if err := h.ServeHTTP(w, benchRequest(key, body, w), next); err != nil || w.status != want {
		t.Fatalf("status %d, error %v; want %d", w.status, err, want)
	}
}

// checkBudget fails t when a request answered with want costs more than
// budget allocations of the handler's own: those of building the request
// and its writer are counted alike, and subtracted.
func checkBudget(t *testing.T, budget float64, body func() []byte, h *Handler, key func(int) string, next caddyhttp.Handler, want int) {
	t.Helper()
	setup := testing.AllocsPerRun(budgetRuns, func() {
		w := newBenchWriter()
		_ = benchRequest(key(0), body(), w)
	})
	i, wrong := 0, 0
	total := testing.AllocsPerRun(budgetRuns, func() {
		w := newBenchWriter()
		err := h.ServeHTTP(w, benchRequest(key(i), body(), w), next)
		if err != nil || w.status != want {
			wrong++
		}
		i++
	})
	if wrong > 0 {
		t.Fatalf("%d of %d requests were not answered %d", wrong, i, want)
	}
	own := total - setup
	t.Logf("%v allocations per request (%v in all, %v building it); budget %v", own, total, setup, budget)
	if own > budget {
		t.Errorf("%v allocations per request, over the budget of %v: profile with go test -run '^$' -bench ... -memprofile, and cut the new one (or, if it is needed, raise the budget and say why in docs/performance.md)", own, budget)
	}
}

package idempotency

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/backend/backendtest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// provision provisions and validates h as Caddy would; its context is
// cancelled (cleaning up the storage module) when the test ends.
func provision(t testing.TB, h *Handler) *Handler {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		t.Fatalf("provision: %v", err)
	}
	if err := h.Validate(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	h.logger = zap.NewNop() // keep test output readable; handler_observability_test.go observes them
	return h
}

// nextMaxKeys makes memory stores of their own: handlers share a memory
// store per max_keys, so a unique max_keys keeps tests apart.
var nextMaxKeys atomic.Int64

// isolated returns a handler on a memory store of its own.
func isolated(t testing.TB, h *Handler) *Handler {
	t.Helper()
	h.StorageRaw = json.RawMessage(`{"backend":"memory","max_keys":` + strconv.FormatInt(900_000_000+nextMaxKeys.Add(1), 10) + `}`)
	return provision(t, h)
}

// upstream is a next handler that counts its executions.
type upstream = backendtest.Upstream

// holdInFlight serves r on h in the background, held in flight until
// release (backendtest.HoldInFlight).
func holdInFlight(h *Handler, r *http.Request) (up *upstream, release func(), done <-chan *httptest.ResponseRecorder) {
	return backendtest.HoldInFlight(h, r)
}

// request builds a POST with a key (none when key is "").
func request(key, body string) *http.Request { return backendtest.Request(key, body) }

// serve runs one request through h in a Caddy-prepared request context.
func serve(h *Handler, next caddyhttp.Handler, r *http.Request) *httptest.ResponseRecorder {
	return backendtest.Serve(h, next, r)
}

// serveAborting runs serveTo for a client that does not get the whole
// answer, and returns what the handler panicked with: http.ErrAbortHandler
// when it aborts the client's side, as it must.
func serveAborting(h *Handler, next caddyhttp.Handler, w http.ResponseWriter, r *http.Request) (panicked any) {
	defer func() { panicked = recover() }()
	serveTo(h, next, w, r)
	return nil
}

func serveTo(h *Handler, next caddyhttp.Handler, w http.ResponseWriter, r *http.Request) error {
	return backendtest.ServeTo(h, next, w, r, caddy.NewReplacer())
}

// servePlaceholders runs one request and returns the replacer too.
func servePlaceholders(h *Handler, next caddyhttp.Handler, r *http.Request) (*httptest.ResponseRecorder, *caddy.Replacer) {
	w := httptest.NewRecorder()
	repl := caddy.NewReplacer()
	r = caddyhttp.PrepareRequest(r, repl, w, nil)
	_ = h.ServeHTTP(w, r, next)
	return w, repl
}

// problemOf decodes a problem response, failing the test if it is not one.
func problemOf(t *testing.T, w *httptest.ResponseRecorder) problemBody {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json (status %d, body %q)", ct, w.Code, w.Body.String())
	}
	var p problemBody
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body.String(), err)
	}
	if p.Status != w.Code {
		t.Fatalf("problem status %d != response status %d", p.Status, w.Code)
	}
	return p
}

// records counts what a handler's memory store holds.
func records(h *Handler) int {
	return h.rawStore().(interface{ Len() int }).Len()
}

// useStore puts store under h in place of its backend's, as Provision
// would have: h's keeper observes it, and aftercare writes to it.
func (h *Handler) useStore(store storage.Store) {
	h.keeper = newKeeper(keeperOptions{store: instrument(store, h.backendName, h.keeper.store.holder), lockTimeout: time.Duration(h.policy.lockTimeout), ttl: time.Duration(h.policy.ttl), logger: h.logger})
	h.keeper.runShort = h.policy.failOpen
}

// rawStore is the store h's requests talk to, unobserved (nil before
// Provision took one).
func (h *Handler) rawStore() storage.Store {
	if h.keeper == nil {
		return nil
	}
	return h.keeper.store.store
}

package backendtest

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The handler side of the kit: the idempotency handler provisioned by
// its module ID from JSON, as Caddy loads it, and requests served
// through it. The kit does not import the handler's package (the
// handler imports the built-in backends, whose tests import the kit):
// a test that provisions handlers imports the handler for its
// registration, as a Caddy build does.

// HandlerModule is the idempotency handler's Caddy module ID.
const HandlerModule = "http.handlers.idempotency"

// Handler is the idempotency handler decoded from config (its JSON
// members, with the storage object under "storage"), provisioned and
// validated in a Caddy context cleaned up when the test ends.
func Handler(t testing.TB, config map[string]any) caddyhttp.MiddlewareHandler {
	t.Helper()
	info, err := caddy.GetModule(HandlerModule)
	if err != nil {
		t.Fatalf("%v: import github.com/caddy-idempotency/caddy-idempotency for its registration", err)
	}
	raw, err := json.Marshal(config)
	if err != nil {
		t.Fatal(err)
	}
	m := info.New()
	if err := caddy.StrictUnmarshalJSON(raw, m); err != nil {
		t.Fatalf("decoding %s: %v", raw, err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
	t.Cleanup(cancel)
	if err := m.(caddy.Provisioner).Provision(ctx); err != nil {
		t.Fatalf("provision %s: %v", raw, err)
	}
	if err := m.(caddy.Validator).Validate(); err != nil {
		t.Fatalf("validate %s: %v", raw, err)
	}
	return m.(caddyhttp.MiddlewareHandler)
}

// Config is the handler config of a namespace as Caddy instance pool
// would have it (0: the first), with the handler's own members merged
// from options (`"in_flight":"wait"`) and the storage object's from
// storage (`"replay_cache":{"max_entries":100}`).
func (n *Namespace) Config(t testing.TB, pool int, options, storage string) map[string]any {
	t.Helper()
	st := n.Storage(pool)
	maps.Copy(st, members(t, storage))
	cfg := members(t, options)
	cfg["storage"] = st
	return cfg
}

// members decodes the members of a JSON object written without braces.
func members(t testing.TB, s string) map[string]any {
	t.Helper()
	m := map[string]any{}
	if err := json.Unmarshal([]byte("{"+s+"}"), &m); err != nil {
		t.Fatalf("options %s: %v", s, err)
	}
	return m
}

// Upstream is a next handler that counts its executions; without Serve
// it answers 201 with a JSON order.
type Upstream struct {
	Calls atomic.Int64
	Serve func(w http.ResponseWriter, r *http.Request) error
}

// ServeHTTP implements caddyhttp.Handler.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	u.Calls.Add(1)
	if u.Serve != nil {
		return u.Serve(w, r)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Order", "42")
	w.WriteHeader(http.StatusCreated)
	_, err := io.WriteString(w, `{"order":42}`)
	return err
}

// SlowUpstream answers 201 with a body after a pause, so that concurrent
// requests overlap the first one.
func SlowUpstream(pause time.Duration) *Upstream {
	return &Upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		time.Sleep(pause)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, err := w.Write([]byte(`{"id":"ord_1"}`))
		return err
	}}
}

// Request builds a POST with a key (none when key is "").
func Request(key, body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "http://example.com/orders", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	return r
}

// Serve runs one request through h in a Caddy-prepared request context.
func Serve(h caddyhttp.MiddlewareHandler, next caddyhttp.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	ServeTo(h, next, w, r, caddy.NewReplacer())
	return w
}

// ServeTo runs one request through h into w with the replacer repl (whose
// placeholders the handler sets), and answers a returned error as
// Caddy's server would: with its status.
func ServeTo(h caddyhttp.MiddlewareHandler, next caddyhttp.Handler, w http.ResponseWriter, r *http.Request, repl *caddy.Replacer) error {
	r = caddyhttp.PrepareRequest(r, repl, w, nil)
	err := h.ServeHTTP(w, r, next)
	if err != nil {
		if he, ok := err.(caddyhttp.HandlerError); ok {
			w.WriteHeader(he.StatusCode)
		} else {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}
	return err
}

// HoldInFlight serves r on h in the background through an upstream that
// stops until release is called, and returns once that upstream runs: a
// request held in flight for as long as a test needs. Released, the
// upstream answers 201; done then yields the response.
func HoldInFlight(h caddyhttp.MiddlewareHandler, r *http.Request) (up *Upstream, release func(), done <-chan *httptest.ResponseRecorder) {
	started, proceed := make(chan struct{}), make(chan struct{})
	up = &Upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		close(started)
		<-proceed
		w.WriteHeader(http.StatusCreated)
		return nil
	}}
	responses := make(chan *httptest.ResponseRecorder, 1)
	go func() { responses <- Serve(h, up, r) }()
	<-started
	return up, func() { close(proceed) }, responses
}

// Snapshot is a response as a client got it.
type Snapshot struct {
	Code   int
	Header http.Header
	Body   []byte
}

// Fire sends n identical requests at once and returns their responses.
func Fire(h caddyhttp.MiddlewareHandler, up *Upstream, n int, key, body string) []*Snapshot {
	return Alternate(h, h, up, n, key, body)
}

// Alternate sends n identical requests at once, alternating between x
// and y, and returns their responses.
func Alternate(x, y caddyhttp.MiddlewareHandler, up *Upstream, n int, key, body string) []*Snapshot {
	var wg sync.WaitGroup
	start := make(chan struct{})
	out := make([]*Snapshot, n)
	for i := range n {
		h := x
		if i%2 == 1 {
			h = y
		}
		wg.Go(func() {
			<-start
			w := Serve(h, up, Request(key, body))
			out[i] = &Snapshot{Code: w.Code, Header: w.Header(), Body: w.Body.Bytes()}
		})
	}
	close(start)
	wg.Wait()
	return out
}

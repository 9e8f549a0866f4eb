package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The next handler panicked or failed: this file is the home of these
// tests of the handler (execute and finish in handler.go). The same
// failures through Caddy's own reverse_proxy are in inprocess/panic_test.go,
// and through real processes in e2e/failure_paths_test.go.

// servePanicking serves r and reports the value the handler panicked
// with, nil if it did not.
func servePanicking(h *Handler, next caddyhttp.Handler, r *http.Request) (w *httptest.ResponseRecorder, panicked any) {
	w = httptest.NewRecorder()
	defer func() { panicked = recover() }()
	serveTo(h, next, w, r)
	return w, nil
}

func TestPanicAfterTheStatusRecordsItWithoutTheBody(t *testing.T) {
	for _, value := range []any{http.ErrAbortHandler, errors.New("boom")} {
		h := isolated(t, &Handler{})
		up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set("X-Order", "42")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"partial`))
			panic(value)
		}}
		if _, p := servePanicking(h, up, request("k", "{}")); p != value {
			t.Fatalf("the panic %v did not go on (got %v)", value, p)
		}
		w := serve(h, up, request("k", "{}"))
		if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" ||
			w.Header().Get(bodyOmittedHeader) != "true" || w.Header().Get("X-Order") != "42" || w.Body.Len() != 0 {
			t.Fatalf("retry after a panic with %v: %d %v %q, want the recorded 201 without its body", value, w.Code, w.Header(), w.Body.String())
		}
		if n := up.Calls.Load(); n != 1 {
			t.Fatalf("upstream ran %d times, want 1", n)
		}
	}
}

func TestErrorAfterTheStatusRecordsItWithoutTheBody(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusOK)
		return errors.New("upstream broke off")
	}}
	serve(h, up, request("k", "{}"))
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusOK || w.Header().Get(bodyOmittedHeader) != "true" {
		t.Fatalf("retry: %d %v", w.Code, w.Header())
	}
	if n := up.Calls.Load(); n != 1 {
		t.Fatalf("upstream ran %d times, want 1", n)
	}
}

// A panic before any status, of any value, leaves the outcome unknown:
// the handler cannot tell what the panicking code did. The key is kept,
// and the retry gets the outcome-unknown problem without running.
func TestPanicBeforeTheStatusLeavesTheOutcomeUnknown(t *testing.T) {
	for i, value := range []any{http.ErrAbortHandler, errors.New("boom")} {
		h := isolated(t, &Handler{})
		key := fmt.Sprint("k", i)
		up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error { panic(value) }}
		if _, p := servePanicking(h, up, request(key, "{}")); p != value {
			t.Fatalf("the panic %v did not go on (got %v)", value, p)
		}
		up.Serve = nil
		w := serve(h, up, request(key, "{}"))
		if p := problemOf(t, w); w.Code != http.StatusBadGateway || p.Type != problemOutcomeUnknown.typeURI() || p.Retryable {
			t.Fatalf("retry after a panic with %v: %d %+v, want the outcome-unknown 502, not retryable", value, w.Code, p)
		}
		if n := up.Calls.Load(); n != 1 {
			t.Fatalf("the next handler ran %d times, want 1", n)
		}
	}
}

// dialError is what reverse_proxy returns when it could not connect to
// the upstream (its transport wraps the dial's error in
// reverseproxy.DialError, and statusError makes it a 502). The same
// through a real reverse_proxy and a refused port is in
// inprocess/unknown_outcome_test.go.
func dialError() error {
	return caddyhttp.Error(http.StatusBadGateway, reverseproxy.NewDialError(errors.New("dial tcp 127.0.0.1:9: connect: connection refused")))
}

// A failure before any status that provably sent nothing frees the key:
// the retry runs. Every other error of the next handler before a status
// leaves the outcome unknown.
func TestAFailureBeforeTheStatusFreesTheKeyOnlyWhenNothingWasSent(t *testing.T) {
	for _, tt := range []struct {
		name  string
		err   error
		frees bool
	}{
		{"a dial error", dialError(), true},
		{"no upstream available", caddyhttp.Error(http.StatusServiceUnavailable, errors.New(errNoUpstreamText)), true},
		{"a refusal of the handler's own (4xx)", caddyhttp.Error(http.StatusUnauthorized, errors.New("not authenticated")), true},
		{"a response-header timeout", caddyhttp.Error(http.StatusGatewayTimeout, timeoutError{}), false},
		{"a reset after the request was sent", caddyhttp.Error(http.StatusBadGateway, errors.New("read tcp: connection reset by peer")), false},
		{"a deadline", fmt.Errorf("waiting: %w", context.DeadlineExceeded), false},
		{"a 4xx handler error past a deadline", caddyhttp.Error(http.StatusRequestTimeout, context.DeadlineExceeded), false},
		{"a client closed request (499)", caddyhttp.Error(499, context.Canceled), false},
		{"an error of a handler that is not a proxy", errors.New("something failed"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := isolated(t, &Handler{})
			fail := true
			up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
				if fail {
					return tt.err
				}
				w.WriteHeader(http.StatusCreated)
				return nil
			}}
			if w := serve(h, up, request("k", "{}")); w.Code < 400 {
				t.Fatalf("first: %d, want the error's status", w.Code)
			}
			fail = false
			w := serve(h, up, request("k", "{}"))
			if tt.frees {
				if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" || up.Calls.Load() != 2 {
					t.Fatalf("retry: %d, %d runs; want it run (201)", w.Code, up.Calls.Load())
				}
				return
			}
			if p := problemOf(t, w); w.Code != http.StatusBadGateway || p.Type != problemOutcomeUnknown.typeURI() || up.Calls.Load() != 1 {
				t.Fatalf("retry: %d %+v, %d runs; want the outcome-unknown 502 and 1 run", w.Code, p, up.Calls.Load())
			}
		})
	}
}

// timeoutError is a net.Error that timed out, as net/http's "timeout
// awaiting response headers" is.
type timeoutError struct{}

func (timeoutError) Error() string   { return "net/http: timeout awaiting response headers" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// goneClient is a ResponseWriter whose client has hung up.
type goneClient struct{ *httptest.ResponseRecorder }

func (goneClient) Write([]byte) (int, error) { return 0, errors.New("write: broken pipe") }

// A client that hung up changes nothing for the upstream or the record;
// its own answer, cut short, is aborted (panic(http.ErrAbortHandler): net/http
// closes the connection, resets the stream) rather than ended as if whole.
func TestClientHangUpNeverStopsTheHandler(t *testing.T) {
	for _, size := range []int{100, 64 << 10} { // within and over max_response_size
		h := isolated(t, &Handler{MaxResponseSize: 1024})
		body := strings.Repeat("x", size)
		var writeErr error
		up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(http.StatusCreated)
			for i := 0; i < len(body) && writeErr == nil; i += 100 {
				_, writeErr = w.Write([]byte(body[i:min(i+100, len(body))]))
			}
			return writeErr
		}}
		w := goneClient{httptest.NewRecorder()}
		if panicked := serveAborting(h, up, w, request("k", "{}")); panicked != http.ErrAbortHandler {
			t.Fatalf("%d bytes: the handler ended with %v, want the abort of a response cut short", size, panicked)
		}
		if writeErr != nil {
			t.Fatalf("%d bytes: the handler saw the client's error: %v", size, writeErr)
		}
		r := serve(h, up, request("k", "{}"))
		if r.Code != http.StatusCreated || r.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%d bytes: retry %d, want the replayed 201", size, r.Code)
		}
		if omitted := r.Header().Get(bodyOmittedHeader) == "true"; omitted != (size > 1024) || (!omitted && r.Body.String() != body) {
			t.Fatalf("%d bytes: body omitted=%v, body %d bytes", size, omitted, r.Body.Len())
		}
		if n := up.Calls.Load(); n != 1 {
			t.Fatalf("%d bytes: upstream ran %d times, want 1", size, n)
		}
	}
}

// withOuterHeaders is a handler outside h that sets headers for the
// current request, as `header` ordered before idempotency does.
func serveWithOuterHeaders(h *Handler, next caddyhttp.Handler, r *http.Request, outer http.Header) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	for k, v := range outer {
		w.Header()[k] = v
	}
	serveTo(h, next, w, r)
	return w
}

func testCounter(o outcome) float64 {
	return counterValue(serverMetricsNamed(unknownServer).byOutcome[o])
}

func testObserved(o outcome) float64 {
	return counterValue(serverMetricsNamed(unknownServer).observedByOutcome[o])
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// A dial error frees the key: the retry runs and gets the upstream's
// answer.
func TestADialErrorFreesTheKey(t *testing.T) {
	h := isolated(t, &Handler{})
	fail := true
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		if fail {
			return dialError()
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	}}
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusBadGateway {
		t.Fatalf("first: %d", w.Code)
	}
	fail = false
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after a dial error must run: %d", w.Code)
	}
}

// on_unknown_outcome release frees the key of an unknown outcome, as
// every failure before a status did before: the retry runs.
func TestOnUnknownOutcomeReleaseFreesTheKey(t *testing.T) {
	h := isolated(t, &Handler{OnUnknownOutcome: unknownOutcomeRelease})
	panics := true
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		if panics {
			panic("boom")
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	}}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic must go on to Caddy's recovery")
			}
		}()
		serve(h, up, request("k", "{}"))
	}()
	panics = false
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after a panic must run with on_unknown_outcome release: %d", w.Code)
	}
}

func TestErrorAfterResponseStartedStillCountsAsDone(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":`))
		return errors.New("upstream reset mid-body")
	}}
	serve(h, up, request("k", "{}"))
	w := serve(h, up, request("k", "{}"))
	if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Body-Omitted") != "true" || w.Body.Len() != 0 {
		t.Fatalf("retry: %d omitted=%q body=%q; want the status replayed without the partial body",
			w.Code, w.Header().Get("Idempotent-Body-Omitted"), w.Body.String())
	}
	if up.Calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.Calls.Load())
	}
}

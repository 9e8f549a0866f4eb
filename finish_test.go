package idempotency

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

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
		up := &upstream{serve: func(w http.ResponseWriter, r *http.Request) error {
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
		if n := up.calls.Load(); n != 1 {
			t.Fatalf("upstream ran %d times, want 1", n)
		}
	}
}

func TestErrorAfterTheStatusRecordsItWithoutTheBody(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{serve: func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusOK)
		return errors.New("upstream broke off")
	}}
	serve(h, up, request("k", "{}"))
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusOK || w.Header().Get(bodyOmittedHeader) != "true" {
		t.Fatalf("retry: %d %v", w.Code, w.Header())
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream ran %d times, want 1", n)
	}
}

func TestPanicOrErrorBeforeTheStatusFreesTheKey(t *testing.T) {
	h := isolated(t, &Handler{})
	fail := func(w http.ResponseWriter, r *http.Request) error { panic(http.ErrAbortHandler) }
	up := &upstream{serve: func(w http.ResponseWriter, r *http.Request) error { return fail(w, r) }}
	servePanicking(h, up, request("k", "{}"))
	fail = func(http.ResponseWriter, *http.Request) error {
		return caddyhttp.Error(http.StatusBadGateway, errors.New("dial"))
	}
	serve(h, up, request("k", "{}"))
	up.serve = nil
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("third try: %d replayed=%q, want a run", w.Code, w.Header().Get("Idempotent-Replayed"))
	}
	if n := up.calls.Load(); n != 3 {
		t.Fatalf("upstream ran %d times, want 3", n)
	}
}

// goneClient is a ResponseWriter whose client has hung up.
type goneClient struct{ *httptest.ResponseRecorder }

func (goneClient) Write([]byte) (int, error) { return 0, errors.New("write: broken pipe") }

func TestClientHangUpNeverStopsTheHandler(t *testing.T) {
	for _, size := range []int{100, 64 << 10} { // within and over max_response_size
		h := isolated(t, &Handler{MaxResponseSize: 1024})
		body := strings.Repeat("x", size)
		var writeErr error
		up := &upstream{serve: func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(http.StatusCreated)
			for i := 0; i < len(body) && writeErr == nil; i += 100 {
				_, writeErr = w.Write([]byte(body[i:min(i+100, len(body))]))
			}
			return writeErr
		}}
		w := goneClient{httptest.NewRecorder()}
		serveTo(h, up, w, request("k", "{}"))
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
		if n := up.calls.Load(); n != 1 {
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

func TestReplayKeepsTheHeadersOuterHandlersSet(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{serve: func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("X-Order", "42")
		// reverse_proxy adds the upstream's headers to those already set.
		w.Header().Add("Access-Control-Allow-Origin", "*")
		w.WriteHeader(http.StatusCreated)
		return nil
	}}
	first := serveWithOuterHeaders(h, up, request("k", "{}"), http.Header{
		"Access-Control-Allow-Origin": {"https://a.example"},
		"X-Request-Id":                {"one"},
	})
	if first.Header().Get("X-Order") != "42" {
		t.Fatalf("first: %v", first.Header())
	}
	retry := serveWithOuterHeaders(h, up, request("k", "{}"), http.Header{
		"Access-Control-Allow-Origin": {"https://b.example"},
		"X-Request-Id":                {"two"},
	})
	hdr := retry.Header()
	// The first answer had the outer handler's value and the upstream's
	// after it: so has the replay, with the current request's outer value.
	if got := hdr.Values("Access-Control-Allow-Origin"); !slices.Equal(got, []string{"https://b.example", "*"}) {
		t.Errorf("replay Access-Control-Allow-Origin = %q, want the current request's, then the upstream's", got)
	}
	if got := hdr.Values("X-Request-Id"); len(got) != 1 || got[0] != "two" {
		t.Errorf("replay X-Request-Id = %q, want the current request's", got)
	}
	if hdr.Get("X-Order") != "42" || hdr.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay lost the recorded headers: %v", hdr)
	}
	// A retry whose outer handlers set nothing gets what the inner ones
	// set, and nothing the first request's outer handlers set.
	bare := serve(h, up, request("k", "{}")).Header()
	if got := bare.Values("Access-Control-Allow-Origin"); len(got) != 1 || got[0] != "*" {
		t.Errorf("bare replay Access-Control-Allow-Origin = %q, want the upstream's [*]", got)
	}
	if got := bare.Values("X-Request-Id"); len(got) != 0 {
		t.Errorf("bare replay X-Request-Id = %q, want none: the first request's outer handlers set it", got)
	}
}

func TestNestedRequiredAppliesWhenTheOuterHandlerPassedTheRequestOn(t *testing.T) {
	outer := isolated(t, &Handler{})
	inner := isolated(t, &Handler{Required: true})
	up := &upstream{}
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return inner.ServeHTTP(w, r, up)
	})
	w, repl := servePlaceholders(outer, next, request("", "{}"))
	if w.Code != http.StatusBadRequest || up.calls.Load() != 0 {
		t.Fatalf("keyless POST on the inner required route: %d, upstream ran %d times; want 400 and 0", w.Code, up.calls.Load())
	}
	if o, _ := repl.GetString(placeholderOutcome); o != string(outcomeMissing) {
		t.Errorf("outcome %q, want missing", o)
	}
	// Once the outer handler has taken a key, the inner one passes through.
	if w := serve(outer, next, request("k", "{}")); w.Code != http.StatusCreated {
		t.Fatalf("keyed POST: %d", w.Code)
	}
	if w := serve(outer, next, request("k", "{}")); w.Header().Get("Idempotent-Replayed") != "true" || up.calls.Load() != 1 {
		t.Fatalf("retry: %d, upstream ran %d times", w.Code, up.calls.Load())
	}
	if records(inner) != 0 {
		t.Errorf("the inner handler stored %d records for a key the outer one took", records(inner))
	}
}

func TestPassedIsCountedOnceThroughNestedHandlers(t *testing.T) {
	outer := isolated(t, &Handler{})
	inner := isolated(t, &Handler{})
	up := &upstream{}
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return inner.ServeHTTP(w, r, up)
	})
	initMetrics()
	before := testCounter(outcomePassed)
	_, repl := servePlaceholders(outer, next, request("", "{}"))
	if o, _ := repl.GetString(placeholderOutcome); o != string(outcomePassed) {
		t.Errorf("outcome %q, want passed", o)
	}
	if got := testCounter(outcomePassed) - before; got != 1 {
		t.Errorf("passed counted %v times, want 1", got)
	}
}

func testCounter(o outcome) float64 { return counterValue(metrics.byOutcome[o]) }

func testObserved(o outcome) float64 { return counterValue(metrics.observedByOutcome[o]) }

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

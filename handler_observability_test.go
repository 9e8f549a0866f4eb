package idempotency

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// What inprocess/observability_test.go cannot see from outside Caddy: the in-flight
// gauge while a request is held, the handler's own log entries, and its
// spans (the request's, and a child span per store call).

func TestInFlightGaugeRisesWhileARequestRuns(t *testing.T) {
	h := isolated(t, &Handler{})
	before := gaugeValue(t)
	_, release, done := holdInFlight(h, request("k", "{}"))
	if got := gaugeValue(t) - before; got != 1 {
		t.Errorf("in_flight rose by %v while a request ran, want 1", got)
	}
	release()
	<-done
	if got := gaugeValue(t) - before; got != 0 {
		t.Errorf("in_flight is %v above where it started after the request, want 0", got)
	}
}

func gaugeValue(t *testing.T) float64 {
	t.Helper()
	initMetrics()
	var m dto.Metric
	if err := serverMetricsNamed(unknownServer).inFlight.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func TestLogsCarryKeyHashButNoSecrets(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	h := isolated(t, &Handler{Required: true})
	h.logger = zap.New(core)
	up := &upstream{}
	secret := "Bearer sk_live_very_secret_token"
	for _, r := range []*http.Request{request("log-key", `{}`), request("log-key", `{}`), request("log-key", `{"x":1}`), request("", "{}")} {
		r.Header.Set("Authorization", secret)
		serve(h, up, r)
	}
	withStore := isolated(t, &Handler{})
	withStore.logger = zap.New(core)
	withFlakyStore(withStore).down.Store(true)
	r := request("log-key", `{}`)
	r.Header.Set("Authorization", secret)
	serve(withStore, up, r)

	if logs.Len() == 0 {
		t.Fatal("nothing was logged at debug level")
	}
	sawHash, sawStoreError := false, false
	for _, e := range logs.All() {
		line, _ := json.Marshal(e.ContextMap())
		text := e.Message + string(line)
		if strings.Contains(text, "sk_live") || strings.Contains(text, "log-key") {
			t.Errorf("log entry leaks a credential or the key: %s", text)
		}
		if e.ContextMap()["key_hash"] != nil {
			sawHash = true
		}
		if e.Level == zapcore.ErrorLevel && strings.Contains(e.Message, "store unavailable") {
			sawStoreError = true
		}
	}
	if !sawHash || !sawStoreError {
		t.Errorf("want key_hash fields and a store error entry; got %d entries", logs.Len())
	}
}

// TestAccessLogFieldsOnlyForAServerThatLogs: the outcome and key hash go
// to the request's extra log fields when its server writes an access log
// (or when there is no server to ask), and not when it writes none.
func TestAccessLogFieldsOnlyForAServerThatLogs(t *testing.T) {
	h := isolated(t, &Handler{})
	for name, c := range map[string]struct {
		srv  *caddyhttp.Server
		want int
	}{
		"no access log":     {&caddyhttp.Server{}, 0},
		"an access log":     {&caddyhttp.Server{Logs: &caddyhttp.ServerLogConfig{}}, 1},
		"no server to know": {nil, 1},
	} {
		t.Run(name, func(t *testing.T) {
			w := httptest.NewRecorder()
			r := caddyhttp.PrepareRequest(request("logged-"+strings.ReplaceAll(name, " ", "-"), `{}`), caddy.NewReplacer(), w, c.srv)
			if err := h.ServeHTTP(w, r, &upstream{}); err != nil || w.Code != http.StatusCreated {
				t.Fatalf("status %d, error %v", w.Code, err)
			}
			extra := r.Context().Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields)
			if got := reflect.ValueOf(extra).Elem().FieldByName("fields").Len(); got != c.want {
				t.Fatalf("%d extra log fields, want %d", got, c.want)
			}
		})
	}
}

// TestKeyHashPlaceholderIsAStringAnExpressionReads:
// {http.idempotency.key_hash} is set for other directives, and Caddy's
// CEL expression matcher reads a placeholder's value as it is: a value
// that only prints as the hash (a Stringer) fails the match with an
// error.
func TestKeyHashPlaceholderIsAStringAnExpressionReads(t *testing.T) {
	h := isolated(t, &Handler{})
	ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
	defer cancel()
	m := &caddyhttp.MatchExpression{Expr: `{http.idempotency.key_hash}.size() == 16`}
	if err := m.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	var matched bool
	var matchErr error
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		matched, matchErr = m.MatchWithError(r)
		w.WriteHeader(http.StatusCreated)
		return nil
	}}
	serve(h, up, request("cel-key", `{}`))
	if matchErr != nil || !matched {
		t.Fatalf("an expression on the key hash: matched %v, error %v", matched, matchErr)
	}
}

// tracedServe serves r inside a span of a recording tracer provider, as
// Caddy's tracing handler would, and returns the spans that ended.
func tracedServe(t *testing.T, h *Handler, r *http.Request) []sdktrace.ReadOnlySpan {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("caddy").Start(r.Context(), "POST /orders")
	serve(h, &upstream{}, r.WithContext(ctx))
	span.End()
	return rec.Ended()
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value.String()
	}
	return m
}

func TestTracedRequestsCarryTheOutcomeAndAChildSpanPerStoreCall(t *testing.T) {
	h := isolated(t, &Handler{})
	spans := tracedServe(t, h, request("traced", "{}"))
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = s
	}
	req := byName["POST /orders"]
	if req == nil {
		t.Fatalf("no request span among %d", len(spans))
	}
	a := attrs(req)
	if a["idempotency.outcome"] != "new" || a["idempotency.backend"] != "memory" || len(a["idempotency.key_hash"]) != 16 {
		t.Errorf("request span attributes %v", a)
	}
	for _, op := range []string{"idempotency.reserve", "idempotency.complete"} {
		s := byName[op]
		if s == nil {
			t.Errorf("no %s span", op)
			continue
		}
		if s.Parent().SpanID() != req.SpanContext().SpanID() {
			t.Errorf("%s is not a child of the request span", op)
		}
		if s.EndTime().Before(s.StartTime()) || attrs(s)["idempotency.backend"] != "memory" {
			t.Errorf("%s: times %v..%v, attributes %v", op, s.StartTime(), s.EndTime(), attrs(s))
		}
	}

	// A replay: its span gets an event with the record's creation time.
	spans = tracedServe(t, h, request("traced", "{}"))
	for _, s := range spans {
		if s.Name() != "POST /orders" {
			continue
		}
		if attrs(s)["idempotency.outcome"] != "replayed" {
			t.Errorf("replay span attributes %v", attrs(s))
		}
		events := s.Events()
		if len(events) != 1 || events[0].Name != "idempotency.replay" || len(events[0].Attributes) != 1 ||
			events[0].Attributes[0].Key != "idempotency.record.created_at" {
			t.Errorf("replay span events %+v", events)
		}
	}
}

func TestStoreErrorsMarkTheirSpan(t *testing.T) {
	h := isolated(t, &Handler{})
	withFlakyStore(h).down.Store(true)
	spans := tracedServe(t, h, request("down", "{}"))
	for _, s := range spans {
		if s.Name() == "idempotency.reserve" {
			if s.Status().Code.String() != "Error" || len(s.Events()) == 0 {
				t.Errorf("reserve span of a failing store: status %v, events %v", s.Status(), s.Events())
			}
			return
		}
	}
	t.Fatal("no reserve span")
}

func TestUntracedRequestsMakeNoSpans(t *testing.T) {
	h := isolated(t, &Handler{})
	if n := testing.AllocsPerRun(50, func() { startStoreSpan(context.Background(), "reserve", "memory") }); n != 0 {
		t.Errorf("a store call of an untraced request allocates %v times for tracing", n)
	}
	if w := serve(h, &upstream{}, request("untraced", "{}")); w.Code != http.StatusCreated {
		t.Fatalf("untraced request: %d", w.Code)
	}
}

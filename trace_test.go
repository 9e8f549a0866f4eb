package idempotency

import (
	"context"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

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

package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// With Caddy's tracing directive on, the request's context carries a
// recording span (OpenTelemetry, which Caddy links already): the handler
// adds its outcome to it and makes a child span of each store call.
// Without tracing the span is a no-op and every function here returns at
// once.

// tracerName names the spans this module starts.
const tracerName = "github.com/caddy-idempotency/caddy-idempotency"

// traceOutcome adds the outcome, key hash and backend to the request's
// span.
func traceOutcome(ctx context.Context, o outcome, repl *caddy.Replacer, backend string, m *modeTraits) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{
		attribute.String(m.span, string(o)),
		attribute.String("idempotency.backend", backend),
	}
	if kh, ok := repl.GetString(m.keyHash); ok && kh != "" {
		attrs = append(attrs, attribute.String("idempotency.key_hash", kh))
	}
	span.SetAttributes(attrs...)
}

// traceReplay records on the request's span that the answer is a replay of
// the record created at rec.CreatedAt.
func traceReplay(ctx context.Context, rec *storage.Record) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.AddEvent("idempotency.replay", trace.WithAttributes(
		attribute.String("idempotency.record.created_at", rec.CreatedAt.UTC().Format(time.RFC3339Nano))))
}

// startStoreSpan starts a child span of ctx's span for the store
// operation op; nil when the request is not traced.
func startStoreSpan(ctx context.Context, op, backend string) trace.Span {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return nil
	}
	_, span := parent.TracerProvider().Tracer(tracerName).Start(ctx, "idempotency."+op,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("idempotency.backend", backend)))
	return span
}

// endStoreSpan ends a span of startStoreSpan with the operation's error.
// Outcomes callers branch on (a lost lease, no record) are not errors.
func endStoreSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil && !errors.Is(err, storage.ErrLeaseLost) && !errors.Is(err, storage.ErrNotFound) {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

package idempotency

import (
	"net/http"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestProblemsSayWhetherToRetry: a client may send the same request with
// the same key again after a 409, 429 or 503, never after a 400, 413 or
// 422 (it must change the request or the key first).
func TestProblemsSayWhetherToRetry(t *testing.T) {
	for _, p := range []problem{problemKeyMissing, problemKeyInvalid, problemConflict, problemMismatch,
		problemBodyNotJSON, problemTooLarge, problemTooManyKeys, problemStoreDown, problemStoreFull} {
		want := p.status == http.StatusConflict || p.status == http.StatusTooManyRequests || p.status == http.StatusServiceUnavailable
		if p.retryable() != want {
			t.Errorf("%s (%d): retryable %v, want %v", p.slug, p.status, p.retryable(), want)
		}
	}
}

// TestAProblemCarriesTheRequestIDOfItsLogLine: a rejection's problem
// names the request in instance (urn:uuid: and Caddy's request id, the
// uuid of its access log line), and the module's log line for it carries
// the same id; retryable is in every problem.
func TestAProblemCarriesTheRequestIDOfItsLogLine(t *testing.T) {
	h := isolated(t, &Handler{})
	core, logs := observer.New(zapcore.DebugLevel)
	h.logger = zap.New(core)
	h.useStore(h.rawStore())
	withFlakyStore(h).down.Store(true)

	w, repl := servePlaceholders(h, &upstream{}, request("traced", "{}"))
	p := problemOf(t, w)
	id, _ := repl.GetString("http.request.uuid")
	if w.Code != http.StatusServiceUnavailable || !p.Retryable {
		t.Fatalf("%d retryable %v, want a retryable 503", w.Code, p.Retryable)
	}
	if id == "" || p.Instance != "urn:uuid:"+id {
		t.Fatalf("instance %q, want urn:uuid: and the request's id %q", p.Instance, id)
	}
	lines := logs.FilterMessageSnippet("rejecting the request").FilterField(zap.String("request_id", id)).Len()
	if lines != 1 {
		t.Fatalf("%d log lines for the rejection carry request_id %s, want 1: %v", lines, id, logs.All())
	}

	// A 400 says not to retry as it is, and names its request too.
	w, repl = servePlaceholders(h, &upstream{}, request("bad key, list", "{}"))
	p = problemOf(t, w)
	id, _ = repl.GetString("http.request.uuid")
	if w.Code != http.StatusBadRequest || p.Retryable || !strings.HasSuffix(p.Instance, id) {
		t.Fatalf("%d retryable %v instance %q", w.Code, p.Retryable, p.Instance)
	}
}

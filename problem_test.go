package idempotency

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestProblemsSayWhetherToRetry: a client may send the same request with
// the same key again after a 409, 429 or 503, never after a 400, 413,
// 415, 422 or the outcome-unknown 502 (it must change the request or the
// key first).
func TestProblemsSayWhetherToRetry(t *testing.T) {
	for _, p := range []problem{problemKeyMissing, problemKeyInvalid, problemScopeEmpty, problemConflict, problemMismatch,
		problemBodyNotJSON, problemBodyNotDecoded, problemBodyCodingUnsupported, problemTooLarge, problemTooManyKeys,
		problemStoreDown, problemStoreFull, problemOutcomeUnknown} {
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

// TestProblemJSONIsMarshals: a problem's body is, byte for byte, what
// json.Marshal writes for its problemBody, over every member and strings
// of every kind (quotes, control characters, HTML's characters, U+2028,
// invalid UTF-8, a member name a client chose).
func TestProblemJSONIsMarshals(t *testing.T) {
	pieces := []string{"", "a", "amount", `"`, `\`, "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", "\x7f", "<", ">", "&",
		"\u2028", "\u2029", "é", "\U0001F600", "\xff", "\xe2\x80", "/a~1b", " ", "urn:x"}
	rng := rand.New(rand.NewPCG(42, 42))
	text := func() string {
		var b strings.Builder
		for range rng.IntN(6) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		return b.String()
	}
	for i := range 20000 {
		p := problem{status: 400 + rng.IntN(200), title: text(), typ: text()}
		if i < 13 {
			p = []problem{problemKeyMissing, problemKeyInvalid, problemScopeEmpty, problemConflict, problemMismatch,
				problemBodyNotJSON, problemBodyNotDecoded, problemBodyCodingUnsupported, problemTooLarge, problemTooManyKeys,
				problemStoreDown, problemStoreFull, problemOutcomeUnknown}[i]
		}
		detail, id := text(), text()
		var differs []string
		for range rng.IntN(4) {
			differs = append(differs, text())
		}
		want := problemBody{Type: p.typ, Title: p.title, Status: p.status, Detail: detail, Retryable: p.retryable(), Differs: differs}
		if id != "" {
			want.Instance = "urn:uuid:" + id
		}
		marshalled, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendProblemJSON(nil, p, detail, differs, id); !bytes.Equal(got, marshalled) {
			t.Fatalf("problem %+v, detail %q, differs %q, id %q:\n got %s\nwant %s", p, detail, differs, id, got, marshalled)
		}
	}
}

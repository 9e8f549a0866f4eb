package e2e

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
)

// hostile is an instance on a Redis key prefix of its own, so that the
// test can check that nothing was stored.
type hostile struct {
	inst  *caddyproc.Instance
	up    *caddyproc.Upstream
	store backend
}

func newHostile(t *testing.T, options string) hostile {
	t.Helper()
	store := onRedis(t, sharedRedisAddr(t), "")
	up := newUpstream(t)
	inst := startCaddy(t, "caddy", site{routes: route(up, store.storage+"\n"+options)})
	return hostile{inst, up, store}
}

// addr is the instance's host:port, for raw connections.
func (h hostile) addr() string { return fmt.Sprintf("127.0.0.1:%d", h.inst.Port) }

// nothingRan fails unless the upstream never ran and the store is empty.
func (h hostile) nothingRan(t *testing.T) {
	t.Helper()
	if n := h.up.Total(); n != 0 {
		t.Fatalf("the upstream ran %d times", n)
	}
	if n := h.store.records(t); n != 0 {
		t.Fatalf("the store holds %d records", n)
	}
}

// stillServes checks that the instance answers a well-formed request.
func (h hostile) stillServes(t *testing.T) {
	t.Helper()
	key := "still-serving-" + fmt.Sprint(time.Now().UnixNano())
	if r := post(h.inst.URL(), "/orders", key, `{"ok":true}`); !r.isNew() {
		t.Fatalf("a well-formed request afterwards: %s", r)
	}
	assertExecutions(t, h.up, key, 1)
}

// rawPost is a POST of body with the given header lines (each without
// CRLF), written byte for byte.
func rawPost(headerLines []string, body string) []byte {
	var b strings.Builder
	b.WriteString("POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n")
	fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	for _, l := range headerLines {
		b.WriteString(l + "\r\n")
	}
	b.WriteString("\r\n" + body)
	return []byte(b.String())
}

func keyLines(values ...string) []string {
	lines := make([]string, len(values))
	for i, v := range values {
		lines[i] = "Idempotency-Key: " + v
	}
	return lines
}

func repeat(v string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = v
	}
	return out
}

const (
	keyInvalid = "urn:caddy-idempotency:key-invalid"
	scopeEmpty = "urn:caddy-idempotency:scope-empty"
)

func TestMalformedKeysGet400AndNothingRunsOrIsStored(t *testing.T) {
	h := newHostile(t, "")
	long := strings.Repeat("k", 10_000)
	tests := []struct {
		name  string
		lines []string
		// byGo: net/http refuses the header itself (control bytes other
		// than HTAB), before Caddy's handlers see the request: a plain 400.
		byGo bool
	}{
		{"control byte 0x01", keyLines("ab\x01cd"), true},
		{"NUL byte", keyLines("ab\x00cd"), true},
		{"DEL byte", keyLines("ab\x7fcd"), true},
		{"escape sequence", keyLines("\x1b[31mred"), true},
		{"tab inside", keyLines("ab\tcd"), false},
		{"non-UTF-8 bytes", keyLines("ab\xff\xfecd"), false},
		{"UTF-8 non-ASCII", keyLines("clé-é"), false},
		{"space inside", keyLines("ab cd"), false},
		{"empty", keyLines(""), false},
		{"10k-byte bare key", keyLines(long), false},
		{"10k-byte quoted key", keyLines(`"` + long + `"`), false},
		{"100 identical lines", keyLines(repeat("k1", 100)...), false},
		{"100 different lines", keyLines(func() []string {
			v := make([]string, 100)
			for i := range v {
				v[i] = fmt.Sprintf("k%d", i)
			}
			return v
		}()...), false},
		{"two lines", keyLines("k1", "k2"), false},
		{"bare list", keyLines("k1, k2"), false},
		{"bare list without space", keyLines("k1,k2"), false},
		{"sf-string list", keyLines(`"k1", "k2"`), false},
		{"unterminated string", keyLines(`"k1`), false},
		{"bad escape in string", keyLines(`"k\n1"`), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := raw(t, h.addr(), rawPost(tt.lines, `{"amount":10}`))
			if r.err != nil || r.status != 400 {
				t.Fatalf("got %s, want 400", r)
			}
			if !tt.byGo {
				if r.problem() != keyInvalid {
					t.Fatalf("got %s, want a %s problem", r, keyInvalid)
				}
				if len(r.body) > 400 {
					t.Fatalf("the problem is %d bytes long: it must not echo the key", len(r.body))
				}
			}
			h.nothingRan(t)
		})
	}
	h.stillServes(t)
}

const tooLarge = "urn:caddy-idempotency:body-too-large"

// Bodies over max_body_size (1MiB by default) get 413 without reaching the
// upstream, whether declared by Content-Length or streamed chunked.
func TestOversizeBodiesGet413AndNothingRunsOrIsStored(t *testing.T) {
	h := newHostile(t, "")
	head := "POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nIdempotency-Key: big\r\nConnection: close\r\n"

	t.Run("declared by Content-Length", func(t *testing.T) {
		req := head + "Content-Length: 10485760\r\n\r\n" + strings.Repeat("x", 64<<10)
		if r := raw(t, h.addr(), []byte(req)); r.status != 413 || r.problem() != tooLarge {
			t.Fatalf("got %s, want 413 %s", r, tooLarge)
		}
		h.nothingRan(t)
	})
	t.Run("declared, with Expect: 100-continue", func(t *testing.T) {
		// The answer comes before any body is sent: no 100 Continue.
		req := head + "Content-Length: 10485760\r\nExpect: 100-continue\r\n\r\n"
		if r := raw(t, h.addr(), []byte(req)); r.status != 413 || r.problem() != tooLarge {
			t.Fatalf("got %s, want 413 %s", r, tooLarge)
		}
		h.nothingRan(t)
	})
	t.Run("chunked", func(t *testing.T) {
		conn, err := net.Dial("tcp", h.addr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := conn.Write([]byte(head + "Transfer-Encoding: chunked\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		// Stream 64KiB chunks until the server answers or stops reading.
		go func() {
			chunk := fmt.Sprintf("%x\r\n%s\r\n", 64<<10, strings.Repeat("x", 64<<10))
			for range 64 { // 4MiB at most
				if _, err := conn.Write([]byte(chunk)); err != nil {
					return
				}
			}
		}()
		if r := readReply(conn); r.status != 413 || r.problem() != tooLarge {
			t.Fatalf("got %s, want 413 %s", r, tooLarge)
		}
		h.nothingRan(t)
	})
	h.stillServes(t)
}

// slowPost sends a POST with key whose body trickles in 2 bytes every
// 100ms, and returns the reply once the server answers. sent is closed
// when the last byte has gone.
func slowPost(t *testing.T, addr, key, body string, sent chan<- struct{}) reply {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Error(err)
		return reply{err: err}
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	head := fmt.Sprintf("POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", key, len(body))
	if _, err := conn.Write([]byte(head)); err != nil {
		return reply{err: err}
	}
	for i := 0; i < len(body); i += 2 {
		time.Sleep(100 * time.Millisecond)
		if _, err := conn.Write([]byte(body[i:min(i+2, len(body))])); err != nil {
			return reply{err: err}
		}
	}
	close(sent)
	return readReply(conn)
}

// A client that sends its body slowly, for longer than lock_timeout, holds
// no lease while it does: the body is read whole before the key is
// reserved. A retry sent meanwhile runs (the key is free) and the slow
// request, once its body is in, gets the retry's response: one execution.
func TestSlowBodyHoldsNoLeaseAndTheUpstreamRunsOnce(t *testing.T) {
	h := newHostile(t, "lock_timeout "+lockTimeout.String())
	body := `{"amount":10,"note":"` + strings.Repeat("s", 24) + `"}` // 2.4s at 2 bytes per 100ms

	t.Run("alone", func(t *testing.T) {
		sent := make(chan struct{})
		done := make(chan reply, 1)
		go func() { done <- slowPost(t, h.addr(), "slow-alone", body, sent) }()
		time.Sleep(lockTimeout + 500*time.Millisecond)
		select {
		case <-sent:
			t.Fatal("the body was sent too fast to test anything")
		default:
		}
		assertExecutions(t, h.up, "slow-alone", 0)
		if n := h.store.records(t); n != 0 {
			t.Fatalf("%d records while the body is still being read, want none", n)
		}
		r := <-done
		if !r.isNew() || r.execution() != 1 || !strings.Contains(string(r.body), fmt.Sprintf(`"request_bytes":%d`, len(body))) {
			t.Fatalf("slow request: %s, want it to run with its whole body", r)
		}
		assertExecutions(t, h.up, "slow-alone", 1)
	})

	t.Run("with a retry while it sends", func(t *testing.T) {
		sent := make(chan struct{})
		done := make(chan reply, 1)
		go func() { done <- slowPost(t, h.addr(), "slow-raced", body, sent) }()
		time.Sleep(lockTimeout + 500*time.Millisecond)
		fast := post(h.inst.URL(), "/orders", "slow-raced", body)
		select {
		case <-sent:
			t.Fatal("the body was sent too fast to test anything")
		default:
		}
		if !fast.isNew() || fast.execution() != 1 {
			t.Fatalf("retry while the first body trickles in: %s, want it to run (nothing holds the key)", fast)
		}
		if r := <-done; !r.isReplayOf(1) {
			t.Fatalf("slow request once its body is in: %s, want the retry's response replayed", r)
		}
		assertExecutions(t, h.up, "slow-raced", 1)
	})
	h.stillServes(t)
}

const notJSON = "urn:caddy-idempotency:body-invalid-json"

func TestInvalidJSONGets400AndNothingRunsOrIsStored(t *testing.T) {
	h := newHostile(t, "")
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "application/vnd.api+json"} {
		for _, body := range []string{`{"amount":`, `{"amount":10,}`, `{'amount':10}`, "{\"a\":\"\xff\"}x", `[1,2`} {
			if r := post(h.inst.URL(), "/orders", "bad-json", body, "Content-Type", ct); r.status != 400 || r.problem() != notJSON {
				t.Fatalf("%s %q: %s, want 400 %s", ct, body, r, notJSON)
			}
		}
	}
	h.nothingRan(t)
	// Nothing was stored: the key is still free for a valid request.
	if r := post(h.inst.URL(), "/orders", "bad-json", `{"amount":10}`); !r.isNew() {
		t.Fatalf("the key after the refused requests: %s, want it to run", r)
	}
	// A body that does not claim to be JSON is compared byte for byte.
	if r := post(h.inst.URL(), "/orders", "plain", `{"amount":`, "Content-Type", "text/plain"); !r.isNew() {
		t.Fatalf("non-JSON body declared as text: %s, want it to run", r)
	}
	assertExecutions(t, h.up, "bad-json", 1)
	assertExecutions(t, h.up, "plain", 1)
}

// Deep nesting never crashes the server: beyond encoding/json's 10000
// levels the body is not valid JSON (400); beyond the canonicaliser's
// 1000 levels, valid JSON is compared byte for byte.
func TestDeeplyNestedJSONNeverCrashes(t *testing.T) {
	h := newHostile(t, "")
	nested := func(depth int, inner string) string {
		return strings.Repeat("[", depth) + inner + strings.Repeat("]", depth)
	}

	for i, tt := range []struct{ name, body string }{
		{"100k arrays", nested(100_000, "1")},
		{"100k unclosed arrays", strings.Repeat("[", 100_000)},
		{"100k objects", strings.Repeat(`{"a":`, 100_000) + "1" + strings.Repeat("}", 100_000)},
	} {
		if r := post(h.inst.URL(), "/orders", fmt.Sprintf("too-deep-%d", i), tt.body); r.status != 400 || r.problem() != notJSON {
			t.Fatalf("%s: %s, want 400 %s", tt.name, r, notJSON)
		}
	}
	h.nothingRan(t)

	deep := nested(2000, "1")
	if r := post(h.inst.URL(), "/orders", "deep-2000", deep); !r.isNew() {
		t.Fatalf("2000 levels: %s, want it to run", r)
	}
	if r := post(h.inst.URL(), "/orders", "deep-2000", deep); !r.isReplayOf(1) {
		t.Fatalf("2000 levels, same bytes: %s, want a replay", r)
	}
	if r := post(h.inst.URL(), "/orders", "deep-2000", nested(2000, " 1 ")); r.status != 422 {
		t.Fatalf("2000 levels, other whitespace: %s, want 422 (compared byte for byte)", r)
	}
	// Shallow JSON is compared by meaning: the same whitespace change replays.
	if r := post(h.inst.URL(), "/orders", "shallow", nested(10, "1")); !r.isNew() {
		t.Fatal(r)
	}
	if r := post(h.inst.URL(), "/orders", "shallow", nested(10, " 1 ")); !r.isReplayOf(1) {
		t.Fatalf("10 levels, other whitespace: %s, want a replay", r)
	}
	assertExecutions(t, h.up, "deep-2000", 1)
	assertExecutions(t, h.up, "shallow", 1)
	h.stillServes(t)
}

// Numbers are compared exactly, never through float64, where
// 12345678901234567890 and 12345678901234567891 are the same double.
func TestLargeNumbersAreComparedExactly(t *testing.T) {
	h := newHostile(t, "")
	u := h.inst.URL()
	if r := post(u, "/orders", "big-int", `{"n":12345678901234567890}`); !r.isNew() {
		t.Fatal(r)
	}
	if r := post(u, "/orders", "big-int", `{"n":12345678901234567891}`); r.status != 422 {
		t.Fatalf("a number one larger: %s, want 422", r)
	}
	for _, same := range []string{`{"n":1.2345678901234567890e19}`, `{ "n" : 12345678901234567890.000 }`, `{"n":1234567890123456789e1}`} {
		if r := post(u, "/orders", "big-int", same); !r.isReplayOf(1) {
			t.Fatalf("the same number spelled %s: %s, want a replay", same, r)
		}
	}

	huge := strings.Repeat("9", 10_000)
	if r := post(u, "/orders", "huge-int", `{"n":`+huge+`}`); !r.isNew() {
		t.Fatalf("10k-digit number: %s, want it to run", r)
	}
	if r := post(u, "/orders", "huge-int", `{"n":`+huge+`}`); !r.isReplayOf(1) {
		t.Fatalf("10k-digit number again: %s, want a replay", r)
	}
	if r := post(u, "/orders", "huge-int", `{"n":`+huge[:9_999]+`8}`); r.status != 422 {
		t.Fatalf("10k-digit number, last digit changed: %s, want 422", r)
	}
	if r := post(u, "/orders", "huge-exp", `{"n":1e1000000000000}`); r.status >= 500 || r.err != nil {
		t.Fatalf("a number with a huge exponent: %s, want no server error", r)
	}
	assertExecutions(t, h.up, "big-int", 1)
	assertExecutions(t, h.up, "huge-int", 1)
	h.stillServes(t)
}

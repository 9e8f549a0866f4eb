package idempotency

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
)

func TestBodyIsHandedOnUnchanged(t *testing.T) {
	h := isolated(t, &Handler{})
	body := `{ "b": 2, "a": [1, 2.50, "x\u0041"] }`
	var got []byte
	var gotLen int64
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		got, _ = io.ReadAll(r.Body)
		gotLen = r.ContentLength
		w.WriteHeader(http.StatusCreated)
		return nil
	}}
	serve(h, up, request("k", body))
	if string(got) != body || gotLen != int64(len(body)) {
		t.Fatalf("upstream got %q (Content-Length %d), want %q", got, gotLen, body)
	}
}

func TestOversizeBodyIsRejectedWithoutRunning(t *testing.T) {
	h := isolated(t, &Handler{MaxBodySize: 16})
	up := &upstream{}
	big := strings.Repeat("x", 17)

	declared := request("k", big) // Content-Length known up front
	w := serve(h, up, declared)
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("declared length: %d, want 413", w.Code)
	}
	if p := problemOf(t, w); p.Type != "urn:caddy-idempotency:body-too-large" {
		t.Fatalf("problem %+v", p)
	}

	chunked := request("k", "")
	chunked.Body = io.NopCloser(iotest.HalfReader(strings.NewReader(big)))
	chunked.ContentLength = -1
	if w := serve(h, up, chunked); w.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("unknown length: %d, want 413", w.Code)
	}
	if up.Calls.Load() != 0 {
		t.Fatalf("upstream ran %d times for oversize bodies", up.Calls.Load())
	}
	if n := records(h); n != 0 {
		t.Fatalf("oversize bodies left %d records", n)
	}
	atLimit := request("k", strings.Repeat("x", 16))
	atLimit.Header.Set("Content-Type", "text/plain")
	if w := serve(h, up, atLimit); w.Code != http.StatusCreated {
		t.Fatalf("body at the limit: %d, want 201", w.Code)
	}
}

func TestBodyReadErrorIsAClientError(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{}
	r := request("k", "")
	r.Body = io.NopCloser(iotest.ErrReader(io.ErrUnexpectedEOF))
	r.ContentLength = -1
	err := serveTo(h, up, httptestRecorder(), r)
	if err == nil || up.Calls.Load() != 0 {
		t.Fatalf("err %v, calls %d; want an error and no call", err, up.Calls.Load())
	}
}

func TestExpectContinueIsNotForwarded(t *testing.T) {
	h := isolated(t, &Handler{})
	var expect string
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		expect = r.Header.Get("Expect")
		return nil
	}}
	r := request("k", "{}")
	r.Header.Set("Expect", "100-continue")
	serve(h, up, r)
	if expect != "" {
		t.Fatalf("upstream got Expect %q after the body was read", expect)
	}
}

func TestUpstreamIsAskedForIdentityEncoding(t *testing.T) {
	h := isolated(t, &Handler{})
	var ae string
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		ae = r.Header.Get("Accept-Encoding")
		return nil
	}}
	r := request("k", "{}")
	r.Header.Set("Accept-Encoding", "gzip, br")
	serve(h, up, r)
	if ae != "identity" {
		t.Fatalf("upstream got Accept-Encoding %q; stored bodies must not be encoded", ae)
	}
}

func TestBufferedBodyCloseIsSafeAndFinal(t *testing.T) {
	r := request("k", "hello")
	b, err := readBody(r, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.Bytes(), []byte("hello")) {
		t.Fatalf("Bytes %q", b.Bytes())
	}
	_ = b.Close()
	_ = b.Close()
	if _, err := r.Body.Read(make([]byte, 1)); err != http.ErrBodyReadAfterClose {
		t.Fatalf("read after close: %v", err)
	}
}

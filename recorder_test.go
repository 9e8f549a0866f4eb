package idempotency

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func httptestRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }

func TestResponseWrittenThroughReadFromIsRecorded(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusCreated)
		// reverse_proxy and file_server copy with io.Copy, which prefers
		// the writer's ReadFrom.
		_, err := io.Copy(w, strings.NewReader("streamed body"))
		return err
	}}
	if w := serve(h, up, request("k", "{}")); w.Body.String() != "streamed body" {
		t.Fatalf("first: %q", w.Body.String())
	}
	if w := serve(h, up, request("k", "{}")); w.Body.String() != "streamed body" || w.Code != http.StatusCreated {
		t.Fatalf("replay: %d %q", w.Code, w.Body.String())
	}
}

func TestOversizeResponseIsStreamedWholeAndReplayedWithoutBody(t *testing.T) {
	h := isolated(t, &Handler{MaxResponseSize: 10})
	body := strings.Repeat("0123456789", 5)
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", "50")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(body[:25]))
		_, err := io.Copy(w, strings.NewReader(body[25:]))
		return err
	}}
	first := serve(h, up, request("k", "{}"))
	if first.Body.String() != body {
		t.Fatalf("first client got %d bytes, want the whole %d", first.Body.Len(), len(body))
	}
	retry := serve(h, up, request("k", "{}"))
	if retry.Code != http.StatusCreated || retry.Body.Len() != 0 {
		t.Fatalf("replay: %d with %d bytes; want 201 and no body", retry.Code, retry.Body.Len())
	}
	if retry.Header().Get("Idempotent-Body-Omitted") != "true" || retry.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay headers %v", retry.Header())
	}
	if retry.Header().Get("Content-Length") != "" || retry.Header().Get("Content-Type") != "text/plain" {
		t.Fatalf("replay must keep headers but not the old Content-Length: %v", retry.Header())
	}
	if up.Calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.Calls.Load())
	}
}

// failingWriter is a client that hung up: every write fails.
type failingWriter struct{ *httptest.ResponseRecorder }

func (f failingWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

func TestClientHangingUpDoesNotLoseTheResponse(t *testing.T) {
	h := isolated(t, &Handler{})
	completed := false
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusCreated)
		for range 3 {
			if _, err := w.Write([]byte("part;")); err != nil {
				return err
			}
		}
		completed = true
		return nil
	}}
	if panicked := serveAborting(h, up, failingWriter{httptest.NewRecorder()}, request("k", "{}")); panicked != http.ErrAbortHandler {
		t.Fatalf("the handler ended with %v, want the abort of a response cut short", panicked)
	}
	if !completed {
		t.Fatal("the upstream response was cut short when the client left")
	}
	w := serve(h, up, request("k", "{}"))
	if w.Body.String() != "part;part;part;" || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %q", w.Code, w.Body.String())
	}
	if up.Calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.Calls.Load())
	}
}

func TestFlushReachesTheClient(t *testing.T) {
	h := isolated(t, &Handler{})
	var flushErr error
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		_, _ = w.Write([]byte("a"))
		flushErr = http.NewResponseController(w).Flush()
		return nil
	}}
	w := serve(h, up, request("k", "{}"))
	if flushErr != nil || !w.Flushed {
		t.Fatalf("flush: err %v, flushed %v", flushErr, w.Flushed)
	}
}

func TestRecordedHeadersAreThoseOfTheFinalResponse(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.Header().Set("X-Final", "yes")
		w.WriteHeader(http.StatusCreated)
		// Outer handlers (encode) change headers after the status is
		// written; that must not leak into the record.
		w.Header().Set("Content-Encoding", "gzip")
		return nil
	}}
	serve(h, up, request("k", "{}"))
	w := serve(h, up, request("k", "{}"))
	if w.Code != http.StatusCreated || w.Header().Get("X-Final") != "yes" {
		t.Fatalf("replay %d %v", w.Code, w.Header())
	}
	if w.Header().Get("Content-Encoding") != "" || w.Header().Get("Link") != "" {
		t.Fatalf("replay carries headers set outside the final response: %v", w.Header())
	}
}

func TestHandlerWritingNothingRecordsEmpty200(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error { return nil }}
	serve(h, up, request("k", "{}"))
	w := serve(h, up, request("k", "{}"))
	if w.Code != http.StatusOK || w.Body.Len() != 0 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay %d %q", w.Code, w.Body.String())
	}
}

// TestABodyAnnouncedOverTheLimitIsNeverBuffered: a response whose
// Content-Length is over max_response_size is omitted from the record as
// soon as its status is written; before, its first max_response_size
// bytes were buffered on the way, then dropped, per request.
func TestABodyAnnouncedOverTheLimitIsNeverBuffered(t *testing.T) {
	rec := newRecorder(httptest.NewRecorder(), 10, false)
	defer rec.unbound()
	rec.Header().Set("Content-Length", "50")
	rec.WriteHeader(http.StatusCreated)
	_, _ = rec.Write([]byte("01234"))
	if _, _, body, omitted := rec.response(); !omitted || body != nil {
		t.Fatalf("after 5 of 50 announced bytes over a limit of 10: omitted %v, %d bytes kept; want omitted, none kept", omitted, len(body))
	}
	small := newRecorder(httptest.NewRecorder(), 10, false)
	defer small.unbound()
	small.Header().Set("Content-Length", "5")
	small.WriteHeader(http.StatusCreated)
	_, _ = small.Write([]byte("01234"))
	if _, _, body, omitted := small.response(); omitted || string(body) != "01234" {
		t.Fatalf("5 announced bytes under a limit of 10: omitted %v, kept %q; want them kept", omitted, body)
	}
}

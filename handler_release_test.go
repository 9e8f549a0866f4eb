package idempotency

import (
	"net/http"
	"testing"
)

func TestServerErrorsFreeTheKey(t *testing.T) {
	h := isolated(t, &Handler{})
	status := http.StatusBadGateway
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(status)
		return nil
	}}
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusBadGateway {
		t.Fatalf("first: %d", w.Code)
	}
	status = http.StatusCreated
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after a 502 must run again: %d", w.Code)
	}
	if w := serve(h, up, request("k", "{}")); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("the 201 was not recorded")
	}
	if up.Calls.Load() != 2 {
		t.Fatalf("upstream ran %d times, want 2", up.Calls.Load())
	}
}

func TestClientErrorsAreRecorded(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusPaymentRequired)
		_, _ = w.Write([]byte("card declined"))
		return nil
	}}
	serve(h, up, request("k", "{}"))
	w := serve(h, up, request("k", "{}"))
	if w.Code != http.StatusPaymentRequired || w.Body.String() != "card declined" || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("4xx not replayed: %d %q", w.Code, w.Body.String())
	}
	if up.Calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.Calls.Load())
	}
}

func TestReleaseOnReplacesTheDefault(t *testing.T) {
	h := isolated(t, &Handler{ReleaseOn: []string{"429", "503"}})
	status := http.StatusTooManyRequests
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(status)
		return nil
	}}
	serve(h, up, request("a", "{}"))
	serve(h, up, request("a", "{}"))
	if up.Calls.Load() != 2 {
		t.Fatalf("429 must free the key: %d calls", up.Calls.Load())
	}
	status = http.StatusInternalServerError // not listed: recorded
	serve(h, up, request("b", "{}"))
	if w := serve(h, up, request("b", "{}")); w.Code != http.StatusInternalServerError || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("500 with release_on 429 503 must be replayed: %d", w.Code)
	}
	if up.Calls.Load() != 3 {
		t.Fatalf("upstream ran %d times, want 3", up.Calls.Load())
	}
}

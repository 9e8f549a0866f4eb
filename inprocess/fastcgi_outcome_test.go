package inprocess_test

import (
	"net"
	"net/http"
	"net/http/fcgi"
	"sync/atomic"
	"testing"
	"time"
)

// fcgiUpstream is a FastCGI application on a socket of its own that
// counts the requests it ran, answering each 201 after delay.
func fcgiUpstream(t *testing.T, delay time.Duration) (string, *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var runs atomic.Int32
	go func() {
		_ = fcgi.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			time.Sleep(delay)
			w.WriteHeader(http.StatusCreated)
		}))
	}()
	return l.Addr().String(), &runs
}

// TestAFastCGIDialErrorAfterASentAttemptKeepsTheKey is a review finding:
// TestADialErrorAfterASentAttemptKeepsTheKey over the fastcgi transport
// (php_fastcgi's). The first attempt reached the application, which ran
// past read_timeout; the retry failed to dial another (fastcgi's
// reverseproxy.NewDialError). The fastcgi transport dials on its own and
// never calls httptrace's GotConn, so nothing said a connection was
// made: the last attempt's dial error freed the key, and the retry ran
// the application again. Now an attempt no trace saw (fewer GetConn
// than attempts) may have sent the request: the outcome is unknown.
func TestAFastCGIDialErrorAfterASentAttemptKeepsTheKey(t *testing.T) {
	app, runs := fcgiUpstream(t, time.Second)
	down := refuser(t)
	// round_robin's first pick is the second upstream, then the first.
	base := loadCaddyfile(t, freePort(t), `
	idempotency {
		`+memoryStorage()+`
	}
	reverse_proxy `+down.Addr+` `+app+` {
		lb_policy round_robin
		lb_retries 1
		lb_retry_match {
			method POST
		}
		transport fastcgi {
			read_timeout 300ms
		}
	}`)
	pay := attempt{key: "pay-fcgi", body: `{"amount":10}`, ctype: "application/json"}
	resp, _, errText := pay.send(t, base)
	if statusOf(resp) != http.StatusBadGateway {
		t.Fatalf("a read timeout, then a refused dial: %d (%s), want 502", statusOf(resp), errText)
	}
	time.Sleep(1200 * time.Millisecond) // the application ends its run
	if n := runs.Load(); n != 1 {
		t.Fatalf("the first attempt: the application ran %d times, want 1", n)
	}
	resp, _, body := pay.send(t, base)
	time.Sleep(1200 * time.Millisecond)
	if n := runs.Load(); n != 1 {
		t.Fatalf("the application ran %d times, want 1", n)
	}
	wantOutcomeUnknown(t, "the retry", resp, body, "")
}

// TestAFastCGIHandleResponseErrorAfterTheAppRanKeepsTheKey is a review
// finding: TestAHandleResponseErrorAfterTheUpstreamRanKeepsTheKey over
// the fastcgi transport. The application ran and answered 201; a
// handle_response route refused that with a client error (error 400).
// The fastcgi transport never calls httptrace's GotConn, so the 400
// looked like a handler that refused the request before doing anything:
// the key was freed and the retry ran the application again.
func TestAFastCGIHandleResponseErrorAfterTheAppRanKeepsTheKey(t *testing.T) {
	app, runs := fcgiUpstream(t, 0)
	base := loadCaddyfile(t, freePort(t), `
	idempotency {
		`+memoryStorage()+`
	}
	reverse_proxy `+app+` {
		transport fastcgi
		@created status 201
		handle_response @created {
			error "refused after the fact" 400
		}
	}`)
	pay := attempt{key: "pay-fcgi-handled", body: `{"amount":10}`, ctype: "application/json"}
	resp, _, errText := pay.send(t, base)
	if statusOf(resp) != http.StatusBadRequest {
		t.Fatalf("a 201 that handle_response turns into an error 400: %d (%s), want 400", statusOf(resp), errText)
	}
	resp, _, body := pay.send(t, base)
	if n := runs.Load(); n != 1 {
		t.Fatalf("the application ran %d times, want 1", n)
	}
	wantOutcomeUnknown(t, "the retry", resp, body, "")
}

// TestAFastCGIFallbackAfterAnUpstreams503KeepsTheKey is a review finding:
// the primary (HTTP, traced) answers 503, in release_on; a handle_response
// route sends the request on to a FastCGI application, which runs it past
// read_timeout. The fastcgi transport dials without httptrace, so one
// connection was seen, the retries placeholder is the fallback's 0 and
// the status placeholder still the primary's 503: the 503 was taken for
// the only request's answer, release_on freed the key, and the retry ran
// the application again. The fallback's own failure (reverse_proxy's
// error) now says the status is not the last request's.
func TestAFastCGIFallbackAfterAnUpstreams503KeepsTheKey(t *testing.T) {
	primary := modelUpstream(t)
	app, runs := fcgiUpstream(t, time.Second)
	base := loadCaddyfile(t, freePort(t), `
	idempotency {
		`+memoryStorage()+`
	}
	reverse_proxy `+primary.Addr+` {
		@down status 503
		handle_response @down {
			reverse_proxy `+app+` {
				transport fastcgi {
					read_timeout 300ms
				}
			}
		}
	}`)
	pay := attempt{key: "pay-fcgi-fallback", do: "s=503"}
	resp, _, errText := pay.send(t, base)
	if statusOf(resp) != http.StatusGatewayTimeout {
		t.Fatalf("the fallback past its read_timeout: %d (%s), want 504", statusOf(resp), errText)
	}
	time.Sleep(1200 * time.Millisecond) // the application ends its run
	resp, _, body := pay.send(t, base)
	time.Sleep(1200 * time.Millisecond) // a retry that ran would have reached it
	if n := runs.Load(); n != 1 {
		t.Fatalf("the application ran %d times for one key, want 1", n)
	}
	wantOutcomeUnknown(t, "the retry", resp, body, "")
}

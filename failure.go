package idempotency

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// A failure of the next handler before any final status leaves its key
// one of two ways. When nothing reached the upstream (a dial error, no
// upstream available), the request provably did nothing: the key is
// freed and the retry runs. When the request was sent, or may have been,
// and no status came back (a response-header timeout, a reset or an EOF
// after the request went out, a deadline, a panic), the upstream may have
// acted: the outcome is unknown, and running the retry could do it twice
// (on_unknown_outcome says what happens then).
//
// The error says which, as Caddy's reverse_proxy reports it: never the
// status number alone (reverse_proxy answers 502 for a refused dial and
// for a reset after the request alike).

// failure is how the next handler ended without a final status it could
// record: the error it returned, or a panic (err nil).
type failure struct {
	err      error
	panicked bool
	// invalid is a final status HTTP cannot send that the next handler
	// (the upstream) answered with; the recorder refused it.
	invalid int
	// connected: a transport of the next handler got a connection to an
	// upstream for the request (httptrace's GotConn, in any of
	// reverse_proxy's attempts); what followed may have reached it,
	// whatever error ended the last attempt.
	connected bool
	// upstreamStatus is the status the upstream answered before a
	// handler after it failed (reverse_proxy's handle_response routes),
	// when exactly one request went to an upstream; 0 otherwise.
	upstreamStatus int
}

// failureOf is how the next handler's err (nil after a panic) ended the
// request: what the recorder saw, how many connections to upstreams its
// transports asked for (gets) and got (conns), and, when it failed, the
// upstream's status, which reverse_proxy leaves in the replacer
// (upstreamStatusKey, cleared before the next handler ran; a request that
// did not fail is spared the lookups).
func failureOf(err error, panicked bool, rec *recorder, gets, conns int, repl *caddy.Replacer) failure {
	f := failure{err: err, panicked: panicked, invalid: rec.invalid, connected: conns > 0}
	if repl == nil || !f.happened() {
		return f
	}
	status, answered := repl.Get(upstreamStatusKey)
	if answered {
		// An upstream answered (reverse_proxy set its status): the
		// request reached it, whatever failed after (a handle_response
		// route's error), though no trace saw the connection (fastcgi's
		// transport dials on its own).
		f.connected = true
	}
	retries, _ := repl.Get(upstreamRetriesKey)
	n, _ := retries.(int)
	if n > 0 && gets < n+1 && !noUpstream(err) {
		// An attempt no trace saw (a transport that dials on its own,
		// as fastcgi's does) may have sent the request before the last
		// one failed to dial. (The last error is "no upstreams
		// available" only when every attempt found none.)
		f.connected = true
	}
	if conns != 1 {
		// With more than one request to upstreams (retries, or a
		// reverse_proxy in a handle_response route sending it on), the
		// status may be an earlier one's, and the last may have gone
		// out after it, unanswered: only a single request's status
		// tells the outcome.
		return f
	}
	if s, ok := status.(int); ok && n == 0 && !proxyFailed(err) {
		f.upstreamStatus = s
	}
	return f
}

// proxyFailed reports whether err is reverse_proxy's own error (made by
// its statusError: the last upstream it tried gave no answer it could
// use) or a transport's: the status in the replacer is then an earlier
// request's (a handle_response route's reverse_proxy that failed after
// its own request went out, over a transport no trace sees, as
// fastcgi's), and says nothing of the last one.
func proxyFailed(err error) bool {
	if he, ok := errors.AsType[caddyhttp.HandlerError](err); ok && strings.HasPrefix(he.Trace, "reverseproxy.") {
		return true
	}
	var ne net.Error
	var dial reverseproxy.DialError
	return errors.As(err, &ne) || errors.As(err, &dial) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// The placeholders in which reverse_proxy leaves the status an upstream
// answered and how many retries it made; the handler clears them before
// the next handler runs, so that they are set only by its requests.
const (
	upstreamStatusKey  = "http.reverse_proxy.status_code"
	upstreamRetriesKey = "http.reverse_proxy.retries"
)

var upstreamKeys = [...]string{upstreamStatusKey, upstreamRetriesKey}

// noUpstream reports whether err is reverse_proxy's "no upstreams
// available".
func noUpstream(err error) bool {
	var he caddyhttp.HandlerError
	return errors.As(err, &he) && he.Err != nil && he.Err.Error() == errNoUpstreamText
}

// happened reports whether the next handler failed at all.
func (f failure) happened() bool { return f.err != nil || f.panicked || f.invalid != 0 }

// String describes the failure for the log.
func (f failure) String() string {
	switch {
	case f.invalid != 0:
		return fmt.Sprintf("the handler answered with status %d, which HTTP cannot send", f.invalid)
	case f.panicked:
		return "the handler panicked"
	case f.err != nil:
		return "the handler failed: " + f.err.Error()
	}
	return ""
}

// errNoUpstreamText is the message of reverse_proxy's errNoUpstream
// (unexported), the error of a request for which no upstream was
// available: it never left Caddy. TestNoUpstreamAvailableFreesTheKey
// (inprocess/unknown_outcome_test.go) runs a real reverse_proxy into it,
// so that a change of the message fails there.
const errNoUpstreamText = "no upstreams available"

// notSent reports whether a failure before any status provably sent
// nothing to the upstream, and why: a dial error (reverseproxy.DialError:
// refused, unreachable, a proxy protocol header that could not be
// written; a transport of another module says the same with
// reverseproxy.NewDialError), no upstream available, a certificate the
// proxy refused during its handshake (before any request byte), or a
// handler that refused the request with a client error (caddyhttp.Error
// with a 4xx: authentication, request_body, a rate limit) before doing
// anything. Anything else may have reached the upstream: a panic, an
// invalid status, a timeout, a reset or an EOF after the request was
// written, an error a handler does not classify, and any error at all
// once a connection to an upstream was made (the last of reverse_proxy's
// retries may fail to dial after an earlier one sent the request; a
// handle_response route may refuse with a 4xx after the upstream acted).
func (f failure) notSent() (bool, string) {
	if f.panicked || f.invalid != 0 || f.err == nil || f.connected {
		return false, ""
	}
	var dial reverseproxy.DialError
	if errors.As(f.err, &dial) {
		return true, "the upstream could not be dialed"
	}
	var cert *tls.CertificateVerificationError
	if errors.As(f.err, &cert) {
		return true, "the upstream's certificate was refused before the request was sent"
	}
	var he caddyhttp.HandlerError
	if errors.As(f.err, &he) {
		if noUpstream(f.err) {
			return true, "no upstream was available"
		}
		// 499 is reverse_proxy's "client closed request", which it may
		// meet after the request was sent.
		if he.StatusCode >= 400 && he.StatusCode < 499 && !errors.Is(f.err, context.DeadlineExceeded) {
			return true, fmt.Sprintf("the handler refused the request (%d)", he.StatusCode)
		}
	}
	return false, ""
}

// answeredStatus is the status the failed request's client was answered
// with, for the outcome-unknown record: the handler error's (the proxy's
// 502 or 504), else 502.
func (f failure) answeredStatus() int {
	var he caddyhttp.HandlerError
	if errors.As(f.err, &he) && he.StatusCode >= 500 && he.StatusCode <= 599 {
		return he.StatusCode
	}
	return http.StatusBadGateway
}

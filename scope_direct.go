package idempotency

import (
	"net"
	"net/http"
	"net/textproto"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// directValue reads a scope placeholder of the request's host or of one
// of its headers from the request itself, with caddyhttp's definition of
// the value, but without the replacer's cost: its lookup walks every
// provider, boxes each value, and allocates an error for a host without
// a port (the common case), per request.
type directValue struct {
	kind   uint8
	header string // the canonical header name, for directHeader
}

const (
	directNone   uint8 = iota // through the replacer
	directHost                // {http.request.host}
	directHeader              // {http.request.header.*}
)

func directValueOf(key string) directValue {
	switch {
	case key == "http.request.host":
		return directValue{kind: directHost}
	case strings.HasPrefix(key, "http.request.header."):
		return directValue{kind: directHeader, header: textproto.CanonicalMIMEHeaderKey(strings.TrimPrefix(key, "http.request.header."))}
	}
	return directValue{}
}

// read returns the value, and false when it must come from the replacer.
//
// The host is the Host of the request the replacer is bound to, which is
// not always r's: Caddy's tracing, forward_auth (and other handle_response
// routes) and handle_errors pass on a shallow copy of the request, and a
// request_header Host after them changes the copy's Host only. The
// replacer's {http.request.hostport} is that request's Host as it is; only
// the split is done here, without the error SplitHostPort allocates for a
// host without a port. (Headers need no such care: a shallow copy shares
// the header map. They differ from the replacer's only after a handler
// that passes on a deep copy, r.Clone, and then changes the header, or a
// module that repl.Sets an http.request.header placeholder: Caddy's own
// handlers do neither, and the header as it reaches this handler is the
// client's identity it acts on.)
func (d directValue) read(r *http.Request, repl *caddy.Replacer) (string, bool) {
	if r == nil {
		return "", false
	}
	switch d.kind {
	case directHost:
		v, _ := repl.Get("http.request.hostport")
		hostport := caddy.ToString(v)
		if strings.IndexByte(hostport, ':') < 0 {
			return hostport, true // what SplitHostPort's error leaves
		}
		host, _, err := net.SplitHostPort(hostport)
		if err != nil {
			return hostport, true
		}
		return host, true
	case directHeader:
		return strings.Join(r.Header[d.header], ","), true
	}
	return "", false
}

package idempotency

import (
	"net"
	"net/http"
	"net/textproto"
	"strings"
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
func (d directValue) read(r *http.Request) (string, bool) {
	if r == nil {
		return "", false
	}
	switch d.kind {
	case directHost:
		if strings.IndexByte(r.Host, ':') < 0 {
			return r.Host, true // what SplitHostPort's error leaves
		}
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			return r.Host, true
		}
		return host, true
	case directHeader:
		return strings.Join(r.Header[d.header], ","), true
	}
	return "", false
}

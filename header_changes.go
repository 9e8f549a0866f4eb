package idempotency

import (
	"net/http"
	"slices"
	"strings"
)

// A record keeps what the inner handlers did to the response headers,
// not the headers themselves: a replay starts from the headers the outer
// handlers set for the current request (CORS, request ids) and makes the
// same changes. The changes travel in an http.Header:
//
//   - a name with values: the header was set to those values (added, or
//     replaced: the upstream's Server over Caddy's);
//   - a name also listed under appendedName: those values were appended
//     to what the outer handlers had set (reverse_proxy adds the
//     upstream's values to a header an outer handler set);
//   - a name listed under deletedName: the header was removed (an inner
//     `header -Server`);
//   - a name with http.TrailerPrefix: a trailer, sent after the body.
//
// The pseudo-names start with a colon, which no header name can hold.
// Records made before changes were recorded this way have plain names
// only, which replay as set.
const (
	appendedName = ":appended"
	deletedName  = ":deleted"
)

// hopHeaders are per-connection headers (RFC 9110 section 7.6.1) that a
// replay must not repeat; Date is the replay's own.
var hopHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Date",
}

// headerChanges returns what turned outer into h: the headers the inner
// handlers set, appended to or deleted. Hop-by-hop headers, Date, and the
// headers named in Connection are left out.
func headerChanges(h, outer http.Header) http.Header {
	var out http.Header
	put := func(name string, values []string) {
		if out == nil {
			out = make(http.Header, len(h))
		}
		out[name] = values
	}
	for name, values := range h {
		prior := outer[name]
		if slices.Equal(values, prior) || slices.Contains(hopHeaders, name) || strings.HasPrefix(name, http.TrailerPrefix) {
			continue
		}
		if len(prior) > 0 && len(values) > len(prior) && slices.Equal(values[:len(prior)], prior) {
			put(name, slices.Clone(values[len(prior):]))
			put(appendedName, append(out[appendedName], name))
			continue
		}
		put(name, slices.Clone(values))
	}
	for name := range outer {
		if _, kept := h[name]; !kept && !slices.Contains(hopHeaders, name) {
			put(deletedName, append(out[deletedName], name))
		}
	}
	for _, v := range h["Connection"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				out.Del(name)
			}
		}
	}
	if out != nil {
		slices.Sort(out[appendedName]) // equal changes encode equally
		slices.Sort(out[deletedName])
	}
	return out
}

// replayHeader makes the recorded changes to hdr, the headers of the
// current answer, and returns the names of the recorded trailers. Each
// replay gets values of its own: an outer handler that rewrites a value
// in place (a `header` replace) must never reach a record that other
// replays share. A non-empty marker header is set to "true" with them (the
// replay header: its value shares their allocation), in buf when they
// fit (the exchange's own array: no allocation for a few headers).
func replayHeader(hdr, recorded http.Header, marker string, buf []string) (trailers []string) {
	appended, deleted := recorded[appendedName], recorded[deletedName]
	// One backing array for the copies: a replay costs one allocation for
	// its header values, however many there are.
	n := 0
	for _, values := range recorded {
		n += len(values)
	}
	own := buf[:1]
	if cap(buf) < n+1 {
		own = make([]string, 1, n+1)
	}
	own[0] = "true"
	for name, values := range recorded {
		switch {
		case name == appendedName || name == deletedName:
		case strings.HasPrefix(name, http.TrailerPrefix):
			trailers = append(trailers, strings.TrimPrefix(name, http.TrailerPrefix))
		case slices.Contains(appended, name):
			hdr[name] = append(slices.Clip(hdr[name]), values...)
		default:
			start := len(own)
			own = append(own, values...)
			hdr[name] = own[start:len(own):len(own)]
		}
	}
	for _, name := range deleted {
		delete(hdr, name)
	}
	if marker != "" {
		hdr[marker] = own[0:1:1]
	}
	slices.Sort(trailers)
	return trailers
}

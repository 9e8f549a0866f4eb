package idempotency

import (
	"net/http"
	"strconv"
	"sync"
	"unicode/utf8"
)

// problem is an RFC 9457 problem type this handler answers with. Titles
// follow draft-ietf-httpapi-idempotency-key-header where it names one.
type problem struct {
	status int
	slug   string // the last part of the type URI
	title  string

	typ      string // typeURI, made once
	typValue any    // typ as the {http.idempotency.problem} placeholder's value, boxed once
}

// newProblem is the problem of status, slug and title, its type URI made
// once rather than per answer.
func newProblem(status int, slug, title string) problem {
	typ := problemTypeBase + slug
	return problem{status: status, slug: slug, title: title, typ: typ, typValue: typ}
}

var (
	problemKeyMissing  = newProblem(http.StatusBadRequest, "key-missing", "Idempotency-Key is missing")
	problemKeyInvalid  = newProblem(http.StatusBadRequest, "key-invalid", "Idempotency-Key is invalid")
	problemScopeEmpty  = newProblem(http.StatusBadRequest, "scope-empty", "The scope of this Idempotency-Key is empty")
	problemConflict    = newProblem(http.StatusConflict, "request-outstanding", "A request is outstanding for this Idempotency-Key")
	problemMismatch    = newProblem(http.StatusUnprocessableEntity, "key-reused", "Idempotency-Key is already used")
	problemBodyNotJSON = newProblem(http.StatusBadRequest, "body-invalid-json", "Request body is not valid JSON")
	// A body that does not decode as its Content-Encoding says, and one
	// whose coding the handler cannot decode to find its key.
	problemBodyNotDecoded        = newProblem(http.StatusBadRequest, "body-encoding-invalid", "Request body does not decode as its Content-Encoding says")
	problemBodyCodingUnsupported = newProblem(http.StatusUnsupportedMediaType, "body-encoding-unsupported", "Request body's Content-Encoding is not supported")
	problemTooLarge              = newProblem(http.StatusRequestEntityTooLarge, "body-too-large", "Request body is too large for an idempotent request")
	problemTooManyKeys           = newProblem(http.StatusTooManyRequests, "too-many-keys", "Too many Idempotency-Keys for this client")
	problemStoreDown             = newProblem(http.StatusServiceUnavailable, "store-unavailable", "Idempotency store is unavailable")
	problemStoreFull             = newProblem(http.StatusServiceUnavailable, "store-full", "Idempotency store is full")
	// A retry of a request whose outcome is unknown: 502, the gateway's
	// own status for an upstream that gave no valid answer, which is what
	// happened to the first request (its client got the proxy's 502 or
	// 504); not a 409, which the draft and SDKs take as "retry soon", and
	// not retryable: the same request never succeeds with this key.
	problemOutcomeUnknown = newProblem(http.StatusBadGateway, "outcome-unknown", "The outcome of the request with this Idempotency-Key is unknown")
)

// retryable says whether the same request, with the same key, may
// succeed later (409, 429, 503), or must change first (400, 413, 415,
// 422, and the outcome-unknown 502).
func (p problem) retryable() bool {
	switch p.status {
	case http.StatusConflict, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true
	}
	return false
}

// typeURI is the problem's type.
func (p problem) typeURI() string { return p.typ }

// problemTypeBase prefixes problem slugs to make type URIs: stable
// identifiers that do not depend on any deployment.
const problemTypeBase = "urn:caddy-idempotency:"

// problemBody is the JSON object of a problem response.
type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Instance names this occurrence: "urn:uuid:" and the request's id,
	// the uuid of Caddy's access log and the request_id of the module's
	// log line for the request.
	Instance string `json:"instance,omitempty"`
	// Retryable says whether sending the same request with the same key
	// again may succeed (409, 429, 503) or not (400, 413, 422, 502).
	Retryable bool `json:"retryable"`
	// Differs names the parts of a request that differ from the one a
	// reused key was first used for (422 only).
	Differs []string `json:"differs,omitempty"`
}

// writeProblem answers with p as application/problem+json, with the
// differs member of a 422 when there are any, the request's id as the
// instance, linking docsURL when it is set. Problem responses are never
// stored and never cached. The header values are made in vals's array
// when it has room (the exchange's own; Header.Set allocates each).
func writeProblem(w http.ResponseWriter, docsURL string, p problem, detail string, differs []string, requestID string, vals []string) error {
	buf := problemBuffers.Get().(*[]byte)
	body := appendProblemJSON((*buf)[:0], p, detail, differs, requestID)
	hdr := w.Header()
	vals = append(vals[:0], "application/problem+json", strconv.Itoa(len(body)), "no-store")
	hdr["Content-Type"] = vals[0:1:1]
	hdr["Content-Length"] = vals[1:2:2]
	hdr["Cache-Control"] = vals[2:3:3]
	if docsURL != "" {
		hdr.Add("Link", "<"+docsURL+`>; rel="describedby"`)
	}
	w.WriteHeader(p.status)
	// A client that went away cannot be told anything else; there is no
	// error for Caddy's error routes to handle.
	_, _ = w.Write(body)
	if cap(body) <= maxPooledProblem {
		*buf = body
		problemBuffers.Put(buf) // a Writer never keeps what it is given
	}
	return nil
}

// problemBuffers holds the buffers problem bodies are made in; one larger
// than maxPooledProblem (a 422 naming many members) is left to the
// collector.
var problemBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

const maxPooledProblem = 4 << 10

// appendProblemJSON appends the problemBody of p, detail, differs and
// the request's id, as the bytes json.Marshal writes for it
// (TestProblemJSONIsMarshals), without its reflection and allocations.
func appendProblemJSON(b []byte, p problem, detail string, differs []string, requestID string) []byte {
	b = append(b, `{"type":`...)
	b = appendJSONString(b, "", p.typeURI())
	b = append(b, `,"title":`...)
	b = appendJSONString(b, "", p.title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(p.status), 10)
	if detail != "" {
		b = append(b, `,"detail":`...)
		b = appendJSONString(b, "", detail)
	}
	if requestID != "" {
		b = append(b, `,"instance":`...)
		b = appendJSONString(b, "urn:uuid:", requestID)
	}
	b = append(b, `,"retryable":`...)
	b = strconv.AppendBool(b, p.retryable())
	if len(differs) > 0 {
		b = append(b, `,"differs":[`...)
		for i, d := range differs {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, "", d)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendJSONString appends prefix+s as a JSON string, escaped as
// json.Marshal escapes it: control characters (\n, \r, \t, \b, \f short),
// <, > and &, U+2028 and U+2029 as \u escapes, invalid UTF-8 as U+FFFD.
func appendJSONString(b []byte, prefix, s string) []byte {
	b = append(b, '"')
	for _, part := range [2]string{prefix, s} {
		start := 0
		for i := 0; i < len(part); {
			c := part[i]
			if c < utf8.RuneSelf {
				if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
					i++
					continue
				}
				b = append(b, part[start:i]...)
				switch c {
				case '"', '\\':
					b = append(b, '\\', c)
				case '\n':
					b = append(b, '\\', 'n')
				case '\r':
					b = append(b, '\\', 'r')
				case '\t':
					b = append(b, '\\', 't')
				case '\b':
					b = append(b, '\\', 'b')
				case '\f':
					b = append(b, '\\', 'f')
				default:
					b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
				}
				i++
				start = i
				continue
			}
			r, size := utf8.DecodeRuneInString(part[i:])
			if r == utf8.RuneError && size == 1 {
				b = append(b, part[start:i]...)
				b = append(b, `\ufffd`...)
				i += size
				start = i
				continue
			}
			if r == '\u2028' || r == '\u2029' {
				b = append(b, part[start:i]...)
				b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
				i += size
				start = i
				continue
			}
			i += size
		}
		b = append(b, part[start:]...)
	}
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

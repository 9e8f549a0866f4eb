package idempotency

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// identityBody makes sure a recorded body is never content-encoded, so
// that each replay can be encoded for the client that asks (encode runs
// outside the handler). The handler asks the upstream for identity; one
// that answers gzip anyway has its body decoded here, within limit; any
// other encoding, or a gzip body that does not decode within limit, is
// recorded without its body (replays say so) rather than replayed to
// clients that cannot read it.
func identityBody(resp *storage.Response, limit int64) {
	ce := headerValue(resp.Header, "Content-Encoding")
	if ce == "" || strings.EqualFold(ce, "identity") {
		return
	}
	delete(resp.Header, "Content-Encoding")
	delete(resp.Header, "Content-Length") // the encoded length
	if resp.BodyOmitted || len(resp.Body) == 0 {
		return
	}
	if strings.EqualFold(ce, "gzip") || strings.EqualFold(ce, "x-gzip") {
		if zr, err := gzip.NewReader(bytes.NewReader(resp.Body)); err == nil {
			var out bytes.Buffer
			n, err := out.ReadFrom(io.LimitReader(zr, limit+1))
			if err == nil && n <= limit {
				resp.Body = out.Bytes()
				return
			}
		}
	}
	resp.Body, resp.BodyOmitted = nil, true
}

// headerValue is the first value of name in h, which may be nil.
func headerValue(h http.Header, name string) string {
	if v := h[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}

package idempotency

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// recorder streams a response to the client while keeping a copy of it
// for the store: the status and the headers that the inner handlers set
// for the final response, and the body up to a limit.
//
// Once the next handler has produced a response, that response is what
// every retry will get, so the recorder never stops it: writes to a client
// that has gone away are dropped, not reported, and a body too large to
// keep is still read to its end. Flushing, deadlines and full duplex reach
// the client's writer through Unwrap.
type recorder struct {
	caddyhttp.ResponseWriterWrapper

	limit     int64
	outer     http.Header // the headers as outer handlers left them, before the next handler ran
	status    int         // final status; 0 until written
	header    http.Header // the stored headers, taken at the final WriteHeader
	body      []byte
	omitted   bool  // the body outgrew limit and is not kept
	clientErr error // the first error writing to the client
	hijacked  bool
}

func newRecorder(w http.ResponseWriter, limit int64) *recorder {
	return &recorder{
		ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
		limit:                 limit,
		outer:                 w.Header().Clone(),
	}
}

// WriteHeader records the final status and the headers the inner handlers
// set, as they are at that moment, before outer handlers (encode) rewrite
// them for this client. Informational responses pass through unrecorded.
func (rec *recorder) WriteHeader(status int) {
	if rec.status != 0 {
		return
	}
	if status >= 100 && status <= 199 && status != http.StatusSwitchingProtocols {
		rec.ResponseWriterWrapper.WriteHeader(status)
		return
	}
	rec.status = status
	rec.header = storedHeader(rec.Header(), rec.outer)
	rec.ResponseWriterWrapper.WriteHeader(status)
}

// Write keeps p and sends it to the client, if it is still there. It
// never fails: stopping the handler half-way would leave a response that
// happened but was never recorded.
func (rec *recorder) Write(p []byte) (int, error) {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	rec.keep(p)
	if rec.clientErr == nil {
		if _, err := rec.ResponseWriterWrapper.Write(p); err != nil {
			rec.clientErr = err
		}
	}
	return len(p), nil
}

// ReadFrom copies through Write, so that what io.Copy sends (reverse_proxy
// and file_server use it) is kept too, and so that an error means the
// reader failed, never the client.
func (rec *recorder) ReadFrom(r io.Reader) (int64, error) {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	bufp := copyBufPool.Get().(*[]byte)
	defer copyBufPool.Put(bufp)
	return io.CopyBuffer(writerOnly{rec}, r, *bufp)
}

// keep appends p to the kept body until the limit is passed; from then on
// only status and headers are kept.
func (rec *recorder) keep(p []byte) {
	if rec.omitted {
		return
	}
	if int64(len(rec.body))+int64(len(p)) > rec.limit {
		rec.omitted, rec.body = true, nil
		return
	}
	rec.body = append(rec.body, p...)
}

// FlushError flushes to the client. Flushing writes the status line, so
// the status is recorded first. A client that is gone is not an error.
func (rec *recorder) FlushError() error {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.clientErr != nil {
		return nil
	}
	err := http.NewResponseController(rec.ResponseWriterWrapper.ResponseWriter).Flush()
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		rec.clientErr = err
		return nil
	}
	return err
}

// Flush is for handlers that assert http.Flusher instead of using
// http.ResponseController.
func (rec *recorder) Flush() { _ = rec.FlushError() }

// Hijack hands the connection over; a hijacked response cannot be
// recorded, so the key is released afterwards.
func (rec *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	rec.hijacked = true
	return http.NewResponseController(rec.ResponseWriterWrapper.ResponseWriter).Hijack()
}

// response returns what to store: the final status (200 when the handler
// wrote nothing, as net/http will send) and the kept headers and body.
func (rec *recorder) response() (status int, header http.Header, body []byte, omitted bool) {
	if rec.status == 0 {
		return http.StatusOK, storedHeader(rec.Header(), rec.outer), nil, false
	}
	return rec.status, rec.header, rec.body, rec.omitted
}

// writerOnly hides the recorder's ReadFrom from io.CopyBuffer, which would
// otherwise call it again.
type writerOnly struct{ io.Writer }

var copyBufPool = sync.Pool{New: func() any {
	b := make([]byte, 32<<10)
	return &b
}}

// hopHeaders are per-connection headers (RFC 9110 section 7.6.1) that a
// replay must not repeat; Date is the replay's own.
var hopHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Date",
}

// storedHeader returns the headers of h that the inner handlers set: those
// not in outer, or with other values there; of a header they added values
// to (reverse_proxy adds the upstream's), only the added values. Hop-by-hop
// headers, Date, and the headers named in Connection are left out.
func storedHeader(h, outer http.Header) http.Header {
	var out http.Header
	for name, values := range h {
		prior := outer[name]
		if slices.Equal(values, prior) || slices.Contains(hopHeaders, name) {
			continue
		}
		if len(prior) > 0 && len(values) > len(prior) && slices.Equal(values[:len(prior)], prior) {
			values = values[len(prior):]
		}
		if out == nil {
			out = make(http.Header, len(h))
		}
		out[name] = slices.Clone(values)
	}
	for _, v := range h["Connection"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				out.Del(name)
			}
		}
	}
	return out
}

// Interface guards
var (
	_ http.ResponseWriter = (*recorder)(nil)
	_ io.ReaderFrom       = (*recorder)(nil)
	_ http.Flusher        = (*recorder)(nil)
	_ http.Hijacker       = (*recorder)(nil)
)

package idempotency

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/internal/knobs"
)

// A client that takes no byte of the answer for knobs.StallTimeout (10 s)
// counts as gone. The record is written once the answer has ended, and
// retries meanwhile get 409: a client that stops reading must not hold
// its key for as long as its connection lives. A client that reads
// slowly is not gone: the judge is progress (a piece of progressPiece
// bytes taken), not how long one write of the next handler takes, so
// that a phone reading at 1 KB/s gets its whole answer.

// progressPiece is how much of a write goes to the client at a time: each
// piece taken is progress. Small enough that a client reading at 1 KB/s
// takes one in a few seconds, large enough that a fast one pays nothing
// for it (writes go through the connection's buffers anyway).
const progressPiece = 4 << 10

// recorder streams a response to the client while keeping a copy of it
// for the store: the status, the changes the inner handlers made to the
// headers, the body up to a limit, and the trailers.
//
// Once the next handler has produced a response, that response is what
// every retry will get, so the recorder never stops it: writes to a client
// that has gone away (or taken nothing for knobs.StallTimeout) are
// dropped, not reported, and a body too large to keep is still read to
// its end. Flushing, deadlines and full duplex reach the client's writer
// through Unwrap.
//
// In observe mode (transparent) it neither bounds writes to the client
// nor refuses anything: the answer is exactly what it would be without
// the module.
type recorder struct {
	caddyhttp.ResponseWriterWrapper

	limit       int64
	transparent bool        // observe mode
	outer       http.Header // the headers as outer handlers left them, before the next handler ran
	status      int         // final status; 0 until written
	invalid     int         // a final status outside 100-999 that was refused (enforce mode)
	header      http.Header // the stored headers, taken at the final WriteHeader
	announced   []string    // trailer names announced in the Trailer header
	body        []byte
	omitted     bool      // the body outgrew limit and is not kept
	clientErr   error     // the first error writing to the client
	deadlined   bool      // a write deadline is set on the client's connection
	armed       time.Time // when the write deadline was last moved (zero: never)
	hijacked    bool
}

func newRecorder(w http.ResponseWriter, limit int64, transparent bool) *recorder {
	return &recorder{
		ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
		limit:                 limit,
		transparent:           transparent,
		outer:                 w.Header().Clone(),
	}
}

// WriteHeader records the final status and the header changes the inner
// handlers made, as they are at that moment, before outer handlers
// (encode) rewrite them for this client. Informational responses pass
// through unrecorded. A final status net/http cannot send (outside
// 100-999, such as an upstream's 042) is refused: the response then
// failed before any status (see Handler.execute).
func (rec *recorder) WriteHeader(status int) {
	if rec.status != 0 || rec.invalid != 0 {
		return
	}
	if status >= 100 && status <= 199 && status != http.StatusSwitchingProtocols {
		rec.ResponseWriterWrapper.WriteHeader(status)
		return
	}
	if (status < 100 || status > 999) && !rec.transparent {
		rec.invalid = status
		return
	}
	rec.status = status
	hdr := rec.Header()
	rec.announced = announcedTrailers(hdr)
	rec.header = headerChanges(hdr, rec.outer)
	rec.ResponseWriterWrapper.WriteHeader(status)
}

// Write keeps p and sends it to the client, if it is still there. It
// never fails: stopping the handler half-way would leave a response that
// happened but was never recorded.
func (rec *recorder) Write(p []byte) (int, error) {
	if rec.status == 0 && rec.invalid == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.invalid != 0 {
		return len(p), nil // nothing of an invalid response reaches anyone
	}
	rec.keep(p)
	for rest := p; len(rest) > 0 && rec.clientErr == nil; {
		piece := rest[:min(len(rest), progressPiece)]
		rest = rest[len(piece):]
		rec.bound()
		if _, err := rec.ResponseWriterWrapper.Write(piece); err != nil {
			rec.clientErr = err
		}
	}
	return len(p), nil
}

// bound keeps the client's write deadline knobs.StallTimeout ahead of its
// last progress (enforce mode only). Moving a deadline costs a message to
// the connection's goroutine on HTTP/2, so it moves at most every tenth of
// the timeout, and lies that much further ahead: a client is gone after
// between 10 and 11 s without taking a byte.
func (rec *recorder) bound() {
	if rec.transparent {
		return
	}
	now, stall := time.Now(), knobs.StallTimeout()
	if !rec.armed.IsZero() && now.Sub(rec.armed) < stall/10 {
		return
	}
	rec.armed = now
	err := http.NewResponseController(rec.ResponseWriterWrapper.ResponseWriter).SetWriteDeadline(now.Add(stall + stall/10))
	rec.deadlined = rec.deadlined || err == nil
}

// cutShort reports whether the client was not given the whole answer: a
// write to it failed or timed out. Its response must then be aborted
// (panic(http.ErrAbortHandler) once the record is settled): HTTP/1.1
// closes the connection without the final chunk, HTTP/2 resets the
// stream, HTTP/3 cancels it, so that the client never takes what it got
// for the whole answer.
func (rec *recorder) cutShort() bool { return rec.clientErr != nil }

// unbound clears the write deadline bound set, so that the connection's
// next request starts without one.
func (rec *recorder) unbound() {
	if rec.deadlined {
		_ = http.NewResponseController(rec.ResponseWriterWrapper.ResponseWriter).SetWriteDeadline(time.Time{})
	}
}

// ReadFrom copies through Write, so that what io.Copy sends (reverse_proxy
// and file_server use it) is kept too, and so that an error means the
// reader failed, never the client.
func (rec *recorder) ReadFrom(r io.Reader) (int64, error) {
	if rec.status == 0 && rec.invalid == 0 {
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
	if rec.status == 0 && rec.invalid == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.clientErr != nil || rec.invalid != 0 {
		return nil
	}
	rec.bound()
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
// wrote nothing, as net/http will send), the kept header changes with the
// trailers, and the body.
func (rec *recorder) response() (status int, header http.Header, body []byte, omitted bool) {
	if rec.status == 0 {
		return http.StatusOK, headerChanges(rec.Header(), rec.outer), nil, false
	}
	return rec.status, withTrailers(rec.header, rec.Header(), rec.announced), rec.body, rec.omitted
}

// writerOnly hides the recorder's ReadFrom from io.CopyBuffer, which would
// otherwise call it again.
type writerOnly struct{ io.Writer }

var copyBufPool = sync.Pool{New: func() any {
	b := make([]byte, 32<<10)
	return &b
}}

// announcedTrailers returns the names the Trailer header announces.
func announcedTrailers(h http.Header) []string {
	var names []string
	for _, v := range h["Trailer"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				names = append(names, http.CanonicalHeaderKey(name))
			}
		}
	}
	return names
}

// withTrailers adds to the stored header changes the trailers the handler
// set once the body was written: the announced names, and any name with
// http.TrailerPrefix. They are stored under http.TrailerPrefix, as net/http
// itself takes them.
func withTrailers(stored, final http.Header, announced []string) http.Header {
	add := func(name string, values []string) {
		if len(values) == 0 {
			return
		}
		if stored == nil {
			stored = make(http.Header)
		}
		stored[http.TrailerPrefix+http.CanonicalHeaderKey(name)] = append([]string(nil), values...)
	}
	for _, name := range announced {
		add(name, final[name])
	}
	for name, values := range final {
		if after, ok := strings.CutPrefix(name, http.TrailerPrefix); ok {
			add(after, values)
		}
	}
	return stored
}

// Interface guards
var (
	_ http.ResponseWriter = (*recorder)(nil)
	_ io.ReaderFrom       = (*recorder)(nil)
	_ http.Flusher        = (*recorder)(nil)
	_ http.Hijacker       = (*recorder)(nil)
)

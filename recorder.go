package idempotency

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
// that a phone reading at 1 KB/s gets its whole answer. And an upstream
// that sends nothing for a while (an SSE stream, an LLM, a long
// computation once the headers are out) is not a client that stopped:
// the client is judged only while a write to it is pending, never
// between two writes (the stall watch below).

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
// that has gone away (or took nothing of a pending write for
// knobs.StallTimeout) are dropped, not reported, and a body too large to
// keep is still read to its end. Flushing, deadlines and full duplex
// reach the client's writer through Unwrap.
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
	omitted     bool  // the body outgrew limit and is not kept
	clientErr   error // the first error writing to the client
	hijacked    bool

	// The stall watch's view (enforce mode): when the pending write to
	// the client began (stallClock; 0: none pending), whether the watch
	// knows the recorder, the server's own writer that a cut goes to
	// (nil: none can), and whether it cut the client off. watchMu keeps
	// a cut from reaching a response that has ended.
	writing  atomic.Int64
	watched  bool
	conn     writeDeadliner
	watchMu  sync.Mutex
	finished bool // under watchMu
	stalled  atomic.Bool
}

// writeDeadliner is a response writer whose write deadline can be set.
type writeDeadliner interface{ SetWriteDeadline(time.Time) error }

// serverWriter returns the server's own writer under w's wrappers (net/http's
// HTTP/1.1 and HTTP/2 writers, HTTP/3's), nil if it cannot take a write
// deadline. Those are safe to call from another goroutine while the
// handler writes; a wrapper's SetWriteDeadline may not be (Caddy's
// IdleTimeoutWriter keeps its deadline in fields the handler's writes
// use), so the stall watch cuts a client off below every wrapper.
func serverWriter(w http.ResponseWriter) writeDeadliner {
	for {
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			break
		}
		w = u.Unwrap()
	}
	wd, _ := w.(writeDeadliner)
	return wd
}

func newRecorder(w http.ResponseWriter, limit int64, transparent bool) *recorder {
	return initRecorder(new(recorder), w, limit, transparent)
}

// initRecorder is newRecorder in rec, a zero recorder (the exchange's
// own: no allocation of its own).
func initRecorder(rec *recorder, w http.ResponseWriter, limit int64, transparent bool) *recorder {
	rec.ResponseWriterWrapper = caddyhttp.ResponseWriterWrapper{ResponseWriter: w}
	rec.limit, rec.transparent, rec.outer = limit, transparent, w.Header().Clone()
	return rec
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
	// A body announced larger than the limit is never kept: not a byte of
	// it is buffered on the way to the limit.
	if cl := hdr.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n > rec.limit {
			rec.omitted = true
		}
	}
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
		rec.pending()
		if _, err := rec.ResponseWriterWrapper.Write(piece); err != nil {
			rec.clientErr = err
		}
		rec.writing.Store(0)
	}
	return len(p), nil
}

// pending marks a write to the client as begun, for the stall watch
// (enforce mode only): the watch cuts the client off if the write is
// still pending knobs.StallTimeout later. The write that ends clears the
// mark, so that between writes nothing judges the client.
func (rec *recorder) pending() {
	if rec.transparent {
		return
	}
	if !rec.watched {
		rec.watched = true
		rec.conn = serverWriter(rec.ResponseWriterWrapper.ResponseWriter)
		stalls.watch(rec)
	}
	rec.writing.Store(stallClock())
}

// cutShort reports whether the client was not given the whole answer: a
// write to it failed, or the stall watch cut it off. Its response must
// then be aborted (panic(http.ErrAbortHandler) once the record is
// settled): HTTP/1.1 closes the connection without the final chunk,
// HTTP/2 resets the stream, HTTP/3 cancels it, so that the client never
// takes what it got for the whole answer.
func (rec *recorder) cutShort() bool { return rec.clientErr != nil || rec.stalled.Load() }

// unbound takes the recorder off the stall watch once the response has
// ended (before the handler returns: a cut must never reach a response
// that has ended, or the connection's next request), and clears the
// write deadline a cut set, so that the connection's next request starts
// without one.
func (rec *recorder) unbound() {
	if !rec.watched {
		return
	}
	rec.watchMu.Lock()
	rec.finished = true
	rec.watchMu.Unlock()
	stalls.forget(rec)
	if rec.stalled.Load() {
		_ = http.NewResponseController(rec.ResponseWriterWrapper.ResponseWriter).SetWriteDeadline(time.Time{})
	}
}

// cutOff ends the client's pending write, if the write that began at
// since is still pending and the response has not ended: a write
// deadline in the past, set on the server's writer, fails the write
// (HTTP/1.1, HTTP/3) or resets the stream (HTTP/2). It runs on the
// stall watch's goroutine. (A wrapper that sets a deadline of its own
// before its next write cannot undo the cut: once a write to the client
// failed, the recorder writes nothing more to it.)
func (rec *recorder) cutOff(since int64) {
	rec.watchMu.Lock()
	defer rec.watchMu.Unlock()
	if rec.finished || rec.conn == nil || rec.writing.Load() != since {
		return
	}
	rec.stalled.Store(true)
	_ = rec.conn.SetWriteDeadline(time.Unix(1, 0))
}

// stalls is the process's stall watch.
var stalls stallWatch

// stallWatch judges the clients of the recorders that are writing: one
// whose write has been pending for knobs.StallTimeout is cut off. It looks
// every tenth of the timeout, so a client is gone after between 10 and
// 11 s without taking a byte of a pending write. One goroutine watches
// every response of the process, and only while there are some: setting
// a write deadline per write would cost HTTP/2 a message to the
// connection's goroutine each time, and a deadline left armed between
// writes would reset the stream of a healthy client whose upstream is
// silent.
type stallWatch struct {
	mu        sync.Mutex
	recorders map[*recorder]struct{}
	running   bool
}

// watch adds rec to the watch, and starts the watch if it was idle.
func (sw *stallWatch) watch(rec *recorder) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if sw.recorders == nil {
		sw.recorders = make(map[*recorder]struct{})
	}
	sw.recorders[rec] = struct{}{}
	if !sw.running {
		sw.running = true
		go sw.run()
	}
}

// forget takes rec off the watch.
func (sw *stallWatch) forget(rec *recorder) {
	sw.mu.Lock()
	delete(sw.recorders, rec)
	sw.mu.Unlock()
}

// run looks at the watched recorders every tenth of the stall timeout
// and cuts off the clients of the stalled ones; it ends once it watches
// none.
func (sw *stallWatch) run() {
	var stalled []*recorder
	var since []int64
	for {
		stall := knobs.StallTimeout()
		time.Sleep(stall / 10)
		now := stallClock()
		stalled, since = stalled[:0], since[:0]
		sw.mu.Lock()
		if len(sw.recorders) == 0 {
			sw.running = false
			sw.mu.Unlock()
			return
		}
		for rec := range sw.recorders {
			if at := rec.writing.Load(); at != 0 && now-at >= int64(stall) {
				stalled, since = append(stalled, rec), append(since, at)
			}
		}
		sw.mu.Unlock()
		// Outside the watch's lock: a cut on HTTP/2 waits for the
		// connection's goroutine.
		for i, rec := range stalled {
			rec.cutOff(since[i])
		}
		clear(stalled)
	}
}

// stallClock is a monotonic clock in nanoseconds, never 0 (0 marks no
// write pending).
func stallClock() int64 { return int64(time.Since(stallEpoch)) + 1 }

var stallEpoch = time.Now()

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
	rec.pending()
	err := http.NewResponseController(rec.ResponseWriterWrapper.ResponseWriter).Flush()
	rec.writing.Store(0)
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

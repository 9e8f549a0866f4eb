package idempotency

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"sync"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// errBodyTooLarge: the request body is larger than max_body_size.
var errBodyTooLarge = errors.New("request body too large")

// maxPooledBody is the largest body buffer put back in the pool (rarer
// big ones are left to the garbage collector so the pool stays small), and
// the most a buffer holds before any byte arrives.
const maxPooledBody = 64 << 10

var bodyPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// readBody reads the whole request body, up to limit bytes, before the key
// is reserved: a slow client then cannot hold a lease while it trickles its
// body in. The body is replaced by the buffered copy for the next handler,
// made in into (part of the request's exchange) when it is given.
func readBody(r *http.Request, limit int64, into *bufferedBody) (*bufferedBody, error) {
	if r.ContentLength > limit {
		return nil, errBodyTooLarge
	}
	buf := bodyPool.Get().(*bytes.Buffer)
	buf.Reset()
	body := into
	if body == nil {
		body = new(bufferedBody)
	}
	body.buf = buf
	if r.Body != nil && r.Body != http.NoBody {
		// Grow as bytes arrive rather than to Content-Length at once: a
		// client that announces a megabyte and sends nothing must not pin
		// a megabyte per connection.
		if r.ContentLength > 0 {
			buf.Grow(int(min(r.ContentLength, maxPooledBody)))
		}
		body.lr = io.LimitedReader{R: r.Body, N: limit + 1}
		n, err := buf.ReadFrom(&body.lr)
		body.lr = io.LimitedReader{}
		if err == nil && n > limit {
			err = errBodyTooLarge
		}
		if err != nil {
			// For a request that goes on untracked (observe mode), the
			// next handler must still get the whole body, or the same
			// error.
			r.Body = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(bytes.Clone(buf.Bytes())), errAfter(r.Body, err)), orig: r.Body}
			body.Close()
			return nil, bodyReadError(err)
		}
	}
	r.Body = body
	r.ContentLength = int64(buf.Len())
	r.TransferEncoding = nil
	// The body is here already; the next hop must not wait for a 100.
	r.Header.Del("Expect")
	return body, nil
}

// prefixedBody is a request body of which a prefix was read already.
type prefixedBody struct {
	io.Reader
	orig io.ReadCloser
}

func (b *prefixedBody) Close() error { return b.orig.Close() }

// errAfter reads on from r after a read that stopped at the limit, or
// repeats the error that stopped it.
func errAfter(r io.Reader, err error) io.Reader {
	if errors.Is(err, errBodyTooLarge) {
		return r
	}
	return errReader{err}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// bodyReadError classifies a failure to read the request body.
func bodyReadError(err error) error {
	var maxErr *http.MaxBytesError
	var handlerErr caddyhttp.HandlerError
	switch {
	case errors.Is(err, errBodyTooLarge), errors.As(err, &maxErr):
		return errBodyTooLarge
	case errors.As(err, &handlerErr) && handlerErr.StatusCode == http.StatusRequestEntityTooLarge:
		return errBodyTooLarge
	case errors.Is(err, os.ErrDeadlineExceeded):
		return caddyhttp.Error(http.StatusRequestTimeout, err)
	}
	return caddyhttp.Error(http.StatusBadRequest, err)
}

// bufferedBody is the request body read into a pooled buffer. Close gives
// the buffer back; a transport may close the body from another goroutine
// while still reading it, hence the lock.
type bufferedBody struct {
	mu  sync.Mutex
	buf *bytes.Buffer
	lr  io.LimitedReader // reads the body in readBody, without an allocation of its own
}

// Bytes returns the unread body. Only valid before it is handed on.
func (b *bufferedBody) Bytes() []byte { return b.buf.Bytes() }

// Len is len(b.Bytes()).
func (b *bufferedBody) Len() int { return b.buf.Len() }

// Cap is the size of the buffer the body holds, 0 once closed.
func (b *bufferedBody) Cap() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf == nil {
		return 0
	}
	return b.buf.Cap()
}

func (b *bufferedBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf == nil {
		return 0, http.ErrBodyReadAfterClose
	}
	return b.buf.Read(p)
}

// Close is idempotent.
func (b *bufferedBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf != nil {
		if b.buf.Cap() <= maxPooledBody {
			bodyPool.Put(b.buf)
		}
		b.buf = nil
	}
	return nil
}

package fingerprint

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

// Content codings. A content coding is how a representation was
// compressed, not what it says (RFC 9110 8.4): a body sent gzipped and the
// same body sent as it is are one request. A body whose Content-Encoding
// names only codings that DecodeContent decodes is therefore compared by
// its decoded content; one with another coding (br, compress, a token
// nobody registered) cannot be decoded here and is compared byte for
// byte, together with its codings, so that it never matches a body of
// other content that happens to be those bytes.

// AcceptEncoding lists the codings DecodeContent decodes, as a 415
// answer's Accept-Encoding says (RFC 9110 15.5.16).
const AcceptEncoding = "gzip, deflate, zstd"

// MaxCodings is how many codings applied one over the other
// DecodeContent decodes; a body with more is compared byte for byte.
const MaxCodings = 4

// MaxZstdWindow is the largest zstd window DecodeContent accepts: the
// window of the zstd content coding (RFC 9659), which bounds the memory
// a zstd body holds while it is decoded.
const MaxZstdWindow = 8 << 20

// ErrContentTooLarge: a body decodes to more than the limit.
var ErrContentTooLarge = errors.New("the decoded body is over the limit")

// A DecodeError is a body that does not decode as its Content-Encoding
// says.
type DecodeError struct {
	Coding string // the coding that failed
	Err    error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("the body does not decode as %s: %v", e.Coding, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// coding is a content coding DecodeContent decodes.
type coding uint8

const (
	codingGzip coding = iota + 1
	codingDeflate
	codingZstd
)

func (c coding) String() string {
	return [...]string{"", "gzip", "deflate", "zstd"}[c]
}

// Codings is a Content-Encoding as the fingerprint reads it: the codings
// applied to a body, in the order they were applied. The zero value is a
// body as it is.
type Codings struct {
	list [MaxCodings]coding
	n    int
	// other holds the codings, spelt in lower case, of a body that is not
	// decoded ("" when it is).
	other string
}

// ParseCodings reads the Content-Encoding values of a request. Codings
// are case-insensitive tokens (x-gzip is gzip, RFC 9110 8.4.1.3);
// identity, which names no coding, is left out. It allocates nothing
// when the request has no Content-Encoding or one coding in lower case.
func ParseCodings(values []string) Codings {
	var c Codings
	for _, v := range values {
		for len(v) > 0 {
			var token string
			token, v, _ = strings.Cut(v, ",")
			token = strings.TrimSpace(token)
			var known coding
			switch {
			case token == "", strings.EqualFold(token, "identity"):
				continue
			case strings.EqualFold(token, "gzip"), strings.EqualFold(token, "x-gzip"):
				known = codingGzip
			case strings.EqualFold(token, "deflate"):
				known = codingDeflate
			case strings.EqualFold(token, "zstd"):
				known = codingZstd
			}
			// One zstd layer at most: each holds a window of up to
			// MaxZstdWindow while it decodes, and no client stacks two.
			if known == codingZstd && slices.Contains(c.list[:c.n], codingZstd) {
				known = 0
			}
			if known != 0 && c.n < MaxCodings && c.other == "" {
				c.list[c.n] = known
				c.n++
				continue
			}
			// Not decoded: every coding, in order, names the body.
			if c.other == "" {
				c.other = c.decoded()
			}
			c.other = joinLower(c.other, token)
		}
	}
	return c
}

// decoded spells the codings read so far.
func (c *Codings) decoded() string {
	var s string
	for _, k := range c.list[:c.n] {
		s = joinLower(s, k.String())
	}
	c.n = 0
	return s
}

func joinLower(list, token string) string {
	token = strings.ToLower(token)
	if list == "" {
		return token
	}
	return list + ", " + token
}

// None reports whether the body is as it is: no coding, or identity.
func (c Codings) None() bool { return c.n == 0 && c.other == "" }

// Decoded reports whether DecodeContent decodes the body: it names one
// coding or more, each one DecodeContent knows.
func (c Codings) Decoded() bool { return c.n > 0 && c.other == "" }

// Undecoded names the codings of a body that DecodeContent does not
// decode, in the order they were applied, in lower case ("" when it
// decodes it, or there is none): a coding it does not know, more than
// MaxCodings, or zstd over zstd.
func (c Codings) Undecoded() string { return c.other }

// String names the codings in the order they were applied.
func (c Codings) String() string {
	if c.other != "" {
		return c.other
	}
	var list []string
	for _, k := range c.list[:c.n] {
		list = append(list, k.String())
	}
	return strings.Join(list, ", ")
}

// DecodeContent appends to dst the content of body, sent with the
// codings c (which Decoded reports it decodes), undoing them in reverse
// order. It streams: at most limit+1 bytes of content are ever written to
// dst, so that a small body that decodes to gigabytes costs no more than
// one within the limit, and answers ErrContentTooLarge. A body that does
// not decode is a *DecodeError. An empty body is empty content whatever
// its codings say.
//
// deflate is the zlib format (RFC 9110 8.4.1.2); a raw deflate stream, as
// some clients send under that name, is decoded too, told apart by the
// zlib header it lacks. A zstd frame may use a window of up to
// MaxZstdWindow (RFC 9659).
func DecodeContent(dst *bytes.Buffer, c Codings, body []byte, limit int64) error {
	if !c.Decoded() {
		return errors.New("fingerprint: no codings to decode")
	}
	if len(body) == 0 {
		return nil
	}
	if c.list[c.n-1] == codingZstd {
		// A frame that says its content is larger is refused before any
		// window is made for it.
		var h zstd.Header
		if h.Decode(body) == nil && h.HasFCS && h.FrameContentSize > uint64(limit) {
			return ErrContentTooLarge
		}
	}
	var layers [MaxCodings]decoderLayer
	defer func() {
		for i := range layers {
			layers[i].release()
		}
	}()
	// inputs[i] is what layer i decodes: the body, or what the layer
	// outside it decoded.
	var inputs [MaxCodings]layerInput
	var r io.Reader = bytes.NewReader(body)
	for i := c.n - 1; i >= 0; i-- {
		inputs[i].r = r
		var err error
		if r, err = layers[i].open(c.list[i], &inputs[i], limit); err != nil {
			return &DecodeError{Coding: c.list[i].String(), Err: err}
		}
	}
	lr := io.LimitedReader{R: r, N: satAdd(limit, 1)}
	n, err := dst.ReadFrom(&lr)
	switch {
	case n > limit:
		return ErrContentTooLarge
	case errors.Is(err, zstd.ErrDecoderSizeExceeded):
		// A zstd frame that says its content is larger than the limit.
		return ErrContentTooLarge
	case err != nil:
		return &DecodeError{Coding: c.String(), Err: err}
	}
	// Each layer must have ended where its input ends: a decoder that
	// stops at the end of its stream (zlib, deflate) never reads what
	// follows it, and one that reads on for another frame (zstd) may take
	// the outer layer's error, a checksum that is missing, for the end of
	// its input.
	for i := range c.n {
		var rest io.Reader = &inputs[i]
		if layers[i].br != nil {
			rest = layers[i].br // what deflate read ahead is in its buffer
		}
		var one [1]byte
		m, _ := io.ReadFull(rest, one[:])
		switch {
		case inputs[i].err != nil:
			return &DecodeError{Coding: c.list[i+1].String(), Err: inputs[i].err}
		case m > 0:
			return &DecodeError{Coding: c.list[i].String(), Err: errors.New("data after the end of the stream")}
		}
	}
	return nil
}

// layerInput is what a layer decodes, with the first error reading it
// gave other than its end.
type layerInput struct {
	r   io.Reader
	err error
}

func (in *layerInput) Read(p []byte) (int, error) {
	n, err := in.r.Read(p)
	if err != nil && err != io.EOF && in.err == nil {
		in.err = err
	}
	return n, err
}

// satAdd is a+b, saturating at the largest int64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// decoderLayer is one coding being undone: its decoder, from a pool, and
// what gives it back.
type decoderLayer struct {
	gz   *gzip.Reader
	zl   io.ReadCloser // zlib
	fl   io.ReadCloser // raw deflate
	br   *bufio.Reader // tells zlib from raw deflate
	zstd *zstd.Decoder
}

// Decoder pools: a decoder's tables and windows are most of what decoding
// a small body costs.
var (
	gzipPool  sync.Pool
	zlibPool  sync.Pool
	flatePool sync.Pool
	bufPool   = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 16) }}
	zstdPool  = sync.Pool{New: func() any {
		d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(MaxZstdWindow), zstd.WithDecoderMaxMemory(MaxZstdWindow))
		if err != nil {
			panic(err) // fixed options
		}
		return d
	}}
)

// open starts undoing k on r.
func (l *decoderLayer) open(k coding, r io.Reader, limit int64) (io.Reader, error) {
	switch k {
	case codingGzip:
		if zr, ok := gzipPool.Get().(*gzip.Reader); ok {
			l.gz = zr
			return zr, zr.Reset(r)
		}
		zr, err := gzip.NewReader(r)
		l.gz = zr
		return zr, err
	case codingDeflate:
		l.br = bufPool.Get().(*bufio.Reader)
		l.br.Reset(r)
		if head, err := l.br.Peek(2); err == nil && isZlibHeader(head) {
			if zr, ok := zlibPool.Get().(io.ReadCloser); ok {
				l.zl = zr
				return zr, zr.(zlib.Resetter).Reset(l.br, nil)
			}
			zr, err := zlib.NewReader(l.br)
			l.zl = zr
			return zr, err
		}
		if fr, ok := flatePool.Get().(io.ReadCloser); ok {
			l.fl = fr
			return fr, fr.(flate.Resetter).Reset(l.br, nil)
		}
		l.fl = flate.NewReader(l.br)
		return l.fl, nil
	case codingZstd:
		l.zstd = zstdPool.Get().(*zstd.Decoder)
		// A frame of known size up to the limit needs no window of
		// its own beyond it; a streamed one, up to the coding's.
		memory := uint64(max(satAdd(limit, 1), MaxZstdWindow))
		return l.zstd, l.zstd.ResetWithOptions(r, zstd.WithDecoderMaxMemory(memory))
	}
	return nil, fmt.Errorf("unknown coding %d", k)
}

// isZlibHeader reports whether b starts a zlib stream (RFC 1950): deflate
// compression, a window of at most 32 KiB, no preset dictionary, and the
// header's check.
func isZlibHeader(b []byte) bool {
	return b[0]&0x0f == 8 && b[0]>>4 <= 7 && b[1]&0x20 == 0 && (uint16(b[0])<<8|uint16(b[1]))%31 == 0
}

// release gives the layer's decoders back, ready for another body (a
// decoder that failed half-way is reset before its next use).
func (l *decoderLayer) release() {
	if l.gz != nil {
		gzipPool.Put(l.gz)
	}
	if l.zl != nil {
		zlibPool.Put(l.zl)
	}
	if l.fl != nil {
		flatePool.Put(l.fl)
	}
	if l.br != nil {
		l.br.Reset(nil)
		bufPool.Put(l.br)
	}
	if l.zstd != nil {
		_ = l.zstd.Reset(nil) // drops the reader; keeps the window for the next body
		zstdPool.Put(l.zstd)
	}
	*l = decoderLayer{}
}

package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"unsafe"
)

// The binary encoding of a recorded response, shared by the stores that
// keep records outside the process. It is compact (no JSON, no base64) and
// the body is its tail, so decoding never copies it:
//
//	version(1) flags(1) uvarint(status) header body...
//	header = uvarint(names) { uvarint(len) name uvarint(values) { uvarint(len) value } }
//
// Version 1 knows one flag, flagBodyOmitted, and ignores the others.
// Version 2 is version 1 with flags that a version 1 decoder must not
// ignore (flagOutcomeUnknown): a response is encoded as version 2 only
// when it carries one, so that a decoder of version 1 only (an instance
// not yet upgraded, in a rolling upgrade) refuses it (ErrCorrupt: its
// caller answers 503) instead of replaying it as a recorded response.
// Every other response is encoded as version 1, byte for byte as before.
const (
	codecVersion       = 1
	codecVersionMarked = 2
)

const (
	flagBodyOmitted    = 1 << 0
	flagOutcomeUnknown = 1 << 1 // version 2 only
)

// ErrCorrupt is wrapped by decoding errors.
var ErrCorrupt = errors.New("corrupt idempotency record")

// AppendResponse appends the encoding of r to dst.
func AppendResponse(dst []byte, r *Response) []byte {
	var flags byte
	version := byte(codecVersion)
	if r.BodyOmitted {
		flags |= flagBodyOmitted
	}
	if r.OutcomeUnknown {
		flags |= flagOutcomeUnknown
		version = codecVersionMarked
	}
	dst = append(dst, version, flags)
	dst = binary.AppendUvarint(dst, uint64(r.Status))
	dst = AppendHeader(dst, r.Header)
	return append(dst, r.Body...)
}

// EncodedOutcomeUnknown reports whether enc, an encoding AppendResponse
// made, is of a response marked OutcomeUnknown, from its first two bytes
// (the store's scans need no decoding).
func EncodedOutcomeUnknown(enc []byte) bool {
	return len(enc) >= 2 && enc[0] == codecVersionMarked && enc[1]&flagOutcomeUnknown != 0
}

// ResponseLen returns the length of the encoding of r, so that callers
// can allocate it exactly.
func ResponseLen(r *Response) int {
	n := 2 + uvarintLen(uint64(r.Status)) + uvarintLen(uint64(len(r.Header)))
	for name, values := range r.Header {
		n += uvarintLen(uint64(len(name))) + len(name) + uvarintLen(uint64(len(values)))
		for _, v := range values {
			n += uvarintLen(uint64(len(v))) + len(v)
		}
	}
	return n + len(r.Body)
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// DecodeResponse decodes an encoding made by AppendResponse. The returned
// Body, header names and header values alias b (a replay then copies
// nothing), so b must not be modified afterwards. A status that
// ValidStatus refuses is an error wrapping ErrCorrupt: such a record
// could not be replayed, so it must never be read as one.
func DecodeResponse(b []byte) (*Response, error) {
	r := new(Response)
	if err := DecodeResponseTo(r, b); err != nil {
		return nil, err
	}
	return r, nil
}

// DecodeResponseTo is DecodeResponse into r, for a store that allocates r
// with the record that holds it.
func DecodeResponseTo(r *Response, b []byte) error {
	return DecodeResponseInto(r, b, nil)
}

// DecodeResponseInto is DecodeResponseTo with the header values carved
// from values (its length is ignored) when they fit in its capacity, for
// a store that allocates that array with the record too. The header's
// slices are capped as ever: appending to one never writes past it.
func DecodeResponseInto(r *Response, b []byte, values []string) error {
	if len(b) < 2 {
		return fmt.Errorf("%w: %d bytes", ErrCorrupt, len(b))
	}
	if b[0] != codecVersion && b[0] != codecVersionMarked {
		return fmt.Errorf("%w: unknown version %d", ErrCorrupt, b[0])
	}
	*r = Response{BodyOmitted: b[1]&flagBodyOmitted != 0, OutcomeUnknown: b[0] == codecVersionMarked && b[1]&flagOutcomeUnknown != 0}
	d := decoder{b: b[2:], values: values[:0]}
	status := d.uvarint()
	if d.err == nil && !ValidStatus(int(min(status, 1000))) {
		d.fail("status %d", status)
	}
	r.Status = int(status)
	r.Header = d.header()
	if d.err != nil {
		return d.err
	}
	if len(d.b) > 0 {
		r.Body = d.b
	}
	return nil
}

// AppendHeader appends the encoding of h to dst, names in sorted order so
// that equal headers encode equally.
func AppendHeader(dst []byte, h http.Header) []byte {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	dst = binary.AppendUvarint(dst, uint64(len(names)))
	for _, name := range names {
		dst = appendString(dst, name)
		values := h[name]
		dst = binary.AppendUvarint(dst, uint64(len(values)))
		for _, v := range values {
			dst = appendString(dst, v)
		}
	}
	return dst
}

// DecodeHeader decodes an encoding made by AppendHeader; trailing bytes are
// an error.
func DecodeHeader(b []byte) (http.Header, error) {
	d := decoder{b: b}
	h := d.header()
	if d.err == nil && len(d.b) > 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return h, nil
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// decoder reads the encoding, remembering the first error so that callers
// check once at the end.
type decoder struct {
	b      []byte
	err    error
	values []string // where header values go first (DecodeResponseInto)
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
	}
	d.b = nil
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a count of items that each take at least one byte, so that a
// corrupt count cannot make the decoder allocate more than the input holds.
func (d *decoder) count() int {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("count %d exceeds %d remaining bytes", n, len(d.b))
		return 0
	}
	return int(n)
}

func (d *decoder) string() string {
	n := d.count()
	if d.err != nil {
		return ""
	}
	if n == 0 {
		return ""
	}
	// A view, not a copy: DecodeResponse's callers leave b unmodified.
	s := unsafe.String(&d.b[0], n)
	d.b = d.b[n:]
	return s
}

func (d *decoder) header() http.Header {
	names := d.count()
	if d.err != nil || names == 0 {
		return nil
	}
	h := make(http.Header, names)
	// The values of every name are carved from one array (most names
	// have one value); each slice is capped, so that appending to one
	// never writes into the next.
	all := d.values
	for range names {
		name := d.string()
		n := d.count()
		if d.err != nil {
			return nil
		}
		if cap(all)-len(all) < n {
			all = make([]string, 0, max(n, names))
		}
		start := len(all)
		for range n {
			all = append(all, d.string())
		}
		if d.err != nil {
			return nil
		}
		h[name] = all[start:len(all):len(all)]
	}
	return h
}

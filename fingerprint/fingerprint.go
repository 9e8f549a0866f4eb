package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash"
	"net/http"
	"net/textproto"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// Size is the length of a fingerprint.
const Size = sha256.Size

// version starts every hashed frame, so that a future change of the framing
// or of the canonical encoding cannot collide with fingerprints stored by
// this one: records written by an older instance during a rolling upgrade
// then mismatch (a 422) instead of silently matching something different.
const version = "caddy-idempotency/fingerprint/v1\x00"

// Body tags: a body that canonicalised as JSON is hashed in the canonical
// encoding, any other body as its raw bytes, and a body of codings that
// DecodeContent does not decode as its codings and its bytes. The tag
// keeps each kind from ever colliding with another.
const (
	bodyCanonical = 'J'
	bodyRaw       = 'R'
	bodyEncoded   = 'E'
)

// Fingerprinter computes request fingerprints: the SHA-256 of the parts of a
// request that must be equal for a retry to count as the same request.
// Configure it once with New; it is safe for concurrent use. The zero value
// (and a nil *Fingerprinter) hashes no headers and raw bodies.
type Fingerprinter struct {
	headers       []string // canonical MIME header keys, in configured order
	headerParts   []string // their parts' names in a detail: "header <Name>"
	canonicalJSON bool
	ignore        *pointerTrie // JSON members left out; nil for none
	ignoreKey     []byte       // the ignored pointers, sorted and framed: part of a detail
	memo          *sumMemo     // canonical sums by raw digest (memo.go); nil for none
}

// Options configure a Fingerprinter made with NewFingerprinter.
type Options struct {
	// Headers are the request headers hashed besides method, path, query
	// and body, in this order.
	Headers []string
	// CanonicalJSON hashes bodies declared as JSON in their canonical
	// encoding (see New).
	CanonicalJSON bool
	// Ignore lists members of JSON bodies left out of the fingerprint, at
	// any depth (an absent one is fine): volatile fields a client stamps
	// on each attempt, such as /sent_at. An ignored array element still
	// counts as an element, so that the others keep their positions.
	// Needs CanonicalJSON.
	Ignore []Pointer
}

// NewFingerprinter returns a Fingerprinter configured by o.
func NewFingerprinter(o Options) (*Fingerprinter, error) {
	if len(o.Ignore) > 0 && !o.CanonicalJSON {
		return nil, errors.New("ignoring JSON members needs canonical JSON")
	}
	f := New(o.Headers, o.CanonicalJSON)
	f.ignore = newPointerTrie(o.Ignore)
	f.ignoreKey = ignoreKey(o.Ignore)
	return f, nil
}

// New returns a Fingerprinter that hashes, besides method, path, query and
// body, the values of headers in the given order. Names are canonicalised
// here once (content-type becomes Content-Type) so that Sum can index the
// header map without allocating. When canonicalJSON is true, bodies that are
// declared as JSON (DeclaresJSON) and are valid JSON are hashed in their
// canonical encoding (see AppendCanonicalJSON), so that retries
// re-serialised by a client library still match; other bodies are hashed
// raw.
func New(headers []string, canonicalJSON bool) *Fingerprinter {
	f := &Fingerprinter{
		headers:       make([]string, len(headers)),
		headerParts:   make([]string, len(headers)),
		canonicalJSON: canonicalJSON,
		ignoreKey:     ignoreKey(nil),
	}
	if canonicalJSON {
		f.memo = newSumMemo()
	}
	for i, h := range headers {
		f.headers[i] = textproto.CanonicalMIMEHeaderKey(h)
		f.headerParts[i] = "header " + f.headers[i]
	}
	return f
}

// Headers returns a copy of the canonicalised header names that take part in
// the fingerprint.
func (f *Fingerprinter) Headers() []string {
	if f == nil {
		return nil
	}
	return append([]string(nil), f.headers...)
}

// CanonicalJSON reports whether JSON bodies are canonicalised.
func (f *Fingerprinter) CanonicalJSON() bool { return f != nil && f.canonicalJSON }

// sumState is the reusable state of one Sum call.
type sumState struct {
	h     hash.Hash
	frame []byte // everything but the body
	canon []byte // the canonical encoding of a JSON body
	name  []byte // the name of a detail's part
	seed  []byte // a detail's version and salt
	xx    xxhash.Digest
	spans []memberSpan // the members of a detail's body
	sum   [Size]byte
}

var sumPool = sync.Pool{New: func() any { return &sumState{h: sha256.New()} }}

// Sum appends the SHA-256 fingerprint of the request parts to dst and
// returns the extended slice. header may be nil; only the configured headers
// are read, by their canonical names. In steady state Sum allocates nothing
// when dst has room for Size more bytes.
//
// The hashed input is an injective framing, so that no two different
// requests produce the same input: a version tag, then method, path, raw
// query, each length-prefixed, then for each configured header its name and
// its value count followed by each value length-prefixed (an absent header
// has count 0, a header present but empty has count 1 and an empty value;
// Content-Type values in their normalised spelling, see
// normalizeMediaType), then a body tag ('J' canonical JSON, 'R' raw bytes)
// and the length-prefixed body. Only bodies declared as JSON (see
// DeclaresJSON) are canonicalised; any other body is compared byte for
// byte, so that "100" and "1e2" in a text/csv body differ.
//
// body is the request's content: a body whose Content-Encoding names
// codings that DecodeContent decodes is given decoded (so that a body
// sent gzipped and the same body sent as it is match), any other body as
// it was sent. A body with a coding that DecodeContent does not decode is
// compared byte for byte together with its codings (tag 'E', then the
// codings and the body, each length-prefixed), never canonicalised: it
// matches only the same bytes under the same codings.
func (f *Fingerprinter) Sum(dst []byte, method, path, rawQuery string, header http.Header, body []byte) []byte {
	dst, _ = f.SumJSON(dst, method, path, rawQuery, header, body)
	return dst
}

// SumJSON is Sum that also reports whether the body was hashed as canonical
// JSON (false when canonicalisation is off, the body is not declared as
// JSON, or it is not JSON it could canonicalise).
func (f *Fingerprinter) SumJSON(dst []byte, method, path, rawQuery string, header http.Header, body []byte) (sum []byte, canonical bool) {
	sum, _, canonical = f.sumJSON(dst, nil, false, method, path, rawQuery, header, body)
	return sum, canonical
}

// SumJSONCanonical is SumJSON that also appends to canon the canonical
// encoding it hashed, when it encoded the body (canonical, and not a
// request it remembered): what DetailCanonical takes, so that a request's
// detail does not canonicalise its body a second time.
func (f *Fingerprinter) SumJSONCanonical(dst, canon []byte, method, path, rawQuery string, header http.Header, body []byte) (sum, canonOut []byte, canonical bool) {
	return f.sumJSON(dst, canon, true, method, path, rawQuery, header, body)
}

func (f *Fingerprinter) sumJSON(dst, canon []byte, keep bool, method, path, rawQuery string, header http.Header, body []byte) (sum, canonOut []byte, canonical bool) {
	var cfg Fingerprinter
	if f != nil {
		cfg = *f
	}
	st := sumPool.Get().(*sumState)
	st.h.Reset()

	fr := append(st.frame[:0], version...)
	fr = appendString(fr, method)
	fr = appendString(fr, path)
	fr = appendString(fr, rawQuery)
	fr = binary.AppendUvarint(fr, uint64(len(cfg.headers)))
	for _, name := range cfg.headers {
		fr = appendString(fr, name)
		fr = appendHeaderValues(fr, name, header[name])
	}

	// A JSON body seen before, byte for byte, with the same frame: its
	// canonical sum is remembered (memo.go).
	encoded := undecodedCodings(header, body)
	memo := cfg.memo != nil && cfg.canonicalJSON && encoded == "" && DeclaresJSON(header)
	var raw memoKey
	prefix := len(fr)
	if memo {
		raw = cfg.memo.key(st, fr, body)
		fr = raw.framed // kept whole for put: the body's frame goes after it
		if cfg.memo.get(&raw, &st.sum) {
			dst = append(dst, st.sum[:]...)
			st.frame = fr
			putSumState(st)
			return dst, canon, true
		}
		st.h.Reset()
	}

	payload, tag := cfg.body(st, header, body, encoded)
	tail := len(fr)
	fr = append(fr, tag)
	fr = binary.AppendUvarint(fr, uint64(len(payload)))
	st.frame = fr

	st.h.Write(fr[:prefix])
	st.h.Write(fr[tail:])
	st.h.Write(payload)
	// Summing into the pooled array rather than into dst keeps dst away
	// from the hash.Hash interface, through which it would escape: callers
	// can then pass a stack array.
	st.h.Sum(st.sum[:0])
	dst = append(dst, st.sum[:]...)
	if memo && tag == bodyCanonical {
		cfg.memo.put(&raw, &st.sum)
	}
	if keep && tag == bodyCanonical {
		canon = append(canon, payload...)
	}
	putSumState(st)
	return dst, canon, tag == bodyCanonical
}

// body returns what of body is hashed, in st's buffer when canonical or
// encoded (the body's undecoded codings, "" for none), and its tag.
func (f *Fingerprinter) body(st *sumState, header http.Header, body []byte, encoded string) ([]byte, byte) {
	if encoded != "" {
		st.canon = append(appendString(st.canon[:0], encoded), body...)
		return st.canon, bodyEncoded
	}
	if !f.canonicalJSON || !DeclaresJSON(header) {
		return body, bodyRaw
	}
	canon, fail := appendCanonical(st.canon[:0], body, f.ignore)
	st.canon = canon
	if fail.reason != "" {
		return body, bodyRaw
	}
	return canon, bodyCanonical
}

// undecodedCodings names the codings of a body that DecodeContent does
// not decode ("" when there are none, or it decodes them). An empty body
// is empty content, however it is labelled.
func undecodedCodings(header http.Header, body []byte) string {
	values := header["Content-Encoding"]
	if len(values) == 0 || len(body) == 0 {
		return ""
	}
	return ParseCodings(values).Undecoded()
}

// appendString appends s with a uvarint length prefix, which keeps adjacent
// fields from running into each other ("ab"+"c" vs "a"+"bc").
// appendHeaderValues frames the values of the fingerprinted header name:
// their count, then each one, media types normalised.
func appendHeaderValues(dst []byte, name string, values []string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(values)))
	for _, v := range values {
		if name == "Content-Type" {
			v = normalizeMediaType(v)
		}
		dst = appendString(dst, v)
	}
	return dst
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// ignoreKey frames the distinct pointers of ps in sorted order: equal sets
// of ignored members give equal keys, whatever order they were given in.
func ignoreKey(ps []Pointer) []byte {
	raw := make([]string, len(ps))
	for i, p := range ps {
		raw[i] = p.raw
	}
	slices.Sort(raw)
	raw = slices.Compact(raw)
	key := binary.AppendUvarint(nil, uint64(len(raw)))
	for _, r := range raw {
		key = appendString(key, r)
	}
	return key
}

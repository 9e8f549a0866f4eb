package fingerprint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
)

// A detail is what a record keeps about the request that made it so that a
// later request reusing the key can be told which parts differ, without
// any part's value being kept: a random salt, then each part's name and
// the first bytes of SHA-256(salt, name, part). Parts are "method",
// "path", "query", "header <Name>" for each fingerprinted header, "body",
// and for a JSON object body each top-level member, named by its JSON
// Pointer ("/amount"). The salt is fresh for each record, so equal parts of
// two records do not show as equal digests.
//
//	version(1) salt(16) uvarint(count) { uvarint(len) name digest(8) }
const (
	detailVersion  = 1
	saltSize       = 16
	partDigestSize = 8

	// maxMemberParts and maxMemberName bound what a detail keeps of an
	// object body's members; a larger object is compared as a whole
	// ("body").
	maxMemberParts = 64
	maxMemberName  = 128
)

// errDetail: a detail that this version cannot read.
var errDetail = errors.New("malformed request detail")

// Detail returns the detail of a request (see Differs): what a record
// keeps so that the request of a later 422 can be told which parts
// differ. Bodies are taken as Sum takes them (declared JSON canonical,
// ignored members left out).
func (f *Fingerprinter) Detail(method, path, rawQuery string, header http.Header, body []byte) []byte {
	var salt [saltSize]byte
	binary.LittleEndian.PutUint64(salt[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(salt[8:], rand.Uint64())
	var out []byte
	f.parts(salt[:], method, path, rawQuery, header, body, func(count int) {
		out = make([]byte, 0, 1+saltSize+binary.MaxVarintLen64+count*(16+partDigestSize))
		out = append(out, detailVersion)
		out = append(out, salt[:]...)
		out = binary.AppendUvarint(out, uint64(count))
	}, func(name []byte, digest [partDigestSize]byte) {
		out = binary.AppendUvarint(out, uint64(len(name)))
		out = append(out, name...)
		out = append(out, digest[:]...)
	})
	return out
}

// Differs names the parts in which this request differs from the one
// whose detail is given: in order "method", "path", "query", each
// "header <Name>", "body", then the JSON Pointers of the top-level members
// that differ or are on one side only, sorted. ok is false when detail
// cannot be read (a record made by another version, or none at all).
func (f *Fingerprinter) Differs(detail []byte, method, path, rawQuery string, header http.Header, body []byte) (differs []string, ok bool) {
	salt, stored, err := parseDetail(detail)
	if err != nil {
		return nil, false
	}
	var current []part
	f.parts(salt, method, path, rawQuery, header, body, func(count int) {
		current = make([]part, 0, count)
	}, func(name []byte, digest [partDigestSize]byte) {
		current = append(current, part{string(name), digest})
	})
	seen := make(map[string]bool, len(current))
	var members []string
	bodySame := true
	for _, p := range current {
		seen[p.name] = true
		d, had := stored[p.name]
		same := had && d == p.digest
		switch {
		case p.name == "body":
			bodySame = same
			if !same {
				differs = append(differs, p.name)
			}
		case strings.HasPrefix(p.name, "/"):
			if !same {
				members = append(members, p.name)
			}
		case !same:
			differs = append(differs, p.name)
		}
	}
	for name := range stored {
		if !seen[name] && !strings.HasPrefix(name, "/") {
			differs = append(differs, name) // a header fingerprinted then, not now
		} else if !seen[name] {
			members = append(members, name)
		}
	}
	if !bodySame {
		slices.Sort(members)
		differs = append(differs, members...)
	}
	return differs, true
}

// part is one named part of a request and its salted digest.
type part struct {
	name   string
	digest [partDigestSize]byte
}

// parts calls start with the number of parts of the request, then emit
// for each part, in the order Differs reports them. The name passed to
// emit is only valid during the call. A part's digest is the first bytes
// of SHA-256(salt, uvarint(len(name)), name, value).
func (f *Fingerprinter) parts(salt []byte, method, path, rawQuery string, header http.Header, body []byte,
	start func(count int), emit func(name []byte, digest [partDigestSize]byte)) {
	var cfg Fingerprinter
	if f != nil {
		cfg = *f
	}
	st := sumPool.Get().(*sumState)
	defer func() {
		if cap(st.frame) <= maxPooledBytes && cap(st.canon) <= maxPooledBytes {
			sumPool.Put(st)
		}
	}()
	payload, tag := cfg.body(st, header, body)
	members := 0
	if tag == bodyCanonical {
		ok := canonicalMembers(payload, func(name, _ []byte) bool {
			members++
			return members <= maxMemberParts && len(name) <= maxMemberName
		})
		if !ok {
			members = 0 // compared as a whole
		}
	}
	start(4 + len(cfg.headers) + members)
	// A copy, so that salt does not escape through the hash.Hash interface.
	st.salt = append(st.salt[:0], salt...)

	// digest hashes st.frame (name and value, or its start) and then
	// value, and emits the part named st.name.
	digest := func(value []byte) {
		st.h.Reset()
		st.h.Write(st.salt)
		st.h.Write(st.frame)
		st.h.Write(value)
		st.h.Sum(st.sum[:0])
		emit(st.name, [partDigestSize]byte(st.sum[:partDigestSize]))
	}
	named := func(name string) []byte {
		st.name = append(st.name[:0], name...)
		return appendString(st.frame[:0], name)
	}
	st.frame = append(named("method"), method...)
	digest(nil)
	st.frame = append(named("path"), path...)
	digest(nil)
	st.frame = append(named("query"), rawQuery...)
	digest(nil)
	for _, name := range cfg.headers {
		st.name = append(append(st.name[:0], "header "...), name...)
		fr := binary.AppendUvarint(st.frame[:0], uint64(len(st.name)))
		fr = append(fr, st.name...)
		st.frame = appendHeaderValues(fr, name, header[name])
		digest(nil)
	}
	st.frame = append(named("body"), tag)
	digest(payload)
	if members == 0 {
		return
	}
	canonicalMembers(payload, func(name, member []byte) bool {
		st.name = appendPointer(st.name[:0], name)
		fr := binary.AppendUvarint(st.frame[:0], uint64(len(st.name)))
		st.frame = append(fr, st.name...)
		digest(member)
		return true
	})
}

// appendPointer appends the JSON Pointer of the top-level member name:
// "/" and the name with "~" and "/" escaped (RFC 6901 section 3).
func appendPointer(dst, name []byte) []byte {
	dst = append(dst, '/')
	for _, c := range name {
		switch c {
		case '~':
			dst = append(dst, '~', '0')
		case '/':
			dst = append(dst, '~', '1')
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// parseDetail reads a detail into its salt and digests by part name.
func parseDetail(b []byte) (salt []byte, digests map[string][partDigestSize]byte, err error) {
	if len(b) < 1+saltSize || b[0] != detailVersion {
		return nil, nil, errDetail
	}
	salt, d := b[1:1+saltSize], decoder{b: b[1+saltSize:]}
	n := d.count()
	digests = make(map[string][partDigestSize]byte, n)
	for range n {
		name := d.string()
		if d.err != nil || len(d.b) < partDigestSize {
			return nil, nil, errDetail
		}
		digests[name] = [partDigestSize]byte(d.b[:partDigestSize])
		d.b = d.b[partDigestSize:]
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, nil, errDetail
	}
	return salt, digests, nil
}

// decoder reads uvarint-framed data, remembering the first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errDetail
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a count of items that each take at least one byte.
func (d *decoder) count() int {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.err = errDetail
		return 0
	}
	return int(n)
}

func (d *decoder) string() string {
	n := d.count()
	if d.err != nil {
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// canonicalMembers calls fn with the decoded name and the encoding (name
// and value) of each member of the canonical encoding of an object, until
// fn returns false. It reports whether enc is an object and fn took every
// member.
func canonicalMembers(enc []byte, fn func(name, member []byte) bool) bool {
	if len(enc) == 0 || enc[0] != tagObject {
		return false
	}
	i := 1
	for i < len(enc) && enc[i] != endObject {
		start := i
		nameAt, nameEnd, ok := canonicalString(enc, i)
		if !ok {
			return false
		}
		if i, ok = skipCanonical(enc, nameEnd); !ok {
			return false
		}
		if !fn(enc[nameAt:nameEnd], enc[start:i]) {
			return false
		}
	}
	return i == len(enc)-1
}

// canonicalString reads the string encoding at i: where its bytes start
// and end.
func canonicalString(enc []byte, i int) (at, end int, ok bool) {
	if i >= len(enc) || enc[i] != tagString {
		return 0, 0, false
	}
	n, w := binary.Uvarint(enc[i+1:])
	if w <= 0 || n > uint64(len(enc)-i-1-w) {
		return 0, 0, false
	}
	at = i + 1 + w
	return at, at + int(n), true
}

// skipCanonical returns the index after the encoded value at i.
func skipCanonical(enc []byte, i int) (int, bool) {
	if i >= len(enc) {
		return 0, false
	}
	switch enc[i] {
	case tagNull, tagTrue, tagFalse, tagIgnored:
		return i + 1, true
	case tagNumber:
		end := bytes.IndexByte(enc[i:], ';')
		if end < 0 {
			return 0, false
		}
		return i + end + 1, true
	case tagString:
		_, end, ok := canonicalString(enc, i)
		return end, ok
	case tagArray, tagObject:
		closing := byte(endArray)
		if enc[i] == tagObject {
			closing = endObject
		}
		i++
		for i < len(enc) && enc[i] != closing {
			var ok bool
			if closing == endObject { // a member: its name first
				if _, i, ok = canonicalString(enc, i); !ok {
					return 0, false
				}
			}
			if i, ok = skipCanonical(enc, i); !ok {
				return 0, false
			}
		}
		if i >= len(enc) {
			return 0, false
		}
		return i + 1, true
	}
	return 0, false
}

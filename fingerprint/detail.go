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
// any part's value being kept: a random salt, then each part's name and a
// salted 64-bit digest of it. The salt is fresh for each record, so equal
// parts of two records do not show as equal digests.
//
//	version(1) salt(16) uvarint(count) { uvarint(len) name digest(8) }
//
// Version 3's digest is XXH64, seeded with the salt's first 8 bytes
// (little-endian), of the salt's last 8 bytes, the part's frame and
// value, big-endian; versions 1 and 2 took the first 8 bytes of
// SHA-256(salt, frame, value), at several times the cost per part (a
// 1 KiB object of 40 members has about 50 parts, and every new key pays
// for them). The digest only names what differs in a 422: the request's
// fingerprint, which decides, stays SHA-256 (Sum), so a collision costs
// at most a name missing from a 422's detail.
//
// The parts, in this order:
//
//   - "method", "path", "query", and "header <Name>" for each
//     fingerprinted header (its values as Sum frames them);
//   - "body": the body as Sum hashes it, its tag and its canonical
//     encoding or raw bytes;
//   - with canonical JSON on, "content json": whether Content-Type
//     declares JSON;
//   - for a body compared as canonical JSON, "json options": the ignored
//     pointers, under which its canonical encoding was made;
//   - for a JSON object body of at most maxMemberParts members, each named
//     in at most maxMemberName bytes: "object" (the list that follows is
//     complete), then each top-level member, named by its JSON Pointer
//     ("/amount"), in the order of the canonical encoding (a name given
//     twice is listed twice).
//
// Version 1 had no "content json", "json options" and "object"; version
// 2 has the parts of version 3 under SHA-256. Differs reads all three.
// The version changes so that an instance still running an older one
// during a rolling upgrade refuses a newer detail (its 422 then has no
// differs) instead of misreading it.
const (
	detailVersion   = 3
	detailVersionV2 = 2
	detailVersionV1 = 1
	saltSize        = 16
	partDigestSize  = 8

	// maxMemberParts and maxMemberName bound what a detail keeps of an
	// object body's members; a larger object is compared as a whole
	// ("body").
	maxMemberParts = 64
	maxMemberName  = 128
)

// Names of the body's parts. Differs names only "body", never the others,
// which say how the body was compared; none can be mistaken for a header
// ("header ...") or a member ("/...").
const (
	partBody        = "body"
	partContentJSON = "content json"
	partJSONOptions = "json options"
	partObject      = "object"
)

// errDetail: a detail that this version cannot read.
var errDetail = errors.New("malformed request detail")

// Detail returns the detail of a request (see Differs): what a record
// keeps so that the request of a later 422 can be told which parts
// differ. Bodies are taken as Sum takes them (declared JSON canonical,
// ignored members left out).
func (f *Fingerprinter) Detail(method, path, rawQuery string, header http.Header, body []byte) []byte {
	return f.DetailCanonical(method, path, rawQuery, header, body, nil)
}

// DetailCanonical is Detail given the canonical encoding of body that
// SumJSONCanonical appended for the same request, or nil when it appended
// none (the body is then taken as Detail takes it).
func (f *Fingerprinter) DetailCanonical(method, path, rawQuery string, header http.Header, body, canonical []byte) []byte {
	return f.detail(detailVersion, method, path, rawQuery, header, body, canonical)
}

// detail is DetailCanonical in the given version (2 or 3).
func (f *Fingerprinter) detail(version byte, method, path, rawQuery string, header http.Header, body, canonical []byte) []byte {
	var seed [1 + saltSize]byte // the detail's version and salt
	seed[0] = version
	binary.LittleEndian.PutUint64(seed[1:9], rand.Uint64())
	binary.LittleEndian.PutUint64(seed[9:], rand.Uint64())
	var out []byte
	f.parts(seed[:], method, path, rawQuery, header, body, canonical, func(count int) {
		out = make([]byte, 0, 1+saltSize+binary.MaxVarintLen64+count*(16+partDigestSize))
		out = append(out, seed[:]...)
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
// "header <Name>", "body", then, sorted, the JSON Pointers of top-level
// members of this request's body that differ from the first request's or
// that it lacked. ok is false when detail cannot be read (a record made
// by another version, or none at all).
//
// It names only what is known to differ, and never a member this request
// does not have (a probe would learn the names of another's members):
//
//   - the body, when the bytes differ and the bodies are not the same
//     canonical JSON under the same options; when the first request's
//     body was compared as JSON and this one's as bytes, only when it is
//     not the same JSON (the detail keeps no digest of a JSON body's
//     bytes);
//   - members only when both bodies were compared as canonical JSON under
//     the same options and differ, and never a name either body gives
//     twice, which parsers read differently;
//   - "header Content-Type" also when it is not fingerprinted but one
//     request declared JSON and the other did not, so that one body was
//     compared as JSON and the other as bytes;
//   - a header fingerprinted for the first request but not now is
//     compared with this request's; one fingerprinted now but not then
//     is not named, nothing being known of it.
//
// A detail of version 1 gives a shorter answer where it knows less (an
// empty object lists no members), and is read assuming that the
// canonical_json and ignore options have not changed since.
func (f *Fingerprinter) Differs(detail []byte, method, path, rawQuery string, header http.Header, body []byte) (differs []string, ok bool) {
	// Both sides are lists searched in place, on the stack for a request
	// of a few dozen parts: a 422 costs its answer, not a map per side.
	var storedParts, currentParts [maxListed]namedDigest
	var currentNames [maxListedNames]byte
	seed, stored, err := parseDetail(detail, storedParts[:0])
	if err != nil {
		return nil, false
	}
	differs = make([]string, 0, 4) // one allocation for the usual few
	cur := partList{names: currentNames[:0], parts: currentParts[:0]}
	f.parts(seed, method, path, rawQuery, header, body, nil, func(int) {}, func(name []byte, digest [partDigestSize]byte) {
		// Not a method of cur: appending through a pointer would move
		// the arrays to the heap.
		at := len(cur.names)
		cur.names = append(cur.names, name...)
		cur.parts = append(cur.parts, namedDigest{at, len(cur.names), digest})
	})
	// twice: a name either side lists more than once.
	twice := func(name []byte) bool { return stored.twice(name) || cur.twice(name) }
	// differ reports whether both sides have the part and its digests
	// differ: a part one side lacks is not known to differ.
	differ := func(name []byte) bool {
		s, sok := stored.digest(name)
		c, cok := cur.digest(name)
		return sok && cok && s != c
	}
	has := func(name string) bool { return slices.Contains(differs, name) }

	for _, p := range cur.parts {
		name := cur.name(p)
		if string(name) == "method" || string(name) == "path" || string(name) == "query" || bytes.HasPrefix(name, []byte("header ")) {
			if differ(name) {
				differs = append(differs, f.partName(name))
			}
		}
	}
	var then []string // headers fingerprinted then, not now
	for _, p := range stored.parts {
		if name := stored.name(p); bytes.HasPrefix(name, []byte("header ")) && !cur.has(name) && !slices.Contains(then, string(name)) {
			then = append(then, string(name))
		}
	}
	slices.Sort(then)
	for _, name := range then {
		if s, _ := stored.digest([]byte(name)); s != f.headerDigest(seed, name, header) {
			differs = append(differs, name)
		}
	}

	// How each body was compared: as canonical JSON (with "json options")
	// or as bytes; a detail of version 1 does not say.
	v1 := seed[0] == detailVersionV1
	storedJSON := stored.has([]byte(partJSONOptions))
	curJSON := cur.has([]byte(partJSONOptions))
	if name := "header Content-Type"; differ([]byte(partContentJSON)) && storedJSON != curJSON && !has(name) {
		differs = append(differs, name) // it changed how the body was compared
	}
	was, sameOptions := wasUnknown, true // version 1: options assumed unchanged
	if !v1 {
		was, sameOptions = wasRaw, false
		if storedJSON {
			options, _ := stored.digest([]byte(partJSONOptions))
			was, sameOptions = wasJSON, options == f.optionsDigest(seed)
		}
	}
	encoded := undecodedCodings(header, body) != ""
	storedBody, hadBody := stored.digest([]byte(partBody))
	curBody, _ := cur.digest([]byte(partBody))
	if !hadBody || !f.bodyDiffers(seed, storedBody, curBody, was, sameOptions, encoded, body) {
		return differs, true
	}
	differs = append(differs, partBody)
	complete := stored.has([]byte(partObject))
	if v1 {
		// Version 1 listed the members of a JSON object body, or none.
		for _, p := range stored.parts {
			if bytes.HasPrefix(stored.name(p), []byte("/")) {
				storedJSON, complete = true, true
				break
			}
		}
	}
	if !storedJSON || !curJSON || !sameOptions {
		return differs, true
	}
	members := len(differs)
	for _, p := range cur.parts {
		name := cur.name(p)
		if !bytes.HasPrefix(name, []byte("/")) || twice(name) {
			continue
		}
		if s, had := stored.digest(name); had && s != p.digest || !had && complete {
			differs = append(differs, string(name))
		}
	}
	slices.Sort(differs[members:])
	return differs, true
}

// maxListed and maxListedNames size the lists Differs keeps on its stack:
// a request of more parts, or longer names, moves them to the heap.
const (
	maxListed      = 32
	maxListedNames = 512
)

// partList is one side's parts as Differs searches them: each name a span
// of names, with its digest. A name listed twice (a member a body gives
// twice) is found as its last listing, as a map would keep it.
type partList struct {
	names []byte
	parts []namedDigest
}

// namedDigest is one part of a partList: its name, names[at:end], and
// digest.
type namedDigest struct {
	at, end int
	digest  [partDigestSize]byte
}

func (l partList) name(p namedDigest) []byte { return l.names[p.at:p.end] }

// digest returns the digest of the last part named name.
func (l partList) digest(name []byte) ([partDigestSize]byte, bool) {
	for i := len(l.parts) - 1; i >= 0; i-- {
		if bytes.Equal(l.name(l.parts[i]), name) {
			return l.parts[i].digest, true
		}
	}
	return [partDigestSize]byte{}, false
}

func (l partList) has(name []byte) bool {
	_, ok := l.digest(name)
	return ok
}

// twice reports whether name is listed more than once.
func (l partList) twice(name []byte) bool {
	n := 0
	for _, p := range l.parts {
		if bytes.Equal(l.name(p), name) {
			n++
		}
	}
	return n > 1
}

// parseDetail reads a detail of any version into its seed (the version
// and the salt) and parts,
// appended to parts; the names are spans of detail.
func parseDetail(detail []byte, parts []namedDigest) (seed []byte, l partList, err error) {
	if len(detail) < 1+saltSize || detail[0] < detailVersionV1 || detail[0] > detailVersion {
		return nil, l, errDetail
	}
	l = partList{names: detail, parts: parts}
	seed = detail[:1+saltSize]
	d := decoder{b: detail[1+saltSize:]}
	n := d.count()
	for range n {
		size := d.count()
		at := len(detail) - len(d.b)
		if d.err != nil || len(d.b) < size+partDigestSize {
			return nil, l, errDetail
		}
		d.b = d.b[size:]
		l.parts = append(l.parts, namedDigest{at, at + size, [partDigestSize]byte(d.b[:partDigestSize])})
		d.b = d.b[partDigestSize:]
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, l, errDetail
	}
	return seed, l, nil
}

// partName is name as a string, without a copy for the names every
// request has.
func (f *Fingerprinter) partName(name []byte) string {
	switch string(name) {
	case "method":
		return "method"
	case "path":
		return "path"
	case "query":
		return "query"
	}
	if f != nil {
		for _, h := range f.headerParts {
			if string(name) == h {
				return h
			}
		}
	}
	return string(name)
}

// storedBody is how the body of a detail was compared.
type storedBody int

const (
	wasUnknown storedBody = iota // version 1: as JSON or as bytes
	wasRaw
	wasJSON
)

// bodyDiffers reports whether the body is known to differ from the one
// whose "body" digest is stored, when this body's digest is cur. A digest
// of either form of this body (its bytes, its canonical encoding) that
// matches the stored one proves them equal in that form. A body compared
// once as JSON and once as bytes is therefore not named when it is the
// same JSON in other bytes: the detail holds no digest of the JSON body's
// bytes, and keeping one would cost every new key another pass over its
// body. A body of codings that are not decoded (encoded) equals only the
// same bytes under the same codings: its own digest.
func (f *Fingerprinter) bodyDiffers(seed []byte, stored, cur [partDigestSize]byte, was storedBody, sameOptions, encoded bool, body []byte) bool {
	if stored == cur {
		return false
	}
	if encoded {
		return true
	}
	if stored == f.bodyDigest(seed, bodyRaw, body) {
		return false
	}
	if was == wasRaw {
		return true // other bytes
	}
	if !sameOptions {
		return false // canonical encodings under other options cannot be compared
	}
	st := sumPool.Get().(*sumState)
	defer putSumState(st)
	var ignore *pointerTrie
	if f != nil {
		ignore = f.ignore
	}
	canon, fail := appendCanonical(st.canon[:0], body, ignore)
	st.canon = canon
	// Under the same options a canonical encoding that differs, or none
	// for a body that was canonicalised then, means other bytes too.
	return fail.reason != "" || stored != f.bodyDigest(seed, bodyCanonical, canon)
}

// bodyDigest is the digest of the part "body" of a body hashed with tag
// as payload.
func (f *Fingerprinter) bodyDigest(seed []byte, tag byte, payload []byte) [partDigestSize]byte {
	st := sumPool.Get().(*sumState)
	defer putSumState(st)
	st.seed = append(st.seed[:0], seed...)
	st.frame = append(appendString(st.frame[:0], partBody), tag)
	return st.digest(payload)
}

// optionsDigest is the digest of the part "json options" of this
// Fingerprinter.
func (f *Fingerprinter) optionsDigest(seed []byte) [partDigestSize]byte {
	st := sumPool.Get().(*sumState)
	defer putSumState(st)
	st.seed = append(st.seed[:0], seed...)
	st.frame = appendString(st.frame[:0], partJSONOptions)
	if f != nil {
		st.frame = append(st.frame, f.ignoreKey...)
	}
	return st.digest(nil)
}

// headerDigest is the digest of the part "header <Name>" of this request,
// for a header fingerprinted when the detail was made but not now.
func (f *Fingerprinter) headerDigest(seed []byte, part string, header http.Header) [partDigestSize]byte {
	st := sumPool.Get().(*sumState)
	defer putSumState(st)
	st.seed = append(st.seed[:0], seed...)
	name := strings.TrimPrefix(part, "header ")
	st.frame = appendHeaderValues(appendString(st.frame[:0], part), name, header[name])
	return st.digest(nil)
}

// digest returns the digest of a part of frame st.frame and value, in
// the version and with the salt of st.seed.
func (st *sumState) digest(value []byte) (d [partDigestSize]byte) {
	salt := st.seed[1:]
	if st.seed[0] < detailVersion {
		st.h.Reset()
		st.h.Write(salt)
		st.h.Write(st.frame)
		st.h.Write(value)
		st.h.Sum(st.sum[:0])
		return [partDigestSize]byte(st.sum[:partDigestSize])
	}
	st.xx.ResetWithSeed(binary.LittleEndian.Uint64(salt[:8]))
	st.xx.Write(salt[8:])
	st.xx.Write(st.frame)
	st.xx.Write(value)
	binary.BigEndian.PutUint64(d[:], st.xx.Sum64())
	return d
}

func putSumState(st *sumState) {
	if cap(st.frame) <= maxPooledBytes && cap(st.canon) <= maxPooledBytes {
		sumPool.Put(st)
	}
}

// parts calls start with the number of parts of the request, then emit
// for each part, in the order the detail lists them. The name passed to
// emit is only valid during the call. A part's digest is that of its
// frame (uvarint(len(name)), name, and for some parts more) and value
// under seed, the detail's version and salt (sumState.digest).
func (f *Fingerprinter) parts(seed []byte, method, path, rawQuery string, header http.Header, body, canonical []byte,
	start func(count int), emit func(name []byte, digest [partDigestSize]byte)) {
	var cfg Fingerprinter
	if f != nil {
		cfg = *f
	}
	st := sumPool.Get().(*sumState)
	defer putSumState(st)
	payload, tag := canonical, byte(bodyCanonical)
	if canonical == nil {
		payload, tag = cfg.body(st, header, body, undecodedCodings(header, body))
	}
	count := 4 + len(cfg.headers)
	if cfg.canonicalJSON {
		count++ // content json
	}
	members, listed := 0, false
	if tag == bodyCanonical {
		count++ // json options
		// One pass: the members are counted and kept for the emits below.
		st.spans = st.spans[:0]
		listed = canonicalMemberSpans(payload, func(m memberSpan) bool {
			members++
			if members > maxMemberParts || m.nameEnd-m.nameAt > maxMemberName {
				return false
			}
			st.spans = append(st.spans, m)
			return true
		})
		if listed {
			count += 1 + members // object, then the members
		}
	}
	start(count)
	// A copy, so that seed does not escape through the hash.Hash interface.
	st.seed = append(st.seed[:0], seed...)

	// part emits the part named st.name, of frame st.frame and value.
	part := func(value []byte) { emit(st.name, st.digest(value)) }
	named := func(name string) []byte {
		st.name = append(st.name[:0], name...)
		return appendString(st.frame[:0], name)
	}
	st.frame = append(named("method"), method...)
	part(nil)
	st.frame = append(named("path"), path...)
	part(nil)
	st.frame = append(named("query"), rawQuery...)
	part(nil)
	for _, name := range cfg.headers {
		st.name = append(append(st.name[:0], "header "...), name...)
		fr := binary.AppendUvarint(st.frame[:0], uint64(len(st.name)))
		fr = append(fr, st.name...)
		st.frame = appendHeaderValues(fr, name, header[name])
		part(nil)
	}
	st.frame = append(named(partBody), tag)
	part(payload)
	if cfg.canonicalJSON {
		declared := byte('0')
		if DeclaresJSON(header) {
			declared = '1'
		}
		st.frame = append(named(partContentJSON), declared)
		part(nil)
	}
	if tag != bodyCanonical {
		return
	}
	st.frame = append(named(partJSONOptions), cfg.ignoreKey...)
	part(nil)
	if !listed {
		return
	}
	st.frame = named(partObject)
	part(nil)
	for _, m := range st.spans {
		st.name = appendPointer(st.name[:0], payload[m.nameAt:m.nameEnd])
		fr := binary.AppendUvarint(st.frame[:0], uint64(len(st.name)))
		st.frame = append(fr, st.name...)
		part(payload[m.start:m.end])
	}
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

// canonicalMembers calls fn with the decoded name and the encoding (name
// and value) of each member of the canonical encoding of an object, until
// fn returns false. It reports whether enc is an object and fn took every
// member.
func canonicalMembers(enc []byte, fn func(name, member []byte) bool) bool {
	return canonicalMemberSpans(enc, func(m memberSpan) bool {
		return fn(enc[m.nameAt:m.nameEnd], enc[m.start:m.end])
	})
}

// memberSpan locates a member in a canonical encoding: its decoded name
// and its encoding (name and value).
type memberSpan struct{ nameAt, nameEnd, start, end int }

// canonicalMemberSpans is canonicalMembers by offsets.
func canonicalMemberSpans(enc []byte, fn func(m memberSpan) bool) bool {
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
		if !fn(memberSpan{nameAt, nameEnd, start, i}) {
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

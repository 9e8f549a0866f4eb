package fingerprint

import (
	"errors"
	"strconv"
	"sync"
)

// ErrNotCanonical is wrapped by every error of AppendCanonicalJSON: the body
// is not JSON, or is JSON this package refuses to canonicalise (too deep, an
// exponent out of range, a lone surrogate, ...).
var ErrNotCanonical = errors.New("body is not canonical JSON")

// MaxDepth is the deepest nesting of arrays and objects that
// AppendCanonicalJSON accepts. It bounds the parser's recursion, so hostile
// input cannot exhaust the stack.
const MaxDepth = 1000

// AppendCanonicalJSON appends to dst an injective canonical encoding of the
// JSON text src and returns the extended buffer.
//
// The encoding is meant to be hashed, not read back as JSON. Two texts get
// the same encoding exactly when they differ only in insignificant
// whitespace, in the order of object members with distinct names (members
// are sorted by their decoded names, byte-wise and stably, so duplicate names
// keep their source order), in how strings are escaped, or in how numbers
// are spelled (compared as exact decimals: 1, 1.0 and 10e-1 are equal, two
// integers beyond float64 precision are not).
//
// src must be a single RFC 8259 JSON value, in valid UTF-8, without a byte
// order mark, nested at most MaxDepth deep, with number exponents below 10^9
// in magnitude. Otherwise the error wraps ErrNotCanonical and the returned
// slice holds dst's original bytes, possibly in a larger buffer.
func AppendCanonicalJSON(dst, src []byte) ([]byte, error) {
	out, fail := appendCanonical(dst, src, nil)
	if fail.reason != "" {
		return out, &canonicalError{fail}
	}
	return out, nil
}

// syntaxFailure says why and where canonicalisation stopped. It is a plain
// value so that callers which only need success or failure, like
// Fingerprinter.Sum falling back to raw bytes, pay no allocation for it.
type syntaxFailure struct {
	reason string
	offset int
}

// canonicalError is the error value of AppendCanonicalJSON.
type canonicalError struct{ syntaxFailure }

func (e *canonicalError) Error() string {
	return ErrNotCanonical.Error() + ": " + e.reason + " at offset " + strconv.Itoa(e.offset)
}

func (e *canonicalError) Unwrap() error { return ErrNotCanonical }

// Tags of the canonical encoding. Every encoded value starts with one of
// them and is self-delimiting, and ']' and '}' are not tags, so a sequence
// of encoded values followed by a closing byte splits in only one way.
const (
	tagNull   = 'n'
	tagTrue   = 't'
	tagFalse  = 'f'
	tagNumber = 'd' // then the canonical number, then ';'
	tagString = 's' // then uvarint(len), then the decoded bytes
	tagArray  = '['
	tagObject = '{' // then (string, value) pairs sorted by name
	endArray  = ']'
	endObject = '}'
	// tagIgnored stands for an array element at an ignored pointer, so
	// that the elements after it keep their positions. Ignored object
	// members are left out altogether.
	tagIgnored = 'x'
)

// parser is the state of one canonicalisation. Scratch space that outlives
// a call comes from scratchPool.
type parser struct {
	src   []byte
	pos   int
	dst   []byte
	fail  syntaxFailure
	depth int
	sc    *scratch
	// ignore is where the value being parsed lies among the ignored
	// pointers: nil when none goes through it.
	ignore *pointerTrie
}

// scratch holds the buffers an object needs to sort its members, reused
// across calls so that a warm canonicalisation does not allocate.
type scratch struct {
	members []member // a stack: each open object owns a suffix
	keys    []sortKey
	region  []byte // copy of an object's members while they are permuted
}

// maxPooledBytes bounds the buffers kept in pools: one huge body must not pin
// its peak memory for the life of the process.
const maxPooledBytes = 1 << 20

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// appendCanonical is AppendCanonicalJSON with the failure as a plain value,
// leaving out the values at the pointers in ignore.
func appendCanonical(dst, src []byte, ignore *pointerTrie) ([]byte, syntaxFailure) {
	sc := scratchPool.Get().(*scratch)
	p := parser{src: src, dst: dst, sc: sc, ignore: ignore}
	p.run()
	if cap(sc.region) <= maxPooledBytes && cap(sc.members) <= maxPooledBytes/32 && cap(sc.keys) <= maxPooledBytes/16 {
		sc.members = sc.members[:0]
		scratchPool.Put(sc)
	}
	if p.fail.reason != "" {
		return p.dst[:len(dst)], p.fail
	}
	return p.dst, syntaxFailure{}
}

// run parses the single top-level value and the whitespace around it.
func (p *parser) run() {
	if len(p.src) >= 3 && p.src[0] == 0xEF && p.src[1] == 0xBB && p.src[2] == 0xBF {
		p.failAt("byte order mark", 0)
		return
	}
	p.skipSpace()
	if p.pos == len(p.src) {
		p.failAt("no JSON value", p.pos)
		return
	}
	if !p.value() {
		return
	}
	p.skipSpace()
	if p.pos != len(p.src) {
		p.failAt("data after the top-level value", p.pos)
	}
}

// failAt records the first failure and returns false, so that parsing
// functions can end with `return p.failAt(...)`.
func (p *parser) failAt(reason string, offset int) bool {
	if p.fail.reason == "" {
		p.fail = syntaxFailure{reason, offset}
	}
	return false
}

func (p *parser) skipSpace() {
	for p.pos < len(p.src) {
		switch p.src[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// value encodes the value at p.pos, which is not whitespace, and reports
// success.
func (p *parser) value() bool {
	if p.pos >= len(p.src) {
		return p.failAt("unexpected end of input", p.pos)
	}
	switch c := p.src[p.pos]; c {
	case '{':
		return p.object()
	case '[':
		return p.array()
	case '"':
		_, ok := p.string()
		return ok
	case 't':
		return p.literal("true", tagTrue)
	case 'f':
		return p.literal("false", tagFalse)
	case 'n':
		return p.literal("null", tagNull)
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return p.number()
		}
		return p.failAt("unexpected character", p.pos)
	}
}

func (p *parser) literal(word string, tag byte) bool {
	if len(p.src)-p.pos < len(word) || string(p.src[p.pos:p.pos+len(word)]) != word {
		return p.failAt("invalid literal", p.pos)
	}
	p.pos += len(word)
	p.dst = append(p.dst, tag)
	return true
}

// enter counts one more level of nesting; the limit keeps recursion bounded.
func (p *parser) enter() bool {
	p.depth++
	if p.depth > MaxDepth {
		return p.failAt("nesting deeper than "+strconv.Itoa(MaxDepth), p.pos)
	}
	return true
}

func (p *parser) array() bool {
	if !p.enter() {
		return false
	}
	p.pos++ // '['
	p.dst = append(p.dst, tagArray)
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == ']' {
		p.pos++
		p.dst = append(p.dst, endArray)
		p.depth--
		return true
	}
	parent := p.ignore
	var index [20]byte
	for i := 0; ; i++ {
		start := len(p.dst)
		if parent != nil {
			p.ignore = parent.child(strconv.AppendInt(index[:0], int64(i), 10))
		}
		if !p.value() {
			return false
		}
		if p.ignore != nil && p.ignore.terminal {
			p.dst = append(p.dst[:start], tagIgnored)
		}
		p.ignore = parent
		p.skipSpace()
		if p.pos >= len(p.src) {
			return p.failAt("unterminated array", p.pos)
		}
		switch p.src[p.pos] {
		case ',':
			p.pos++
			p.skipSpace()
		case ']':
			p.pos++
			p.dst = append(p.dst, endArray)
			p.depth--
			return true
		default:
			return p.failAt("expected ',' or ']'", p.pos)
		}
	}
}

func (p *parser) object() bool {
	if !p.enter() {
		return false
	}
	p.pos++ // '{'
	p.dst = append(p.dst, tagObject)
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == '}' {
		p.pos++
		p.dst = append(p.dst, endObject)
		p.depth--
		return true
	}
	// This object's members occupy p.sc.members[base:]; nested objects push
	// theirs above and pop them before the next member is recorded.
	base := len(p.sc.members)
	sorted := true
	parent := p.ignore
	for {
		if p.pos >= len(p.src) || p.src[p.pos] != '"' {
			return p.failAt("expected a member name", p.pos)
		}
		m := member{start: len(p.dst)}
		name, ok := p.string()
		if !ok {
			return false
		}
		m.nameStart, m.nameEnd = name, len(p.dst)
		p.skipSpace()
		if p.pos >= len(p.src) || p.src[p.pos] != ':' {
			return p.failAt("expected ':'", p.pos)
		}
		p.pos++
		p.skipSpace()
		p.ignore = parent.child(p.name(m))
		if !p.value() {
			return false
		}
		if p.ignore != nil && p.ignore.terminal {
			p.dst = p.dst[:m.start] // left out
		} else {
			m.end = len(p.dst)
			if len(p.sc.members) > base && sorted {
				sorted = p.inOrder(p.sc.members[len(p.sc.members)-1], m)
			}
			p.sc.members = append(p.sc.members, m)
		}
		p.ignore = parent
		p.skipSpace()
		if p.pos >= len(p.src) {
			return p.failAt("unterminated object", p.pos)
		}
		switch p.src[p.pos] {
		case ',':
			p.pos++
			p.skipSpace()
		case '}':
			p.pos++
			if !sorted && len(p.sc.members) > base {
				p.sortMembers(p.sc.members[base:])
			}
			p.sc.members = p.sc.members[:base]
			p.dst = append(p.dst, endObject)
			p.depth--
			return true
		default:
			return p.failAt("expected ',' or '}'", p.pos)
		}
	}
}

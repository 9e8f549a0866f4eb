package fingerprint

import (
	"encoding/binary"
	"unicode/utf8"
)

// plainByte marks the string bytes that are copied as they are: printable
// ASCII other than '"' and '\'. Anything else needs a closer look.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// string encodes the JSON string at p.pos (a '"') as tagString,
// uvarint(length), decoded UTF-8 bytes. It returns where the decoded bytes
// start in p.dst; they end at len(p.dst).
func (p *parser) string() (int, bool) {
	src := p.src
	start := p.pos + 1
	i := start
	for i < len(src) && plainByte[src[i]] {
		i++
	}
	if i < len(src) && src[i] == '"' {
		// Fast path, the common case: no escapes, pure ASCII, so the decoded
		// length is known before anything is written.
		p.dst = append(p.dst, tagString)
		p.dst = binary.AppendUvarint(p.dst, uint64(i-start))
		at := len(p.dst)
		p.dst = append(p.dst, src[start:i]...)
		p.pos = i + 1
		return at, true
	}
	return p.stringSlow(start, i)
}

// stringSlow decodes a string with escapes or non-ASCII bytes. The decoded
// length is only known at the end, so the bytes are decoded after a one-byte
// length slot, and shifted in the rare case the length needs more.
func (p *parser) stringSlow(start, i int) (int, bool) {
	src := p.src
	p.dst = append(p.dst, tagString, 0)
	slot := len(p.dst) - 1
	p.dst = append(p.dst, src[start:i]...)
	for {
		run := i
		for i < len(src) && plainByte[src[i]] {
			i++
		}
		p.dst = append(p.dst, src[run:i]...)
		if i >= len(src) {
			return 0, p.failAt("unterminated string", start-1)
		}
		switch c := src[i]; {
		case c == '"':
			p.pos = i + 1
			return p.fixLength(slot), true
		case c == '\\':
			n, ok := p.escape(i)
			if !ok {
				return 0, false
			}
			i += n
		case c < 0x20:
			return 0, p.failAt("control character in string", i)
		default:
			r, size := utf8.DecodeRune(src[i:])
			if r == utf8.RuneError && size <= 1 {
				return 0, p.failAt("invalid UTF-8", i)
			}
			p.dst = append(p.dst, src[i:i+size]...)
			i += size
		}
	}
}

// fixLength writes the uvarint length of the bytes after slot into slot,
// growing it when the length needs more than one byte, and returns where the
// bytes now start.
func (p *parser) fixLength(slot int) int {
	n := len(p.dst) - slot - 1
	if n < 0x80 {
		p.dst[slot] = byte(n)
		return slot + 1
	}
	var buf [binary.MaxVarintLen64]byte
	k := binary.PutUvarint(buf[:], uint64(n))
	p.dst = append(p.dst, buf[:k-1]...) // grow by k-1; the bytes are overwritten
	copy(p.dst[slot+k:], p.dst[slot+1:slot+1+n])
	copy(p.dst[slot:], buf[:k])
	return slot + k
}

// escape decodes the escape sequence at p.src[i] (a '\') into p.dst and
// returns its length in the source.
func (p *parser) escape(i int) (int, bool) {
	src := p.src
	if i+1 >= len(src) {
		return 0, p.failAt("unterminated string", i)
	}
	var c byte
	switch src[i+1] {
	case '"', '\\', '/':
		c = src[i+1]
	case 'b':
		c = '\b'
	case 'f':
		c = '\f'
	case 'n':
		c = '\n'
	case 'r':
		c = '\r'
	case 't':
		c = '\t'
	case 'u':
		return p.unicodeEscape(i)
	default:
		return 0, p.failAt("invalid escape", i)
	}
	p.dst = append(p.dst, c)
	return 2, true
}

// unicodeEscape decodes \uXXXX at p.src[i], or a \uXXXX\uXXXX surrogate
// pair. A lone surrogate is an error rather than U+FFFD: replacing it would
// make two different texts canonicalise alike.
func (p *parser) unicodeEscape(i int) (int, bool) {
	r, ok := hex4(p.src, i+2)
	if !ok {
		return 0, p.failAt("invalid \\u escape", i)
	}
	n := 6
	switch {
	case r >= 0xDC00 && r <= 0xDFFF:
		return 0, p.failAt("lone low surrogate", i)
	case r >= 0xD800 && r <= 0xDBFF:
		j := i + 6
		if j+1 >= len(p.src) || p.src[j] != '\\' || p.src[j+1] != 'u' {
			return 0, p.failAt("lone high surrogate", i)
		}
		lo, ok := hex4(p.src, j+2)
		if !ok || lo < 0xDC00 || lo > 0xDFFF {
			return 0, p.failAt("lone high surrogate", i)
		}
		r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
		n = 12
	}
	p.dst = utf8.AppendRune(p.dst, r)
	return n, true
}

// hex4 parses the four hex digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

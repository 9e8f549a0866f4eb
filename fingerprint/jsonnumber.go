package fingerprint

import "strconv"

// maxExponent bounds the decimal exponent of a canonical number. Larger
// ones are refused rather than computed: they would need arbitrary-precision
// exponents, and no real API sends 1e1000000000.
const maxExponent = 999_999_999

// number encodes the JSON number at p.pos exactly, without going through
// float64 (which would merge distinct large ids and round decimals), as
//
//	tagNumber "0" ";"                                  for any zero
//	tagNumber ["-"] digits "e" exponent ";"            otherwise
//
// where digits has no leading or trailing zeros and the value is
// digits × 10^exponent. Every nonzero value has exactly one such form, so
// 1, 1.0, 10e-1, 0.1e1 and 1E+0 all encode as "d1e0;", and 100 as "d1e2;".
func (p *parser) number() bool {
	src := p.src
	i := p.pos
	neg := src[i] == '-'
	if neg {
		i++
	}
	// Integer part: "0" or a nonzero digit followed by digits.
	intStart := i
	switch {
	case i < len(src) && src[i] == '0':
		i++
	case i < len(src) && src[i] >= '1' && src[i] <= '9':
		i = skipDigits(src, i+1)
	default:
		return p.failAt("invalid number", p.pos)
	}
	intEnd := i
	fracStart, fracEnd := i, i
	if i < len(src) && src[i] == '.' {
		fracStart = i + 1
		fracEnd = skipDigits(src, fracStart)
		if fracEnd == fracStart {
			return p.failAt("invalid number", p.pos)
		}
		i = fracEnd
	}
	var exp int64
	if i < len(src) && (src[i] == 'e' || src[i] == 'E') {
		var ok bool
		if exp, i, ok = parseExponent(src, i+1); !ok {
			if i < 0 {
				return p.failAt("exponent out of range", p.pos)
			}
			return p.failAt("invalid number", p.pos)
		}
	}
	p.pos = i

	// The significant digits run from the first to the last nonzero digit
	// across the integer and fraction parts.
	first := firstNonZero(src, intStart, intEnd)
	if first < 0 {
		first = firstNonZero(src, fracStart, fracEnd)
	}
	if first < 0 {
		// Every zero is the same value, whatever its sign or exponent.
		p.dst = append(p.dst, tagNumber, '0', ';')
		return true
	}
	last := lastNonZero(src, fracStart, fracEnd)
	var place int64 // the power of ten of the last significant digit
	if last >= 0 {
		place = -int64(last - fracStart + 1)
	} else {
		last = lastNonZero(src, intStart, intEnd)
		place = int64(intEnd - 1 - last)
	}
	exp += place
	if exp > maxExponent || exp < -maxExponent {
		return p.failAt("exponent out of range", intStart)
	}

	p.dst = append(p.dst, tagNumber)
	if neg {
		p.dst = append(p.dst, '-')
	}
	if first < intEnd && last >= fracStart {
		p.dst = append(p.dst, src[first:intEnd]...)
		p.dst = append(p.dst, src[fracStart:last+1]...)
	} else {
		p.dst = append(p.dst, src[first:last+1]...)
	}
	p.dst = append(p.dst, 'e')
	p.dst = strconv.AppendInt(p.dst, exp, 10)
	p.dst = append(p.dst, ';')
	return true
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

func firstNonZero(b []byte, start, end int) int {
	for i := start; i < end; i++ {
		if b[i] != '0' {
			return i
		}
	}
	return -1
}

func lastNonZero(b []byte, start, end int) int {
	for i := end - 1; i >= start; i-- {
		if b[i] != '0' {
			return i
		}
	}
	return -1
}

// parseExponent parses [+-]digits at b[i:]. Leading zeros are free, but more
// than nine significant digits are refused before they can overflow; that
// failure returns a negative index so the caller can tell it from bad syntax.
func parseExponent(b []byte, i int) (exp int64, next int, ok bool) {
	neg := false
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		neg = b[i] == '-'
		i++
	}
	start := i
	for i < len(b) && b[i] == '0' {
		i++
	}
	sig := i
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if i-sig >= 9 {
			return 0, -1, false
		}
		exp = exp*10 + int64(b[i]-'0')
	}
	if i == start {
		return 0, i, false
	}
	if neg {
		exp = -exp
	}
	return exp, i, true
}

package fingerprint

import "unicode/utf8"

// The RFC 9651 (Structured Field Values, which obsoletes RFC 8941) grammar
// for the parameters that may follow an Item:
//
//	parameters    = *( ";" *SP parameter )
//	parameter     = param-key [ "=" param-value ]
//	param-key     = key
//	key           = ( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" )
//	param-value   = bare-item
//	bare-item     = sf-integer / sf-decimal / sf-string / sf-token
//	                / sf-binary / sf-boolean / sf-date / sf-displaystring
//
// Parameters carry nothing the key needs, so they are only validated and
// skipped; validating them still matters, because anything that is not a
// parameter means the value is not the single sf-string the draft requires.

// skipParameters skips the parameters starting at v[i] and returns the index
// after them. It returns -(off+1) when the parameter starting at off is
// malformed, so that the caller can name the offset without an error value.
func skipParameters(v string, i, end int) int {
	for i < end && v[i] == ';' {
		param := i
		i++
		for i < end && v[i] == ' ' {
			i++
		}
		if i = skipSFKey(v, i, end); i < 0 {
			return -param - 1
		}
		if i < end && v[i] == '=' {
			if i = skipBareItem(v, i+1, end); i < 0 {
				return -param - 1
			}
		}
	}
	return i
}

func isLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }
func isDigit(c byte) bool   { return c >= '0' && c <= '9' }
func isAlpha(c byte) bool   { return c|0x20 >= 'a' && c|0x20 <= 'z' }

// skipSFKey skips a key at v[i]; it returns -1 when there is none.
func skipSFKey(v string, i, end int) int {
	if i >= end || !(isLCAlpha(v[i]) || v[i] == '*') {
		return -1
	}
	for i++; i < end; i++ {
		c := v[i]
		if !(isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
	}
	return i
}

// skipBareItem skips the bare item at v[i]; it returns -1 when there is none.
func skipBareItem(v string, i, end int) int {
	if i >= end {
		return -1
	}
	switch c := v[i]; {
	case c == '-' || isDigit(c):
		return skipSFNumber(v, i, end, true)
	case c == '"':
		closing, _, err := scanSFString(v, i, end)
		if err != nil {
			return -1
		}
		return closing + 1
	case isAlpha(c) || c == '*':
		for i++; i < end && isTokenChar(v[i]); i++ {
		}
		return i
	case c == ':':
		return skipSFBinary(v, i+1, end)
	case c == '?':
		if i+1 < end && (v[i+1] == '0' || v[i+1] == '1') {
			return i + 2
		}
		return -1
	case c == '@':
		return skipSFNumber(v, i+1, end, false)
	case c == '%':
		return skipSFDisplayString(v, i+1, end)
	}
	return -1
}

// skipSFNumber skips an sf-integer (up to 15 digits) or, when decimal is
// true, also an sf-decimal (up to 12 integer and 1 to 3 fraction digits).
func skipSFNumber(v string, i, end int, decimal bool) int {
	if i < end && v[i] == '-' {
		i++
	}
	start := i
	for i < end && isDigit(v[i]) {
		i++
	}
	digits := i - start
	if digits == 0 || digits > 15 {
		return -1
	}
	if !decimal || i >= end || v[i] != '.' {
		return i
	}
	if digits > 12 {
		return -1
	}
	i++
	start = i
	for i < end && isDigit(v[i]) {
		i++
	}
	if frac := i - start; frac == 0 || frac > 3 {
		return -1
	}
	return i
}

// isTokenChar reports whether c may follow the first character of an
// sf-token: tchar (RFC 9110) plus ":" and "/".
func isTokenChar(c byte) bool {
	if isAlpha(c) || isDigit(c) {
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~', ':', '/':
		return true
	}
	return false
}

// skipSFBinary skips the base64 content and closing ':' of an sf-binary
// whose opening ':' precedes v[i].
func skipSFBinary(v string, i, end int) int {
	for ; i < end; i++ {
		c := v[i]
		switch {
		case c == ':':
			return i + 1
		case isAlpha(c) || isDigit(c) || c == '+' || c == '/' || c == '=':
		default:
			return -1
		}
	}
	return -1
}

// skipSFDisplayString skips an sf-displaystring whose '%' precedes v[i]:
// a quoted string of printable ASCII in which '%' starts two lowercase hex
// digits, and the decoded bytes must be valid UTF-8.
func skipSFDisplayString(v string, i, end int) int {
	if i >= end || v[i] != '"' {
		return -1
	}
	// Validate the decoded bytes one rune at a time, so that no buffer is
	// needed for a value that is thrown away anyway.
	var r [utf8.UTFMax]byte
	n := 0
	for i++; i < end; i++ {
		c := v[i]
		switch {
		case c == '"':
			if n != 0 {
				return -1
			}
			return i + 1
		case c == '%':
			if i+2 >= end {
				return -1
			}
			hi, ok1 := lowerHex(v[i+1])
			lo, ok2 := lowerHex(v[i+2])
			if !ok1 || !ok2 {
				return -1
			}
			c = hi<<4 | lo
			i += 2
		case c < 0x20 || c > 0x7E:
			return -1
		}
		r[n] = c
		n++
		if utf8.FullRune(r[:n]) {
			if ru, size := utf8.DecodeRune(r[:n]); ru == utf8.RuneError && size <= 1 {
				return -1
			}
			n = 0
		}
	}
	return -1
}

func lowerHex(c byte) (byte, bool) {
	switch {
	case isDigit(c):
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

package fingerprint

import (
	"errors"
	"fmt"
	"strings"
)

// ErrMissing is returned by ParseKey when no header line carries a key.
var ErrMissing = errors.New("Idempotency-Key is missing")

// KeyError describes why a key is invalid. Its Error is a one-sentence,
// client-facing explanation, meant to be used verbatim as the detail of a
// 400 problem response. It never contains the key itself: the key may be
// huge or binary, and echoing it back would turn the error into a
// reflection vector.
type KeyError struct {
	// Reason is the client-facing sentence returned by Error.
	Reason string
}

// Error returns the client-facing reason.
func (e *KeyError) Error() string { return e.Reason }

func keyErrorf(format string, args ...any) *KeyError {
	return &KeyError{Reason: fmt.Sprintf(format, args...)}
}

// Reasons that take no arguments are shared values: the error path of a
// server under a flood of bad keys should not have to format strings.
var (
	errKeyEmpty        = &KeyError{Reason: "the Idempotency-Key is empty"}
	errKeyList         = &KeyError{Reason: "the Idempotency-Key is a list; send exactly one key"}
	errKeyUnterminated = &KeyError{Reason: "the Idempotency-Key has an unterminated string"}
)

// ParseKey returns the key carried by the header lines values, as found in
// r.Header[name].
//
// A key is either bare (visible ASCII, 0x21-0x7E, the spelling most clients
// use, including UUIDs that start with a digit) or an RFC 8941/9651 sf-string
// such as "abc", whose unescaped content is the key: "abc" and abc are the
// same key. Parameters after an sf-string are accepted and ignored. Optional
// whitespace around the value is ignored.
//
// maxLen bounds the length in bytes of the unquoted key; maxLen <= 0 means no
// limit. No header line gives ErrMissing; every other failure is a *KeyError.
// Offsets in error messages count bytes from the start of the header value.
//
// A bare key is returned as a substring of the input, so the common case does
// not allocate.
func ParseKey(values []string, maxLen int) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrMissing
	case 1:
	default:
		// Two lines are ambiguous: a proxy could pick either one, and the
		// draft treats a repeated header as a client error.
		return "", keyErrorf("the Idempotency-Key header appears on %d lines; send exactly one", len(values))
	}
	v := values[0]
	start, end := trimOWS(v)
	if start == end {
		return "", errKeyEmpty
	}
	var key string
	var err *KeyError
	if v[start] == '"' {
		key, err = parseQuotedKey(v, start, end)
	} else {
		key, err = parseBareKey(v, start, end)
	}
	if err != nil {
		return "", err
	}
	if key == "" {
		return "", errKeyEmpty
	}
	if maxLen > 0 && len(key) > maxLen {
		return "", keyErrorf("the Idempotency-Key is %d characters long; the limit is %d", len(key), maxLen)
	}
	return key, nil
}

// trimOWS returns the bounds of v without the optional whitespace (SP, HTAB)
// that RFC 9110 allows around a field value.
func trimOWS(v string) (start, end int) {
	start, end = 0, len(v)
	for start < end && (v[start] == ' ' || v[start] == '\t') {
		start++
	}
	for end > start && (v[end-1] == ' ' || v[end-1] == '\t') {
		end--
	}
	return start, end
}

// parseBareKey accepts v[start:end] when every byte is visible ASCII.
func parseBareKey(v string, start, end int) (string, *KeyError) {
	for i := start; i < end; i++ {
		c := v[i]
		if c >= 0x21 && c <= 0x7E {
			if c == ',' {
				// A proxy that folds two header lines joins them with a
				// comma, so "k1,k2" is most likely two keys, not one.
				return "", errKeyList
			}
			continue
		}
		return "", badByte(c, i)
	}
	return v[start:end], nil
}

// badByte explains a byte that may not appear in a key, naming it in hex
// rather than echoing it.
func badByte(c byte, off int) *KeyError {
	switch {
	case c == ' ':
		return keyErrorf("the Idempotency-Key contains a space at offset %d; quote the key as a string to include spaces", off)
	case c >= 0x80:
		return keyErrorf("the Idempotency-Key contains a non-ASCII byte 0x%02X at offset %d", c, off)
	default:
		return keyErrorf("the Idempotency-Key contains a non-printable byte 0x%02X at offset %d", c, off)
	}
}

// parseQuotedKey parses the sf-string starting at v[start] (a '"'), then any
// parameters, and returns its unescaped content. end excludes trailing OWS.
func parseQuotedKey(v string, start, end int) (string, *KeyError) {
	closing, escapes, err := scanSFString(v, start, end)
	if err != nil {
		return "", err
	}
	var key string
	if escapes == 0 {
		key = v[start+1 : closing]
	} else {
		key = unescapeSFString(v[start+1:closing], escapes)
	}
	i := skipParameters(v, closing+1, end)
	if i < 0 {
		return "", keyErrorf("the Idempotency-Key has an invalid parameter at offset %d", -i-1)
	}
	if i == end {
		return key, nil
	}
	j := i
	for j < end && (v[j] == ' ' || v[j] == '\t') {
		j++
	}
	if j < end && v[j] == ',' {
		return "", errKeyList
	}
	return "", keyErrorf("the Idempotency-Key has unexpected characters after the quoted key at offset %d", i)
}

// scanSFString validates the sf-string starting at v[start] (a '"') and
// returns the index of its closing quote and the number of escapes in it.
func scanSFString(v string, start, end int) (closing, escapes int, err *KeyError) {
	for i := start + 1; i < end; i++ {
		switch c := v[i]; {
		case c == '"':
			return i, escapes, nil
		case c == '\\':
			if i+1 >= end {
				return 0, 0, errKeyUnterminated
			}
			if n := v[i+1]; n != '"' && n != '\\' {
				return 0, 0, keyErrorf(`the Idempotency-Key has an invalid escape at offset %d; only \" and \\ may be escaped`, i)
			}
			escapes++
			i++
		case c < 0x20 || c > 0x7E:
			return 0, 0, badByte(c, i)
		}
	}
	return 0, 0, errKeyUnterminated
}

// unescapeSFString drops the backslash of each of the escapes in s, which
// scanSFString has already validated.
func unescapeSFString(s string, escapes int) string {
	var b strings.Builder
	b.Grow(len(s) - escapes)
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// scopeTemplate evaluates the scope option into the string that, hashed,
// names a client in the store. Placeholder values are encoded so that no
// two different tuples of values give one string: ("acme corp", "bob")
// and ("acme", "corp bob") must be two clients under the template
// "{X-Tenant} {X-User}".
//
// Each value but the last has its backslashes, and the first character of
// the literal text that follows it, escaped with a backslash; the last
// value is followed only by fixed text. The string can then be parsed back
// into its values in exactly one way. A value without those characters is
// unchanged, so the default template ("{http.request.host}
// {http.request.header.Authorization}": a host never holds a space or a
// backslash) gives the same scopes, and the same stored records, as the
// plain substitution of earlier versions. Templates in which two
// placeholders touch, or where the text after one starts with a
// backslash, cannot be parsed back that way; there every value is written
// as its length, a colon and the value.
type scopeTemplate struct {
	texts          []string // texts[0] starts the scope; texts[i+1] follows placeholder i
	keys           []string // the placeholders, in order
	direct         []directValue
	escapes        []byte // per placeholder but the last: the character to escape
	lengthPrefixed bool
	blankText      bool // the template's own text is blank
}

// placeholderMark stands in for each placeholder while the template is
// parsed; templates cannot contain it.
const placeholderMark = "\x00"

// newScopeTemplate parses template with Caddy's own placeholder syntax
// (escaped braces included), so that it finds the placeholders Caddy would
// replace.
func newScopeTemplate(template string) (*scopeTemplate, error) {
	if strings.Contains(template, placeholderMark) {
		return nil, errors.New("scope must not contain a NUL character")
	}
	t := new(scopeTemplate)
	marked, err := caddy.NewEmptyReplacer().ReplaceFunc(template, func(key string, _ any) (any, error) {
		t.keys = append(t.keys, key)
		return placeholderMark, nil
	})
	if err != nil {
		return nil, err
	}
	t.texts = strings.Split(marked, placeholderMark)
	t.direct = make([]directValue, len(t.keys))
	for i, key := range t.keys {
		t.direct[i] = directValueOf(key)
	}
	t.blankText = strings.TrimSpace(strings.Join(t.texts, "")) == ""
	// texts[i] follows placeholder i-1; the last text ends the string.
	for i := 1; i < len(t.texts)-1; i++ {
		text := t.texts[i]
		if text == "" || text[0] == '\\' {
			t.lengthPrefixed, t.escapes = true, nil
			break
		}
		t.escapes = append(t.escapes, text[0])
	}
	return t, nil
}

// evaluate returns the request's scope, and false when it is blank (no
// client identity at all).
func (t *scopeTemplate) evaluate(repl *caddy.Replacer) (scope string, ok bool) {
	b, ok := t.appendScope(nil, repl, nil)
	return string(b), ok
}

// hash returns the hex SHA-256 of the request's scope (how scopes reach
// the store), and false when the scope is blank. An observing handler's
// scopes are kept apart from an enforcing one's (prefix): in a shared
// store, its records must never look like an enforcing handler's, which
// would then answer 409 or replay a response it never recorded. The scope
// is built on the stack when it is short, as it usually is: the only
// allocation is the result.
func (t *scopeTemplate) hash(repl *caddy.Replacer, r *http.Request, prefix string) (string, bool) {
	var buf [256]byte
	b := append(buf[:0], prefix...)
	b, ok := t.appendScope(b, repl, r)
	return hashHexBytes(b), ok
}

// observedScopePrefix starts the scope of an observing handler's records.
// A NUL cannot appear in a template (see newScopeTemplate), so no
// enforcing scope starts with it.
const observedScopePrefix = "\x00observe\x00"

// appendScope appends the request's scope to b. Placeholders of the
// request's host and headers are read from r when it is given (scope_test
// holds them to the replacer's values).
func (t *scopeTemplate) appendScope(b []byte, repl *caddy.Replacer, r *http.Request) ([]byte, bool) {
	b = append(b, t.texts[0]...)
	blank := t.blankText
	for i, key := range t.keys {
		s, ok := t.direct[i].read(r, repl)
		if !ok {
			v, _ := repl.Get(key)
			s = caddy.ToString(v)
		}
		if blank && strings.TrimSpace(s) != "" {
			blank = false
		}
		switch {
		case t.lengthPrefixed:
			b = strconv.AppendInt(b, int64(len(s)), 10)
			b = append(b, ':')
			b = append(b, s...)
		case i < len(t.escapes):
			b = appendEscaped(b, s, t.escapes[i])
		default:
			b = append(b, s...)
		}
		b = append(b, t.texts[i+1]...)
	}
	return b, !blank
}

// appendEscaped appends s to b with a backslash before every backslash
// and every c.
func appendEscaped(b []byte, s string, c byte) []byte {
	if strings.IndexByte(s, '\\') < 0 && strings.IndexByte(s, c) < 0 {
		return append(b, s...)
	}
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' || s[i] == c {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return b
}

// hashHex returns the hex SHA-256 of s: how scopes reach the store.
func hashHex(s string) string {
	return hashHexBytes([]byte(s))
}

// hashHexBytes is hashHex of b, with one allocation: the result.
func hashHexBytes(b []byte) string {
	sum := sha256.Sum256(b)
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], sum[:])
	return string(out[:])
}

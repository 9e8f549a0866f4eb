package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
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
	template       string
	escapes        []byte // per placeholder but the last: the character to escape
	lengthPrefixed bool
	blankText      bool // the template's own text is blank
}

// placeholderMark stands in for each placeholder while the template is
// parsed; templates cannot contain it.
const placeholderMark = "\x00"

// newScopeTemplate parses template with Caddy's own placeholder syntax
// (escaped braces included), so that it finds the placeholders Caddy will
// replace.
func newScopeTemplate(template string) (*scopeTemplate, error) {
	if strings.Contains(template, placeholderMark) {
		return nil, errors.New("scope must not contain a NUL character")
	}
	marked, err := caddy.NewEmptyReplacer().ReplaceFunc(template, func(string, any) (any, error) {
		return placeholderMark, nil
	})
	if err != nil {
		return nil, err
	}
	texts := strings.Split(marked, placeholderMark)
	t := &scopeTemplate{template: template, blankText: strings.TrimSpace(strings.Join(texts, "")) == ""}
	// texts[i] follows placeholder i-1; the last text ends the string.
	for i := 1; i < len(texts)-1; i++ {
		text := texts[i]
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
	i, blank := 0, t.blankText
	out, _ := repl.ReplaceFunc(t.template, func(_ string, val any) (any, error) {
		s := caddy.ToString(val)
		if blank && strings.TrimSpace(s) != "" {
			blank = false
		}
		switch {
		case t.lengthPrefixed:
			s = strconv.Itoa(len(s)) + ":" + s
		case i < len(t.escapes):
			s = escapeScopeValue(s, t.escapes[i])
		}
		i++
		return s, nil
	})
	return out, !blank
}

// escapeScopeValue puts a backslash before every backslash and every c in
// s.
func escapeScopeValue(s string, c byte) string {
	if strings.IndexByte(s, '\\') < 0 && strings.IndexByte(s, c) < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' || s[i] == c {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// hashHex returns the hex SHA-256 of s: how scopes reach the store.
func hashHex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

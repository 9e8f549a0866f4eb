// Package redact keeps passwords out of messages: it finds the secrets in
// a connection string (a DSN or a Redis URL, well formed or not), hides
// them in a DSN shown to an operator, and scrubs them from an error whose
// message a driver or a server wrote. A driver that misreads a DSN (a
// scheme typo such as postgress:// makes pgx read the whole URL as one
// keyword) may quote any part of it, so errors are scrubbed of the
// secrets the DSN holds wherever it was misread, not only where it parses.
// It is public and free of Caddy, for the storage libraries and for any
// backend's adapter (a third party's too) that shows where its store is.
package redact

import (
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// Mask replaces a secret.
const Mask = "xxxxx"

// keyword matches a password given as a keyword/value pair or a query
// parameter (password=..., sentinel_password=..., also quoted), and the
// keywords a typo makes of it (pasword, passwd, pwd).
var keyword = regexp.MustCompile(`(?i)(?:^|[\s?&;,])[a-z_]*(?:pas|pw|wor|wd)[a-z_]*\s*=\s*('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s&;,]*)`)

// scheme matches what precedes a URL's userinfo, typos included:
// "postgres://", "postgress://", "redis//", "rediss:/", "redis:".
var scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.\-]*(?::/{0,3}|/{1,3})`)

// Secrets returns the passwords that dsn holds, however it is written: the
// password of a URL's userinfo (user:password@host, whatever precedes it,
// and its parts between the '/', '?' and '#' that a parser cuts it at),
// and the value of every password keyword or query parameter, each as
// written and decoded (unquoted, unescaped). Nothing in dsn needs to parse.
func Secrets(dsn string) []string {
	var out []string
	add := func(s string) {
		if s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	for _, field := range strings.Fields(dsn) {
		at := strings.LastIndexByte(field, '@')
		if at < 0 {
			continue
		}
		// In a URL that parses with a userinfo, it ends at the last '@'
		// of the authority: one may follow in the query.
		if u, err := url.Parse(field); err == nil && u.User != nil {
			if _, rest, ok := strings.Cut(field, "//"); ok {
				start := len(field) - len(rest)
				if end := strings.IndexAny(rest, "/?#"); end >= 0 {
					rest = rest[:end]
				}
				if i := strings.LastIndexByte(rest, '@'); i >= 0 {
					at = start + i
				}
			}
		}
		userinfo := scheme.ReplaceAllString(field[:at], "")
		if _, pw, ok := strings.Cut(userinfo, ":"); ok {
			add(pw)
			if dec, err := url.PathUnescape(pw); err == nil {
				add(dec)
			}
			// A '/', '?' or '#' not percent-encoded (a base64
			// password's '/') ends the authority where a URL parser
			// reads it, which then quotes a part as the port or path.
			if strings.ContainsAny(pw, "/?#") {
				for _, part := range strings.FieldsFunc(pw, func(c rune) bool { return c == '/' || c == '?' || c == '#' }) {
					add(part)
				}
			}
		}
	}
	for _, m := range keyword.FindAllStringSubmatch(dsn, -1) {
		v := m[1]
		if len(v) >= 2 && (v[0] == '\'' || v[0] == '"') {
			v = v[1 : len(v)-1]
			add(unescape(v))
		}
		add(v)
		if dec, err := url.QueryUnescape(v); err == nil {
			add(dec)
		}
	}
	return out
}

// unescape removes the backslashes of a quoted keyword value.
func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// DSN returns dsn with every password it holds (see Secrets) masked, fit
// for a message: postgres://user:xxxxx@host/db, password=xxxxx.
func DSN(dsn string) string { return Scrub(dsn, Secrets(dsn)) }

// Scrub returns s with every secret in it masked, the longest first (a
// secret may contain a shorter one).
func Scrub(s string, secrets []string) string {
	if len(secrets) == 0 {
		return s
	}
	sorted := slices.Clone(secrets)
	slices.SortFunc(sorted, func(a, b string) int { return len(b) - len(a) })
	for _, secret := range sorted {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, Mask)
		}
	}
	return s
}

// Error is an error whose message is scrubbed of secrets. It unwraps to
// the error it wraps, so that errors.Is and errors.As see through it; only
// its message is changed.
type Error struct {
	err     error
	secrets []string
}

// Wrap returns err with its message scrubbed of secrets (see Error): nil
// for nil, err itself when there are no secrets.
func Wrap(err error, secrets []string) error {
	if err == nil || len(secrets) == 0 {
		return err
	}
	if e, ok := err.(*Error); ok && slices.Equal(e.secrets, secrets) {
		return err
	}
	return &Error{err: err, secrets: secrets}
}

func (e *Error) Error() string { return Scrub(e.err.Error(), e.secrets) }

// Unwrap returns the error e scrubs.
func (e *Error) Unwrap() error { return e.err }

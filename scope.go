package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/backend/cfargs"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
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
	// identity marks the placeholders an authentication handler sets
	// ({http.auth.*}): empty, the scope would be shared by every client
	// that handler had not authenticated yet (one ordered after
	// idempotency in a route), so the scope is blank then.
	identity []bool
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
	for _, key := range t.keys {
		if err := checkPlaceholder(key); err != nil {
			return nil, err
		}
	}
	t.texts = strings.Split(marked, placeholderMark)
	t.direct = make([]directValue, len(t.keys))
	t.identity = make([]bool, len(t.keys))
	for i, key := range t.keys {
		t.direct[i] = directValueOf(key)
		t.identity[i] = strings.HasPrefix(key, "http.auth.")
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

// emptyDetail is the detail of the problem a request gets whose scope
// is blank: it names the template's placeholders, all empty.
func (t *scopeTemplate) emptyDetail() string {
	names := make([]string, len(t.keys))
	for i, key := range t.keys {
		names[i] = "{" + key + "}"
	}
	detail := "the scope that keys belong to is empty for this request: its placeholders " + strings.Join(names, ", ") +
		" were all empty (a credential or header the request lacks, or a misspelt placeholder in the scope option)"
	if slices.Contains(t.identity, true) {
		detail += ", or an authentication placeholder ({http.auth.*}) was: no authentication handler set it before idempotency ran " +
			"(order the authentication handler before idempotency in the route)"
	}
	return detail
}

// The placeholders a scope may hold: those Caddy's replacer and caddyhttp
// set before a handler runs (docs/caddyfile.md, scope). A scope is read
// before the next handler runs, so placeholders of a response, of a proxy
// or of this handler's own outcome are always empty there; a name that no
// module sets is a typo, which would leave every request's scope blank or
// shared.
var (
	// requestPlaceholders are caddyhttp's {http.request.*} placeholders
	// of fixed names.
	requestPlaceholders = []string{
		"method", "scheme", "proto", "proto_name", "host", "port", "hostport",
		"local", "local.host", "local.port", "remote", "remote.host", "remote.port",
		"uri", "uri_escaped", "uri.path", "uri.path_escaped", "uri.path.file", "uri.path.dir",
		"uri.path.file.base", "uri.path.file.ext", "uri.query", "uri.query_escaped", "uri.prefixed_query",
		"duration", "duration_ms", "uuid", "body", "body_base64",
		"orig_method", "orig_uri", "orig_uri.path", "orig_uri.path.file", "orig_uri.path.dir",
		"orig_uri.query", "orig_uri.prefixed_query",
	}
	// requestPrefixes are those of a name of the request's choosing.
	requestPrefixes = []string{"header.", "cookie.", "tls.", "uri.query.", "remote.host/"}
	// indexedPrefixes end in a number: a label of the host, a segment of
	// the path.
	indexedPrefixes = []string{"host.labels.", "uri.path.", "orig_uri.path."}
	// httpNamespaces are the http.* namespaces other modules fill before
	// the handler runs: vars (and the vars directive, client_ip),
	// authentication, the regexp and file matchers, handle_errors.
	httpNamespaces = []string{"vars", "auth", "regexp", "matchers", "error"}
	// afterNamespaces are set only once the next handler answered.
	afterNamespaces = []string{"response", "reverse_proxy", "intercept", "idempotency"}
	// globalPlaceholders are Caddy's own, of fixed names.
	globalPlaceholders = []string{"system.hostname", "system.slash", "system.os", "system.wd", "system.arch",
		"time.now", "time.now.http", "time.now.rfc3339", "time.now.common_log", "time.now.year", "time.now.unix", "time.now.unix_ms",
		"http.shutting_down", "http.time_until_shutdown"}
)

// checkPlaceholder reports what is wrong with the placeholder key in a
// scope: a namespace or a name nobody sets before the handler runs, and
// {http.request.header.Host}, which is always empty (Go keeps the Host
// header out of the request's header map).
func checkPlaceholder(key string) error {
	ns, rest, _ := strings.Cut(key, ".")
	switch ns {
	case "env", "file":
		if rest != "" {
			return nil
		}
		return fmt.Errorf("scope: {%s} is not a placeholder Caddy knows: it names no variable or file", key)
	case "system", "time":
		if slices.Contains(globalPlaceholders, key) {
			return nil
		}
		return fmt.Errorf("scope: {%s} is not one of Caddy's placeholders%s", key, cfargs.DidYouMean(key, globalPlaceholders))
	case "http":
		sub, name, _ := strings.Cut(rest, ".")
		switch {
		case slices.Contains(globalPlaceholders, key):
			return nil
		case sub == "request":
			return checkRequestPlaceholder(key, name)
		case slices.Contains(httpNamespaces, sub) && (name != "" || sub == "error"):
			return nil
		case slices.Contains(afterNamespaces, sub):
			return fmt.Errorf("scope: {%s} is set once the next handler answered, and is always empty when the scope is read, before it runs", key)
		}
		return fmt.Errorf("scope: {%s} is not a placeholder Caddy sets before this handler runs; the http ones are {http.request.*}, {http.vars.*}, {http.auth.*}, {http.regexp.*}, {http.matchers.*} and {http.error.*}", key)
	}
	return fmt.Errorf("scope: {%s} is not a placeholder Caddy knows: its namespace %q is none of http, env, file, system and time (in JSON, write {http.request.host}, not the Caddyfile's {host})", key, ns)
}

// checkRequestPlaceholder checks key, an {http.request.*} placeholder,
// whose name follows http.request.
func checkRequestPlaceholder(key, name string) error {
	if header, ok := strings.CutPrefix(name, "header."); ok && strings.EqualFold(header, "Host") {
		return errors.New("scope: {http.request.header.Host} is always empty (Go keeps the Host header out of the request's headers); use {http.request.host}")
	}
	if slices.Contains(requestPlaceholders, name) {
		return nil
	}
	for _, prefix := range requestPrefixes {
		if strings.HasPrefix(name, prefix) && len(name) > len(prefix) {
			return nil
		}
	}
	for _, prefix := range indexedPrefixes {
		if n, ok := strings.CutPrefix(name, prefix); ok {
			if _, err := strconv.Atoi(n); err == nil {
				return nil
			}
		}
	}
	return fmt.Errorf("scope: {%s} is not one of caddyhttp's request placeholders%s", key, cfargs.DidYouMean(name, requestPlaceholders))
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
// allocation is hs, which holds the scope's digits and, once the request
// has a key, its key hash's (keyHashes.keyHash).
func (t *scopeTemplate) hash(repl *caddy.Replacer, r *http.Request, prefix string) (scope string, hs *keyHashes, ok bool) {
	var buf [256]byte
	b := append(buf[:0], prefix...)
	b, ok = t.appendScope(b, repl, r)
	hs = new(keyHashes)
	sum := sha256.Sum256(b)
	hex.Encode(hs[:2*sha256.Size], sum[:])
	return unsafe.String(&hs[0], 2*sha256.Size), hs, ok
}

// keyHashes holds the hex digits of a request's scope hash (its
// storage.Key.Scope) and of its key hash, in one allocation that the two
// strings share. It is not part of the exchange: the scope goes to the
// store, and what keeps it (a store's index, the replay cache) must not
// keep the exchange alive. Each part is written once, before the string
// over it is made.
type keyHashes [2*sha256.Size + storage.HashLen]byte

// keyHash returns k.Hash(), its digits written into hs.
func (hs *keyHashes) keyHash(k storage.Key) string {
	d := k.Digest()
	out := hs[2*sha256.Size:]
	hex.Encode(out, d[:storage.HashLen/2])
	return unsafe.String(&out[0], len(out))
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
	blank, unauthenticated := t.blankText, false
	for i, key := range t.keys {
		s, ok := t.direct[i].read(r, repl)
		if !ok {
			v, _ := repl.Get(key)
			s = caddy.ToString(v)
		}
		if blank && strings.TrimSpace(s) != "" {
			blank = false
		}
		if t.identity[i] && s == "" {
			unauthenticated = true
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
	return b, !blank && !unauthenticated
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

// directValue reads a scope placeholder of the request's host or of one
// of its headers from the request itself, with caddyhttp's definition of
// the value, but without the replacer's cost: its lookup walks every
// provider, boxes each value, and allocates an error for a host without
// a port (the common case), per request.
type directValue struct {
	kind   uint8
	header string // the canonical header name, for directHeader
}

const (
	directNone     uint8 = iota // through the replacer
	directHost                  // {http.request.host}
	directHostPort              // {http.request.hostport}
	directHeader                // {http.request.header.*}
)

func directValueOf(key string) directValue {
	switch {
	case key == "http.request.host":
		return directValue{kind: directHost}
	case key == "http.request.hostport":
		return directValue{kind: directHostPort}
	case strings.HasPrefix(key, "http.request.header."):
		return directValue{kind: directHeader, header: textproto.CanonicalMIMEHeaderKey(strings.TrimPrefix(key, "http.request.header."))}
	}
	return directValue{}
}

// read returns the value, and false when it must come from the replacer.
// Hosts are read as HTTP compares them (foldHost), also without r (the
// admin API's and the hash command's scopes, from values given).
//
// The host is the Host of the request the replacer is bound to, which is
// not always r's: Caddy's tracing, forward_auth (and other handle_response
// routes) and handle_errors pass on a shallow copy of the request, and a
// request_header Host after them changes the copy's Host only. The
// replacer's {http.request.hostport} is that request's Host as it is; only
// the split is done here, without the error SplitHostPort allocates for a
// host without a port. (Headers need no such care: a shallow copy shares
// the header map. They differ from the replacer's only after a handler
// that passes on a deep copy, r.Clone, and then changes the header, or a
// module that repl.Sets an http.request.header placeholder: Caddy's own
// handlers do neither, and the header as it reaches this handler is the
// client's identity it acts on.)
func (d directValue) read(r *http.Request, repl *caddy.Replacer) (string, bool) {
	switch d.kind {
	case directHost:
		if r == nil {
			v, _ := repl.Get("http.request.host")
			return foldHost(caddy.ToString(v)), true
		}
		v, _ := repl.Get("http.request.hostport")
		hostport := caddy.ToString(v)
		host, _, ok := splitHostPort(hostport)
		if !ok {
			host = hostport // as Caddy's {http.request.host} leaves it
		}
		return foldHost(host), true
	case directHostPort:
		v, _ := repl.Get("http.request.hostport")
		var tls bool
		if r != nil {
			tls = r.TLS != nil
		} else {
			scheme, _ := repl.GetString("http.request.scheme")
			tls = scheme == "https"
		}
		return foldHostPort(caddy.ToString(v), tls), true
	case directHeader:
		if r == nil {
			return "", false
		}
		return strings.Join(r.Header[d.header], ","), true
	}
	return "", false
}

// foldHost returns a host as HTTP compares hosts (RFC 9110 4.2.3, RFC
// 3986 6.2.2): letters in lower case, without the trailing dot of an
// absolute name, an IPv6 literal without brackets in its canonical form
// (RFC 5952). So "LocalHost" and "localhost." are "localhost", and
// "[::1]" and "[0:0::1]" are "::1", the value of {http.request.host} for
// "[::1]:443". A host in that form already (the usual case: clients send
// lower-case names) comes back as it is, without allocating: the scopes
// of records written before hosts were folded stay the same.
func foldHost(host string) string {
	if len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	if len(host) > 1 && host[len(host)-1] == '.' {
		host = host[:len(host)-1]
	}
	upper := false
	for i := 0; i < len(host); i++ {
		if c := host[i]; 'A' <= c && c <= 'Z' {
			upper = true
			break
		}
	}
	if upper {
		host = strings.ToLower(host) // ASCII: a Host is an ASCII name (IDNs in their A-labels) or an IP
	}
	if strings.IndexByte(host, ':') >= 0 {
		if ip, err := netip.ParseAddr(host); err == nil {
			var buf [64]byte
			if canon := ip.AppendTo(buf[:0]); string(canon) != host {
				return string(canon)
			}
		}
	}
	return host
}

// foldHostPort is foldHost of a host and port, without the port when it
// is the scheme's default (80 for http, 443 for https over TLS) or empty
// (RFC 3986 6.2.3): "Example.COM:443" over TLS is "example.com". An IPv6
// literal keeps its brackets, as Host spells it. A value that is no host
// and port is only folded.
func foldHostPort(hostport string, tls bool) string {
	host, port, ok := splitHostPort(hostport)
	if !ok {
		return foldHost(hostport)
	}
	folded := foldHost(host)
	// A port is a number (RFC 3986 6.2.2.2 compares it as one): "080" is 80.
	if len(port) > 1 && port[0] == '0' {
		port = strings.TrimLeft(port, "0")
		if port == "" {
			port = "0"
		}
		hostport = "" // changed: joined again below
	}
	if port == "" || port == "80" && !tls || port == "443" && tls {
		if strings.IndexByte(folded, ':') >= 0 {
			return "[" + folded + "]"
		}
		return folded
	}
	if folded == host && hostport != "" {
		return hostport // as it came: no allocation
	}
	return net.JoinHostPort(folded, port)
}

// splitHostPort splits a Host value into host and port as
// net.SplitHostPort does, but without an error (and its allocation) for a
// host without a port: "example.com" is the host "example.com" and no
// port; "[::1]" the host "::1". ok is false for what is no host and port
// ("a:b:c", an unclosed bracket).
func splitHostPort(hostport string) (host, port string, ok bool) {
	if strings.HasPrefix(hostport, "[") {
		end := strings.IndexByte(hostport, ']')
		if end < 0 {
			return "", "", false
		}
		host, rest := hostport[1:end], hostport[end+1:]
		switch {
		case rest == "":
			return host, "", true
		case rest[0] != ':':
			return "", "", false
		}
		return host, rest[1:], true
	}
	i := strings.LastIndexByte(hostport, ':')
	if i < 0 {
		return hostport, "", true
	}
	if strings.IndexByte(hostport[:i], ':') >= 0 {
		return "", "", false // a bare IPv6 address, or no host at all
	}
	return hostport[:i], hostport[i+1:], true
}

package model

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
)

// decision is what the contract says the handlers do with an attempt,
// before any store is asked: pass it on untouched, refuse it, or take
// its key (keyed).
type decision struct {
	kind   string // transparent, reject, nethttp, keyed
	status int    // reject
	slug   string // reject: the problem type's last part
	why    string
	h      int    // the handler that refused or keyed it
	pol    Policy // its effective policy
	rk     recKey // keyed
	fp     string // keyed: the fingerprint (hex)
	parts  reqParts
}

// recKey names a record: handlers of a trial share one store.
type recKey struct{ scope, key string }

// reqParts are the parts of a request a 422 may name.
type reqParts struct {
	method, path, query string
	header              map[string]string // fingerprinted headers, media type normalised
	body                []byte
	coding              string // the codings of a body the handler does not decode ("" none)
	jsonDeclared        bool
}

// bodyView is what the handlers see of an attempt's body.
type bodyView struct {
	wire    []byte // the bytes sent
	content []byte // what they decode to: what max_body_size bounds
	coded   bool   // a Content-Encoding the handler decodes
	corrupt bool   // ... which the bytes sent do not follow
	// undecoded names the codings of a body the handler does not decode
	// ("" none): its bytes are its content, compared with the coding.
	undecoded string
}

func (a *Attempt) bodyView() bodyView {
	v := bodyView{wire: a.bodyOnWire(), content: a.content()}
	list, known := codings(a.Form.Coding)
	switch {
	case len(list) == 0 || len(v.wire) == 0: // an empty body is empty, however labelled
	case !known:
		v.content, v.undecoded = v.wire, strings.Join(list, ", ")
	default:
		v.coded, v.corrupt = true, a.Form.Corrupt
	}
	return v
}

// wireLimit is how many bytes a body may be sent in: max_body_size,
// and for a coded body the coding's overhead on top (the contract: a
// 64th and 256 bytes), so that content of any coding under the limit
// is taken.
func (v bodyView) wireLimit(limit int64) int64 {
	if !v.coded {
		return limit
	}
	return limit + limit/64 + 256
}

// decide walks the handlers the attempt's path reaches, outermost
// first. An observing handler never answers nor takes a key; the
// outermost enforcing one that takes the key (or refuses the request)
// decides; a handler that passes a request on (method not covered, no key
// and not required) leaves it to the next.
func decide(cfg *Config, a *Attempt) decision {
	if a.hasControlBytes() {
		return decision{kind: "nethttp", why: "net/http refuses control bytes in header values"}
	}
	u, _ := url.Parse(a.Target)
	for i, raw := range cfg.Layout.Handlers {
		if i == 1 && !raw.matches(u.Path) {
			break // the inner handler sits under its path matcher
		}
		if i == 0 && len(cfg.Layout.Handlers) == 1 && !raw.matches(u.Path) {
			break
		}
		if raw.Observe {
			continue
		}
		p := raw.effective()
		if !p.covers(a.Method) {
			continue
		}
		d, decided := decideOne(p, a, u)
		if decided {
			d.h, d.pol = i, p
			return d
		}
	}
	return decision{kind: "transparent"}
}

func reject(status int, slug, why string) (decision, bool) {
	return decision{kind: "reject", status: status, slug: slug, why: why}, true
}

// decideOne is one enforcing handler's decision, in the order the
// handler checks: key header, scope, body size, key in the body,
// fingerprint.
func decideOne(p Policy, a *Attempt, u *url.URL) (decision, bool) {
	lines := a.headerValues(p.Header)
	var id string
	if len(lines) > 0 {
		var ok bool
		if id, ok = parseKey(lines, p.MaxKeyLength); !ok {
			return reject(400, "key-invalid", "malformed key")
		}
	} else if p.KeyJSON == "" {
		if p.Required {
			return reject(400, "key-missing", "no key")
		}
		return decision{}, false
	}
	scope := a.Host + "\x00"
	if p.HostPortScope && a.Form.Port == "other" {
		scope = a.Host + ":8443\x00" // another origin; a default port is none
	}
	if auth, ok := a.header("Authorization"); ok {
		scope += auth
	}
	if p.TenantScope {
		tenant, _ := a.header("X-Tenant")
		if strings.TrimSpace(tenant) == "" {
			return reject(400, "scope-empty", "blank scope")
		}
		scope = "tenant\x00" + tenant
	}
	b := a.bodyView()
	if int64(len(b.wire)) > b.wireLimit(p.MaxBodySize) || int64(len(b.content)) > p.MaxBodySize {
		return reject(413, "body-too-large", "body over max_body_size")
	}
	if b.corrupt {
		return reject(400, "body-encoding-invalid", "the body does not decode as its Content-Encoding says")
	}
	if id == "" {
		if b.undecoded != "" {
			return reject(415, "body-encoding-unsupported", "key_json in a body of a coding the handler does not decode")
		}
		var found, ok bool
		id, found, ok = keyFromJSON(a.Body, p.MaxKeyLength)
		switch {
		case !ok:
			return reject(400, "key-invalid", "bad key in the body")
		case !found && p.Required:
			return reject(400, "key-missing", "no key in the body")
		case !found:
			return decision{}, false
		}
	}
	ct, _ := a.header("Content-Type")
	declared := declaresJSON(ct)
	canonical := !p.NotCanonical
	if canonical && declared && b.undecoded == "" && len(a.Body) > 0 && !json.Valid(a.Body) {
		return reject(400, "body-invalid-json", "body declared as JSON is not JSON")
	}
	// The fingerprint: of the plain body where the spelling sent cannot
	// matter (JSON compared by meaning, or the body as it is), of the
	// bytes the handler compares otherwise, and for a coding it does not
	// decode, of the bytes sent and the coding.
	body, suffix := a.Body, ""
	switch {
	case b.undecoded != "":
		body, suffix, canonical = b.wire, "|"+b.undecoded, false
	case !(canonical && declared):
		body = b.content
	}
	opts := fingerprint.Options{Headers: p.FPHeaders, CanonicalJSON: canonical}
	if canonical {
		opts.Ignore = pointers(p.Ignore)
	}
	f, err := fingerprint.NewFingerprinter(opts)
	if err != nil {
		panic(err)
	}
	hdr := a.httpHeader()
	sum := f.Sum(nil, a.Method, u.EscapedPath(), u.RawQuery, hdr, body)
	parts := reqParts{method: a.Method, path: u.EscapedPath(), query: u.RawQuery, header: map[string]string{}, body: body, coding: b.undecoded, jsonDeclared: declared && canonical}
	for _, name := range p.FPHeaders {
		v := strings.Join(hdr.Values(name), ",")
		if strings.EqualFold(name, "Content-Type") {
			v = mediaType(v)
		}
		parts.header[http.CanonicalHeaderKey(name)] = v
	}
	return decision{kind: "keyed", rk: recKey{scope, id}, fp: fmt.Sprintf("%x%s", sum, suffix), parts: parts}, true
}

func pointers(ss []string) []fingerprint.Pointer {
	var out []fingerprint.Pointer
	for _, s := range ss {
		p, err := fingerprint.ParsePointer(s)
		if err != nil {
			panic(err)
		}
		out = append(out, p)
	}
	return out
}

// parseKey is the contract's key syntax: one header line holding a bare
// key (visible ASCII, no comma, not starting with a quote) or a quoted
// string of the same characters; at most max bytes unquoted.
func parseKey(lines []string, max int) (string, bool) {
	if len(lines) != 1 {
		return "", false
	}
	v := strings.Trim(lines[0], " \t")
	if strings.HasPrefix(v, `"`) {
		if len(v) < 2 || !strings.HasSuffix(v, `"`) {
			return "", false
		}
		v = v[1 : len(v)-1]
		if strings.ContainsAny(v, `"\`) {
			return "", false
		}
	}
	if v == "" || len(v) > max {
		return "", false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7e || v[i] == ',' {
			return "", false
		}
	}
	return v, true
}

// keyFromJSON is key_json /id: found says whether the body names a key,
// ok whether that key is acceptable. A body that is not JSON, or has no
// /id (or null), has no key; one with two /id members is ambiguous.
func keyFromJSON(body []byte, max int) (id string, found, ok bool) {
	if !json.Valid(body) {
		return "", false, true
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return "", false, true
	}
	var raw json.RawMessage
	seen := 0
	for dec.More() {
		name, _ := dec.Token()
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return "", false, true
		}
		if name == "id" {
			seen++
			raw = v
		}
	}
	switch {
	case seen == 0 || string(raw) == "null":
		return "", false, true
	case seen > 1:
		return "", true, false
	case raw[0] == '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", true, false
		}
		id, valid := parseKey([]string{s}, max)
		return id, true, valid && !strings.Contains(s, `"`)
	}
	if _, err := strconv.ParseInt(string(raw), 10, 64); err == nil || isDigits(string(raw)) {
		return string(raw), true, len(raw) <= max
	}
	return "", true, false
}

func isDigits(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func mediaType(ct string) string {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.ToLower(strings.TrimSpace(mt))
}

func declaresJSON(ct string) bool {
	mt := mediaType(ct)
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// httpHeader is the attempt's header as the server parses it.
func (a *Attempt) httpHeader() http.Header {
	h := make(http.Header)
	for _, kv := range a.Header {
		h.Add(kv[0], kv[1])
	}
	return h
}

// hasControlBytes reports whether a header value holds a byte net/http
// refuses (a control byte other than HTAB).
func (a *Attempt) hasControlBytes() bool {
	for _, kv := range a.Header {
		for i := 0; i < len(kv[1]); i++ {
			if c := kv[1][i]; c < 0x20 && c != '\t' || c == 0x7f {
				return true
			}
		}
	}
	return false
}

// differsSound reports the names of a 422's differs that name nothing
// that differs between the recorded request (rec) and this one (cur), or
// a member this request does not have.
func differsSound(names []string, rec, cur reqParts) []string {
	var wrong []string
	for _, n := range names {
		switch {
		case n == "method":
			if rec.method == cur.method {
				wrong = append(wrong, n)
			}
		case n == "path":
			if rec.path == cur.path {
				wrong = append(wrong, n)
			}
		case n == "query":
			if rec.query == cur.query {
				wrong = append(wrong, n)
			}
		case strings.HasPrefix(n, "header "):
			h := http.CanonicalHeaderKey(strings.TrimPrefix(n, "header "))
			if rec.header[h] == cur.header[h] {
				wrong = append(wrong, n)
			}
		case n == "body":
			if rec.coding == cur.coding && (bytes.Equal(rec.body, cur.body) || rec.jsonDeclared && cur.jsonDeclared && canonEqual(rec.body, cur.body)) {
				wrong = append(wrong, n)
			}
		case strings.HasPrefix(n, "/"):
			name := strings.TrimPrefix(n, "/")
			cv, cok := member(cur.body, name)
			rv, rok := member(rec.body, name)
			if !cok || rok && canonEqual(rv, cv) {
				wrong = append(wrong, n)
			}
		}
	}
	return wrong
}

func canonEqual(a, b []byte) bool {
	ca, err1 := fingerprint.AppendCanonicalJSON(nil, a)
	cb, err2 := fingerprint.AppendCanonicalJSON(nil, b)
	return err1 == nil && err2 == nil && bytes.Equal(ca, cb)
}

// member returns the top-level member name of a JSON object body.
func member(body []byte, name string) ([]byte, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return nil, false
	}
	v, ok := m[name]
	return v, ok
}

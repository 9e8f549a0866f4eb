package model

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"unicode/utf8"

	"github.com/klauspost/compress/zstd"
)

// Form is how an attempt spells its request where HTTP lets one request
// be spelt several ways (version 3): host case, a trailing dot, an
// explicit default port (RFC 9110 4.2.3, RFC 3986 6.2.3), header-name
// case, a content coding of the body (RFC 9110 8.4), other whitespace,
// member order and escapes of a JSON body, the media type's case and
// JSON's charset. Attempt.Host, Header and Body hold the plain spelling,
// which the oracle judges (decide.go): a variant the contract calls the
// same request is the same to the oracle by construction, whatever the
// handler makes of it. The client sends the spelling Form says. The zero
// Form is the plain spelling.
//
// Some forms make another request, which the oracle tells apart: a
// coding the handler does not decode (the body is then other bytes), a
// port other than the default under a {http.request.hostport} scope, a
// JSON body respelt where it is compared as bytes.
type Form struct {
	HostCase string // "upper", "mixed"; "" as it is
	HostDot  bool   // a trailing dot: the absolute name
	Port     string // "default": the scheme's port, explicit; "other": 8443; "" none
	Names    string // header names "lower", "upper", "mixed" (HTTP/1.1: HTTP/2 and 3 send them in lower case)
	// Coding is Content-Encoding as sent: codings in the order they were
	// applied, any case and alias ("" none). A coding the model does not
	// know (br, compress, an unknown token) labels the plain body.
	Coding     string
	RawDeflate bool // deflate as a raw stream, as some clients send it, instead of zlib's format
	Stream     bool // zstd as a streamed frame: no content size, an 8 MiB window
	Corrupt    bool // the encoded body loses its last 4 bytes: it does not decode
	// MediaType spells Content-Type: mediaCase, or for JSON a charset
	// parameter to add ("; charset=utf-8" in some spelling).
	MediaType string
	Respell   uint64 // a JSON body's whitespace, member order and escapes drawn from this seed (0: as it is)
}

// mediaCase spells the media type in other case (Form.MediaType).
const mediaCase = "case"

func (f Form) String() string {
	if f == (Form{}) {
		return ""
	}
	var parts []string
	add := func(cond bool, s string) {
		if cond {
			parts = append(parts, s)
		}
	}
	add(f.HostCase != "", "host "+f.HostCase)
	add(f.HostDot, "host dot")
	add(f.Port != "", "port "+f.Port)
	add(f.Names != "", "names "+f.Names)
	add(f.Coding != "", fmt.Sprintf("coding %q", f.Coding))
	add(f.RawDeflate, "raw deflate")
	add(f.Stream, "zstd stream")
	add(f.Corrupt, "corrupt")
	add(f.MediaType != "", "media type "+f.MediaType)
	add(f.Respell != 0, fmt.Sprintf("respelt %d", f.Respell))
	return strings.Join(parts, ", ")
}

// form draws a spelling for a (version 3), from the stream of forms.
func (g *gen) form(a *Attempt) Form {
	r := g.rf
	var f Form
	if r.IntN(3) == 0 {
		f.HostCase = pick(r, "upper", "mixed")
	}
	f.HostDot = r.IntN(4) == 0
	switch r.IntN(6) {
	case 0, 1:
		f.Port = "default"
	case 2:
		f.Port = "other"
	}
	if r.IntN(3) == 0 {
		f.Names = pick(r, "lower", "upper", "mixed")
	}
	switch x := r.IntN(20); {
	case x < 11:
		f.Coding = pick(r, "gzip", "gzip", "x-gzip", "GZip", "deflate", "deflate", "zstd", "zstd", "identity", "gzip, zstd", "zstd, deflate")
		f.RawDeflate = strings.Contains(f.Coding, "deflate") && r.IntN(2) == 0
		f.Stream = strings.Contains(f.Coding, "zstd") && r.IntN(3) == 0
		f.Corrupt = f.Coding != "identity" && !f.RawDeflate && r.IntN(10) == 0
	case x < 13:
		f.Coding = pick(r, "br", "compress", "x-unknown", "gzip, br")
	}
	if ct, ok := a.header("Content-Type"); ok && r.IntN(4) == 0 {
		f.MediaType = mediaCase
		if declaresJSON(ct) && r.IntN(2) == 0 {
			f.MediaType = pick(r, "; charset=utf-8", ";charset=UTF-8", `; charset="utf-8"`, "; Charset=Utf-8")
		}
	}
	if json.Valid(a.Body) && r.IntN(3) == 0 {
		f.Respell = r.Uint64() | 1
	}
	return f
}

// hostOnWire is the Host the attempt sends, over TLS (https) or not.
func (a *Attempt) hostOnWire(tls bool) string {
	f, h := a.Form, a.Host
	switch f.HostCase {
	case "upper":
		h = strings.ToUpper(h)
	case "mixed":
		h = mixedCase(h)
	}
	if f.HostDot {
		h += "."
	}
	switch {
	case f.Port == "default" && tls:
		h += ":443"
	case f.Port == "default":
		h += ":80"
	case f.Port == "other":
		h += ":8443"
	}
	return h
}

// mixedCase alternates the case of s's letters.
func mixedCase(s string) string {
	b := []byte(s)
	for i, c := range b {
		if i%2 == 0 && 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// headerOnWire is the attempt's header lines as sent: names in the
// form's case, Content-Type spelt as it says, and Content-Encoding.
func (a *Attempt) headerOnWire() [][2]string {
	f := a.Form
	out := make([][2]string, 0, len(a.Header)+1)
	for _, kv := range a.Header {
		if strings.EqualFold(kv[0], "Content-Type") {
			kv[1] = spellMediaType(kv[1], f.MediaType)
		}
		out = append(out, kv)
	}
	if f.Coding != "" {
		out = append(out, [2]string{"Content-Encoding", f.Coding})
	}
	for i := range out {
		switch f.Names {
		case "lower":
			out[i][0] = strings.ToLower(out[i][0])
		case "upper":
			out[i][0] = strings.ToUpper(out[i][0])
		case "mixed":
			out[i][0] = mixedCase(strings.ToLower(out[i][0]))
		}
	}
	return out
}

// wireValues returns every value of the header lines name as sent.
func (a *Attempt) wireValues(name string) []string {
	var out []string
	for _, kv := range a.headerOnWire() {
		if strings.EqualFold(kv[0], name) {
			out = append(out, kv[1])
		}
	}
	return out
}

// spellMediaType spells the media type ct as how says.
func spellMediaType(ct, how string) string {
	switch {
	case how == mediaCase:
		mt, params, _ := strings.Cut(ct, ";")
		if params != "" {
			params = ";" + params
		}
		return mixedCase(strings.ToLower(mt)) + params
	case strings.HasPrefix(how, ";") && declaresJSON(ct):
		return ct + how
	}
	return ct
}

// codings is what the contract makes of a Content-Encoding: the codings
// in the order they were applied, in lower case, aliases resolved,
// identity left out; known says whether the handler decodes each.
func codings(value string) (list []string, known bool) {
	known = true
	for t := range strings.SplitSeq(value, ",") {
		t = strings.ToLower(strings.TrimSpace(t))
		switch t {
		case "", "identity":
			continue
		case "x-gzip":
			t = "gzip"
		case "gzip", "deflate", "zstd":
		default:
			known = false
		}
		list = append(list, t)
	}
	return list, known
}

// content is the body as the handler decodes it: the plain body,
// respelt. (For a coding it does not decode, the bytes sent are its
// content: see bodyOnWire.)
func (a *Attempt) content() []byte {
	if a.Form.Respell == 0 {
		return a.Body
	}
	return respell(a.Body, a.Form.Respell)
}

// bodyOnWire is the body as sent: its content encoded with the form's
// codings, in order. A coding the model does not know labels the
// content as it is; an empty body stays empty, whatever it is labelled.
func (a *Attempt) bodyOnWire() []byte {
	b := a.content()
	list, known := codings(a.Form.Coding)
	if len(b) == 0 || !known || len(list) == 0 {
		return b
	}
	for _, c := range list {
		var buf bytes.Buffer
		var w interface {
			Write([]byte) (int, error)
			Close() error
		}
		switch {
		case c == "gzip":
			w = gzip.NewWriter(&buf)
		case c == "deflate" && a.Form.RawDeflate:
			w, _ = flate.NewWriter(&buf, flate.DefaultCompression)
		case c == "deflate":
			w = zlib.NewWriter(&buf)
		case c == "zstd" && a.Form.Stream:
			w, _ = zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
		case c == "zstd":
			buf.Write(zstdFrames.EncodeAll(b, nil))
		}
		if w != nil {
			_, _ = w.Write(b)
			_ = w.Close()
		}
		b = buf.Bytes()
	}
	if a.Form.Corrupt && len(b) > 4 {
		b = b[:len(b)-4] // the checksum, or the end of the stream
	}
	return b
}

// zstdFrames encodes whole bodies as single zstd frames with their
// content size (as most clients do).
var zstdFrames, _ = zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))

// respell writes a JSON body anew, the same JSON in other bytes: other
// whitespace, members in another order (but in objects that name a
// member twice, whose order parsers read differently), and strings with
// other escapes. Numbers keep their spelling: key_json takes an integer
// key as its digits.
func respell(body []byte, seed uint64) []byte {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	v, err := readJSON(dec)
	if err != nil {
		return body
	}
	r := rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d))
	var b bytes.Buffer
	space(&b, r)
	v.write(&b, r)
	space(&b, r)
	return b.Bytes()
}

// jsonValue is a JSON value with its members in order.
type jsonValue struct {
	kind    byte   // '{', '[', '"', or 'l' for a literal
	literal string // a number, true, false, null
	str     string
	names   []string
	values  []*jsonValue
}

func readJSON(dec *json.Decoder) (*jsonValue, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		v := &jsonValue{kind: byte(t)}
		for dec.More() {
			if t == '{' {
				name, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v.names = append(v.names, name.(string))
			}
			e, err := readJSON(dec)
			if err != nil {
				return nil, err
			}
			v.values = append(v.values, e)
		}
		_, err := dec.Token() // the closing delimiter
		return v, err
	case string:
		return &jsonValue{kind: '"', str: t}, nil
	case json.Number:
		return &jsonValue{kind: 'l', literal: t.String()}, nil
	case bool:
		return &jsonValue{kind: 'l', literal: fmt.Sprint(t)}, nil
	}
	return &jsonValue{kind: 'l', literal: "null"}, nil
}

func space(b *bytes.Buffer, r *rand.Rand) {
	b.WriteString(pick(r, "", "", " ", "\n", "\t ", "\r\n  "))
}

func (v *jsonValue) write(b *bytes.Buffer, r *rand.Rand) {
	switch v.kind {
	case '{', '[':
		order := make([]int, len(v.values))
		for i := range order {
			order[i] = i
		}
		if v.kind == '{' && !hasDuplicate(v.names) {
			r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		b.WriteByte(v.kind)
		for n, i := range order {
			if n > 0 {
				space(b, r)
				b.WriteByte(',')
			}
			space(b, r)
			if v.kind == '{' {
				writeJSONString(b, v.names[i], r)
				space(b, r)
				b.WriteByte(':')
				space(b, r)
			}
			v.values[i].write(b, r)
		}
		space(b, r)
		b.WriteByte(v.kind + 2) // '}' and ']' follow '{' and '[' by two
	case '"':
		writeJSONString(b, v.str, r)
	default:
		b.WriteString(v.literal)
	}
}

func hasDuplicate(names []string) bool {
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			return true
		}
		seen[n] = true
	}
	return false
}

// writeJSONString writes s as a JSON string, escaping some characters
// that need no escape.
func writeJSONString(b *bytes.Buffer, s string, r *rand.Rand) {
	b.WriteByte('"')
	for _, c := range s {
		switch {
		case c == '"' || c == '\\':
			b.WriteString(pick(r, `\`+string(c), fmt.Sprintf(`\u%04x`, c)))
		case c == '/' && r.IntN(2) == 0:
			b.WriteString(`\/`)
		case c < 0x20 || c < 0x10000 && r.IntN(4) == 0:
			b.WriteString(pick(r, fmt.Sprintf(`\u%04x`, c), fmt.Sprintf(`\u%04X`, c)))
		case c == utf8.RuneError:
			b.WriteString(`\ufffd`)
		default:
			b.WriteRune(c)
		}
	}
	b.WriteByte('"')
}

package fingerprint

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// maxSeed keeps the table's huge cases out of the fuzz corpus: the tables
// already test them, and the fuzzer mutates and minimises large seeds
// slowly.
const maxSeed = 1 << 10

func FuzzParseKey(f *testing.F) {
	for _, tc := range acceptedKeys {
		if len(tc.values[0]) <= maxSeed {
			f.Add(tc.values[0], tc.maxLen)
		}
	}
	for _, tc := range rejectedKeys {
		if len(tc.values[0]) <= maxSeed {
			f.Add(tc.values[0], tc.maxLen)
		}
	}
	f.Fuzz(func(t *testing.T, v string, maxLen int) {
		maxLen %= 300 // keep the limit in reach of generated keys
		key, err := ParseKey([]string{v}, maxLen)
		if err != nil {
			var ke *KeyError
			if !errors.As(err, &ke) {
				t.Fatalf("ParseKey(%q) error %v (%T), want *KeyError", v, err, err)
			}
			for _, c := range []byte(ke.Error()) {
				if c < 0x20 || c > 0x7E {
					t.Fatalf("error %q is not printable ASCII", ke)
				}
			}
			if len(ke.Error()) > 200 {
				t.Fatalf("error %q is too long", ke)
			}
			return
		}
		if key == "" {
			t.Fatalf("ParseKey(%q) returned an empty key", v)
		}
		if maxLen > 0 && len(key) > maxLen {
			t.Fatalf("ParseKey(%q, %d) returned %d bytes", v, maxLen, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7E {
				t.Fatalf("ParseKey(%q) returned byte 0x%02X", v, key[i])
			}
		}
		// Any key can be sent as an sf-string; it must mean the same key.
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		if again, err := ParseKey([]string{quoted}, maxLen); err != nil || again != key {
			t.Fatalf("key %q re-quoted as %q parses to %q, %v", key, quoted, again, err)
		}
		if _, err := ParseKey([]string{v, v}, maxLen); err == nil {
			t.Fatalf("two lines of %q accepted", v)
		}
	})
}

func FuzzCanonicalJSON(f *testing.F) {
	var seeds []string
	for _, tc := range equalJSON {
		seeds = append(seeds, tc.a, tc.b)
	}
	for _, tc := range unequalJSON {
		seeds = append(seeds, tc.a, tc.b)
	}
	for _, tc := range invalidJSON {
		seeds = append(seeds, tc.src)
	}
	seeds = append(seeds, apiJSON(1<<10, 3), `[[[[{"a":[{"b":{}}]}]]]]`)
	for _, s := range seeds {
		if len(s) <= maxSeed {
			f.Add([]byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		out, err := AppendCanonicalJSON([]byte("p"), src)
		if err != nil {
			if !errors.Is(err, ErrNotCanonical) {
				t.Fatalf("error %v does not wrap ErrNotCanonical", err)
			}
			if string(out) != "p" {
				t.Fatalf("failed call changed dst to %q", out)
			}
			if plainJSON(src) {
				t.Fatalf("valid JSON %q refused: %v", src, err)
			}
			return
		}
		enc := out[1:]
		// The canonicaliser is stricter than encoding/json, never laxer.
		if !json.Valid(src) || !utf8.Valid(src) {
			t.Fatalf("accepted %q, which is not valid UTF-8 JSON", src)
		}
		decodeAll(t, enc)
		if again, _ := AppendCanonicalJSON(nil, src); !bytes.Equal(again, enc) {
			t.Fatalf("non-deterministic: %q then %q", enc, again)
		}
		if !plainJSON(src) {
			return
		}
		// encoding/json reorders members and re-escapes strings (it escapes
		// <, > and & too); the meaning, and so the encoding, must survive.
		var v any
		dec := json.NewDecoder(bytes.NewReader(src))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("encoding/json cannot decode %q: %v", src, err)
		}
		re, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("encoding/json cannot re-encode %q: %v", src, err)
		}
		if reEnc, err := AppendCanonicalJSON(nil, re); err != nil || !bytes.Equal(reEnc, enc) {
			t.Fatalf("re-serialised %q as %q:\n %q\n %q (%v)", src, re, enc, reEnc, err)
		}
	})
}

// plainJSON reports whether src is JSON that AppendCanonicalJSON must accept
// and that survives a round trip through encoding/json unchanged in meaning:
// valid per encoding/json, valid UTF-8, no lone surrogate escapes, no
// duplicate member names, nesting within MaxDepth, small exponents.
func plainJSON(src []byte) bool {
	if !json.Valid(src) || !utf8.Valid(src) || hasLoneSurrogate(src) {
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(src))
	dec.UseNumber()
	type frame struct {
		names    map[string]bool
		isObject bool
		wantName bool
	}
	var stack []frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return true
		}
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = &stack[len(stack)-1]
		}
		if s, ok := tok.(string); ok && top != nil && top.isObject && top.wantName {
			if top.names[s] {
				return false
			}
			top.names[s] = true
			top.wantName = false
			continue
		}
		if top != nil && top.isObject {
			top.wantName = true
		}
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{', '[':
				stack = append(stack, frame{names: map[string]bool{}, isObject: tok == '{', wantName: true})
				if len(stack) > MaxDepth {
					return false
				}
			default:
				stack = stack[:len(stack)-1]
			}
		case json.Number:
			if _, e, ok := strings.Cut(strings.ToLower(string(tok)), "e"); ok {
				e = strings.TrimLeft(strings.TrimLeft(e, "+-"), "0")
				if len(e) > 8 {
					return false
				}
			}
		}
	}
}

// hasLoneSurrogate reports whether a string in the valid JSON text src has a
// \u escape of a surrogate that is not part of a high-low pair; encoding/json
// turns those into U+FFFD, which this package refuses to do.
func hasLoneSurrogate(src []byte) bool {
	inString := false
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case c == '"':
			inString = !inString
		case inString && c == '\\':
			if src[i+1] != 'u' {
				i++
				continue
			}
			r, _ := hex4(src, i+2)
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return true
			case r >= 0xD800 && r <= 0xDBFF:
				if i+7 >= len(src) || src[i+6] != '\\' || src[i+7] != 'u' {
					return true
				}
				lo, _ := hex4(src, i+8)
				if lo < 0xDC00 || lo > 0xDFFF {
					return true
				}
				i += 11
			default:
				i += 5
			}
		}
	}
	return false
}

// FuzzDiffers checks Differs on pairs of bodies against the independent
// model of detail_property_test.go: each name really differs and is a part
// or a member of the retry, never a value; the list is empty exactly when
// the fingerprints are equal; a detail of the first version gives sound
// names too. flags picks the configuration and which request declares
// JSON.
func FuzzDiffers(f *testing.F) {
	for _, s := range []struct{ a, b string }{
		{`{"amount":10}`, `{"amount":10}`},
		{`{"amount":10,"secret":1}`, `{"amount":11}`},
		{`{"a":1,"a":2}`, `{"a":2,"b":1}`},
		{`{"a":{"b":1},"sent_at":1}`, `{"sent_at":2,"a":{"b":1.0}}`},
		{`[1,2]`, `{"a":1}`},
		{`{}`, `{"a":"\u00e9"}`},
		{`amount=10`, `{"amount":10}`},
		{`{"amount":`, `{"amount":1}`},
	} {
		for _, flags := range []byte{0, 3, 13, 22} {
			f.Add([]byte(s.a), []byte(s.b), flags)
		}
	}
	f.Fuzz(func(t *testing.T, first, retry []byte, flags byte) {
		cfg := modelConfigs[int(flags>>2)%len(modelConfigs)]
		fp := cfg.fingerprinter(t)
		header := func(declared bool) http.Header {
			if declared {
				return http.Header{"Content-Type": {"application/json"}}
			}
			return http.Header{"Content-Type": {"text/plain"}}
		}
		a := request{method: "POST", path: "/a", header: header(flags&1 != 0), body: string(first)}
		b := request{method: "POST", path: "/a", header: header(flags&2 != 0), body: string(retry)}
		detail := fp.Detail(a.method, a.path, a.query, a.header, first)
		got, ok := fp.Differs(detail, b.method, b.path, b.query, b.header, retry)
		if !ok {
			t.Fatal("Differs could not read the detail it made")
		}
		cfg.checkDiffers(t, "detail", a, b, got)
		if same := bytes.Equal(a.sum(fp), b.sum(fp)); same != (len(got) == 0) {
			t.Fatalf("equal fingerprints %v, yet differs %q", same, got)
		}
		var salt [saltSize]byte
		old := detailV1(fp, salt, a.method, a.path, a.query, a.header, first)
		if got, ok = fp.Differs(old, b.method, b.path, b.query, b.header, retry); !ok {
			t.Fatal("Differs could not read a detail of the first version")
		}
		cfg.checkDiffers(t, "first version's detail", a, b, got)
	})
}

// FuzzPointerLookup checks Lookup against the model of
// detail_property_test.go: the value at the pointer, none, or
// ErrDuplicateMember exactly when an object on the path gives the member
// the pointer goes through more than once.
func FuzzPointerLookup(f *testing.F) {
	for _, s := range []struct{ ptr, doc string }{
		{"/id", `{"id":"a","id":"b"}`},
		{"/data/object/id", `{"data":{"object":{"id":"pi_2"}},"id":"evt_1"}`},
		{"/data/id", `{"data":{},"data":{"id":"a"}}`},
		{"/a~1b/1/i\u0064", `{"a/b":[0,{"id":1}]}`},
		{"/id", `{"i\u0064":1,"x":"\"}","id":2}`},
		{"/0", `[{"a":1},2]`},
		{"/+1", `[0,1]`},
		{"/m~0n", ` {"m~n" : [ true , null ] } `},
	} {
		f.Add(s.ptr, []byte(s.doc))
	}
	f.Fuzz(func(t *testing.T, ptr string, doc []byte) {
		p, err := ParsePointer(ptr)
		if err != nil || !utf8.Valid(doc) || !utf8.ValidString(ptr) {
			return
		}
		value, found, err := p.Lookup(doc)
		model, ok := decodeModel(doc)
		if !ok {
			if err == nil || errors.Is(err, ErrDuplicateMember) {
				t.Fatalf("Lookup(%s) in invalid JSON %q: %q, %v, %v", ptr, doc, value, found, err)
			}
			return
		}
		want, wantFound, twice := model, true, false
	walk:
		for _, tok := range p.tokens {
			switch v := want.(type) {
			case jobject:
				ms := v.members(tok)
				switch {
				case len(ms) > 1:
					twice = true
					break walk
				case len(ms) == 0:
					wantFound = false
					break walk
				}
				want = ms[0]
			case []jv:
				i, err := strconv.ParseUint(tok, 10, 31)
				if err != nil || i >= uint64(len(v)) || len(tok) > 1 && tok[0] == '0' {
					wantFound = false
					break walk
				}
				want = v[i]
			default:
				wantFound = false
				break walk
			}
		}
		switch {
		case twice:
			if !errors.Is(err, ErrDuplicateMember) || !strings.HasPrefix(ptr, strings.TrimPrefix(err.Error(), ErrDuplicateMember.Error()+" at ")) {
				t.Fatalf("Lookup(%s) in %s = %q, %v, %v; want ErrDuplicateMember naming a prefix of the pointer", ptr, doc, value, found, err)
			}
		case err != nil || found != wantFound:
			t.Fatalf("Lookup(%s) in %s = %q, %v, %v; want found %v", ptr, doc, value, found, err, wantFound)
		case found:
			got, ok := decodeModel(value)
			if !ok || !equalModel(got, want) || len(value) > 0 && isJSONSpace(value[0]) {
				t.Fatalf("Lookup(%s) in %s = %q, not the model's value", ptr, doc, value)
			}
		}
	})
}

// FuzzDecodeContent: whatever bytes a body of a coding holds, decoding
// answers the content, ErrContentTooLarge or a *DecodeError, never more
// than limit+1 bytes of content and never a panic; and content encoded in
// each coding decodes to itself within the limit, or is too large.
func FuzzDecodeContent(f *testing.F) {
	for _, s := range []string{``, `{"amount":10}`, strings.Repeat("abc", 400)} {
		for c := range byte(6) {
			f.Add([]byte(s), c, uint16(1000))
		}
	}
	f.Add([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff}, byte(0), uint16(10))
	f.Add([]byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x70, 0x09, 0, 0, 'x'}, byte(2), uint16(10))
	codings := []string{"gzip", "deflate", "zstd", "gzip, zstd", "zstd, deflate", "deflate"}
	f.Fuzz(func(t *testing.T, data []byte, which byte, limit16 uint16) {
		coding, limit := codings[int(which)%len(codings)], int64(limit16)
		c := ParseCodings([]string{coding})
		var dst bytes.Buffer
		err := DecodeContent(&dst, c, data, limit)
		var de *DecodeError
		if err != nil && !errors.Is(err, ErrContentTooLarge) && !errors.As(err, &de) {
			t.Fatalf("%s: %T %v", coding, err, err)
		}
		if int64(dst.Len()) > limit+1 || err == nil && int64(dst.Len()) > limit {
			t.Fatalf("%s: %d bytes of content past a limit of %d (%v)", coding, dst.Len(), limit, err)
		}

		list := strings.Split(strings.ReplaceAll(coding, " ", ""), ",")
		if int(which)%len(codings) == len(codings)-1 {
			list = []string{"raw-deflate"}
		}
		dst.Reset()
		err = DecodeContent(&dst, c, encode(t, data, list...), limit)
		switch {
		case len(data) == 0:
			if err != nil || dst.Len() != 0 {
				t.Fatalf("%s: empty content: %v, %d bytes", coding, err, dst.Len())
			}
		case int64(len(data)) > limit:
			if !errors.Is(err, ErrContentTooLarge) {
				t.Fatalf("%s: %d bytes of content over a limit of %d: %v", coding, len(data), limit, err)
			}
		case err != nil || !bytes.Equal(dst.Bytes(), data):
			t.Fatalf("%s: %d bytes of content decoded to %d: %v", coding, len(data), dst.Len(), err)
		}
	})
}

package fingerprint

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
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

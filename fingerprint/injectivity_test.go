package fingerprint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// The argument for injectivity: decodeCanonical below reads a canonical
// encoding back into a JSON value, deterministically, tag by tag, and fails
// unless it consumes every byte. TestCanonicalJSONDecodesToItsMeaning checks
// that decodeCanonical(AppendCanonicalJSON(x)) equals the meaning of x as
// computed independently (encoding/json's tokenizer and math/big). A
// function with a left inverse is injective: if two texts with different
// meanings had the same encoding, decoding that encoding would have to yield
// both meanings at once.
//
// Why the decoder can be deterministic: every value starts with a tag byte
// naming its type; null/true/false are the tag alone; a number ends at its
// ';', which its digits, sign and 'e' never contain; a string carries its
// length; and ']' and '}' are not tags, so inside a container "another
// element" and "end" are never confused. So no encoding is a proper prefix
// of another, and concatenated encodings split in exactly one way.

// jsonValue is the meaning of a JSON text: numbers as exact normalised
// decimals, strings as their decoded bytes, object members in the canonical
// (stable, byte-wise by name) order.
type jsonValue struct {
	kind  byte // one of the tags
	num   string
	str   string
	elems []jsonValue
	names []string // for objects, parallel to elems
}

func (v jsonValue) String() string {
	switch v.kind {
	case tagNumber:
		return "num(" + v.num + ")"
	case tagString:
		return fmt.Sprintf("str(%q)", v.str)
	case tagArray:
		parts := make([]string, len(v.elems))
		for i, e := range v.elems {
			parts[i] = e.String()
		}
		return "[" + strings.Join(parts, ",") + "]"
	case tagObject:
		parts := make([]string, len(v.elems))
		for i, e := range v.elems {
			parts[i] = fmt.Sprintf("%q:%s", v.names[i], e)
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	return string(v.kind)
}

// decodeCanonical decodes one value from the front of b and returns the rest.
func decodeCanonical(b []byte) (jsonValue, []byte, error) {
	if len(b) == 0 {
		return jsonValue{}, nil, io.ErrUnexpectedEOF
	}
	tag, b := b[0], b[1:]
	switch tag {
	case tagNull, tagTrue, tagFalse:
		return jsonValue{kind: tag}, b, nil
	case tagNumber:
		end := bytes.IndexByte(b, ';')
		if end < 0 {
			return jsonValue{}, nil, errors.New("unterminated number")
		}
		num := string(b[:end])
		if err := checkCanonicalNumber(num); err != nil {
			return jsonValue{}, nil, err
		}
		return jsonValue{kind: tag, num: num}, b[end+1:], nil
	case tagString:
		n, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < n {
			return jsonValue{}, nil, errors.New("bad string length")
		}
		s := b[k : k+int(n)]
		if !utf8.Valid(s) {
			return jsonValue{}, nil, errors.New("string is not UTF-8")
		}
		return jsonValue{kind: tag, str: string(s)}, b[k+int(n):], nil
	case tagArray:
		v := jsonValue{kind: tag, elems: []jsonValue{}}
		for {
			if len(b) > 0 && b[0] == endArray {
				return v, b[1:], nil
			}
			e, rest, err := decodeCanonical(b)
			if err != nil {
				return jsonValue{}, nil, err
			}
			v.elems, b = append(v.elems, e), rest
		}
	case tagObject:
		v := jsonValue{kind: tag, elems: []jsonValue{}, names: []string{}}
		for {
			if len(b) > 0 && b[0] == endObject {
				return v, b[1:], nil
			}
			name, rest, err := decodeCanonical(b)
			if err != nil {
				return jsonValue{}, nil, err
			}
			if name.kind != tagString {
				return jsonValue{}, nil, errors.New("member name is not a string")
			}
			if n := len(v.names); n > 0 && v.names[n-1] > name.str {
				return jsonValue{}, nil, errors.New("members out of order")
			}
			e, rest, err := decodeCanonical(rest)
			if err != nil {
				return jsonValue{}, nil, err
			}
			v.names, v.elems, b = append(v.names, name.str), append(v.elems, e), rest
		}
	}
	return jsonValue{}, nil, fmt.Errorf("unknown tag %q", tag)
}

// checkCanonicalNumber checks the normal form: "0", or an optional '-',
// digits without leading or trailing zeros, 'e', and an integer exponent
// without leading zeros or a negative zero.
func checkCanonicalNumber(s string) error {
	if s == "0" {
		return nil
	}
	m, e, ok := strings.Cut(strings.TrimPrefix(s, "-"), "e")
	digits := func(d string) bool { return d != "" && strings.Trim(d, "0123456789") == "" }
	if !ok || !digits(m) || m[0] == '0' || m[len(m)-1] == '0' {
		return fmt.Errorf("number %q: mantissa not in normal form", s)
	}
	if neg, found := strings.CutPrefix(e, "-"); found {
		e = neg
		if e == "0" {
			return fmt.Errorf("number %q: negative zero exponent", s)
		}
	}
	if !digits(e) || (e[0] == '0' && e != "0") {
		return fmt.Errorf("number %q: exponent not in normal form", s)
	}
	return nil
}

func decodeAll(t testing.TB, enc []byte) jsonValue {
	t.Helper()
	v, rest, err := decodeCanonical(enc)
	if err != nil {
		t.Fatalf("decoding %.200q: %v", enc, err)
	}
	if len(rest) != 0 {
		t.Fatalf("decoding %.200q left %q", enc, rest)
	}
	return v
}

// meaningOf computes the meaning of a JSON text without any code of the
// package under test: encoding/json tokenizes, math/big normalises numbers.
func meaningOf(src []byte) (jsonValue, error) {
	dec := json.NewDecoder(bytes.NewReader(src))
	dec.UseNumber()
	v, err := meaningOfNext(dec)
	if err != nil {
		return v, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return v, errors.New("more than one value")
	}
	return v, nil
}

func meaningOfNext(dec *json.Decoder) (jsonValue, error) {
	tok, err := dec.Token()
	if err != nil {
		return jsonValue{}, err
	}
	switch tok := tok.(type) {
	case nil:
		return jsonValue{kind: tagNull}, nil
	case bool:
		if tok {
			return jsonValue{kind: tagTrue}, nil
		}
		return jsonValue{kind: tagFalse}, nil
	case json.Number:
		return jsonValue{kind: tagNumber, num: normalNumber(string(tok))}, nil
	case string:
		return jsonValue{kind: tagString, str: tok}, nil
	case json.Delim:
		v := jsonValue{kind: tagArray, elems: []jsonValue{}}
		if tok == '{' {
			v.kind, v.names = tagObject, []string{}
		}
		for dec.More() {
			if v.kind == tagObject {
				name, err := dec.Token()
				if err != nil {
					return v, err
				}
				v.names = append(v.names, name.(string))
			}
			e, err := meaningOfNext(dec)
			if err != nil {
				return v, err
			}
			v.elems = append(v.elems, e)
		}
		if _, err := dec.Token(); err != nil {
			return v, err
		}
		if v.kind == tagObject {
			idx := make([]int, len(v.names))
			for i := range idx {
				idx[i] = i
			}
			slices.SortStableFunc(idx, func(a, b int) int { return strings.Compare(v.names[a], v.names[b]) })
			names, elems := make([]string, len(idx)), make([]jsonValue, len(idx))
			for i, j := range idx {
				names[i], elems[i] = v.names[j], v.elems[j]
			}
			v.names, v.elems = names, elems
		}
		return v, nil
	}
	return jsonValue{}, fmt.Errorf("unexpected token %v", tok)
}

// normalNumber renders a JSON number literal as mantissa×10^exponent with
// no trailing zeros in the mantissa, using big.Int arithmetic.
func normalNumber(lit string) string {
	mant, exp := lit, 0
	if i := strings.IndexAny(lit, "eE"); i >= 0 {
		mant = lit[:i]
		fmt.Sscan(lit[i+1:], &exp)
	}
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		exp -= len(mant) - i - 1
		mant = mant[:i] + mant[i+1:]
	}
	m, _ := new(big.Int).SetString(mant, 10)
	if m.Sign() == 0 {
		return "0"
	}
	ten, r := big.NewInt(10), new(big.Int)
	for {
		q, rem := new(big.Int).QuoRem(m, ten, r)
		if rem.Sign() != 0 {
			break
		}
		m = q
		exp++
	}
	return fmt.Sprintf("%se%d", m, exp)
}

// meaningCorpus is every valid text of the tables, minus those the big.Int
// model would take too long on.
func meaningCorpus() []string {
	var c []string
	for _, tc := range equalJSON {
		c = append(c, tc.a, tc.b)
	}
	for _, tc := range unequalJSON {
		c = append(c, tc.a, tc.b)
	}
	c = append(c, apiJSON(1<<10, 1), apiJSON(8<<10, 2))
	return slices.DeleteFunc(c, func(s string) bool { return strings.Contains(s, "e99999") })
}

func TestCanonicalJSONDecodesToItsMeaning(t *testing.T) {
	for _, src := range meaningCorpus() {
		want, err := meaningOf([]byte(src))
		if err != nil {
			t.Fatalf("model cannot read %.80q: %v", src, err)
		}
		got := decodeAll(t, canon(t, src))
		if got.String() != want.String() {
			t.Errorf("%.80q:\n encoding means %.300s\n text means     %.300s", src, got, want)
		}
	}
}

// TestCanonicalJSONEncodingsDifferExactlyWhenMeaningsDo checks the corpus
// pairwise: equal encodings if and only if equal meanings.
func TestCanonicalJSONEncodingsDifferExactlyWhenMeaningsDo(t *testing.T) {
	corpus := meaningCorpus()
	enc := make([]string, len(corpus))
	mean := make([]string, len(corpus))
	for i, src := range corpus {
		enc[i] = string(canon(t, src))
		m, err := meaningOf([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		mean[i] = m.String()
	}
	for i := range corpus {
		for j := i + 1; j < len(corpus); j++ {
			if (enc[i] == enc[j]) != (mean[i] == mean[j]) {
				t.Errorf("%.60q vs %.60q: same encoding %v, same meaning %v",
					corpus[i], corpus[j], enc[i] == enc[j], mean[i] == mean[j])
			}
		}
	}
}

// TestCanonicalJSONConcatenationSplitsOneWay checks the prefix-free property
// directly: a strict prefix of an encoding never decodes completely.
func TestCanonicalJSONConcatenationSplitsOneWay(t *testing.T) {
	for _, src := range meaningCorpus() {
		enc := canon(t, src)
		if len(enc) > 4096 {
			continue
		}
		for k := range len(enc) {
			if v, rest, err := decodeCanonical(enc[:k]); err == nil && len(rest) == 0 {
				t.Fatalf("prefix %q of the encoding of %.60q decodes to %s", enc[:k], src, v)
			}
		}
	}
}

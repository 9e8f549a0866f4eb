package storage

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"
)

// codecSeeds are responses whose encodings seed the fuzz targets.
var codecSeeds = []*Response{
	{Status: 200},
	{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X-Order": {"42"}}, Body: []byte(`{"order":42}`)},
	{Status: 204, Header: http.Header{"Set-Cookie": {"a=1", "b=2"}, "Empty": {}, "Blank": {""}}},
	{Status: 500, BodyOmitted: true, Header: http.Header{"Retry-After": {"1"}}},
	{Status: 999, Body: []byte{0, 1, 2, 0xff}},
}

// FuzzDecodeResponse feeds arbitrary bytes to the decoders: they never
// panic, only fail with ErrCorrupt, and what they accept encodes back to
// something that decodes to the same response.
func FuzzDecodeResponse(f *testing.F) {
	for _, r := range codecSeeds {
		f.Add(AppendResponse(nil, r))
	}
	f.Add([]byte{})
	f.Add([]byte{codecVersion})
	f.Add([]byte{codecVersion, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{codecVersion, 0, 200, 1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{2, 0, 200, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if h, err := DecodeHeader(b); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("DecodeHeader error %v does not wrap ErrCorrupt", err)
			}
		} else if again, err := DecodeHeader(AppendHeader(nil, h)); err != nil || !sameHeader(h, again) {
			t.Fatalf("header %q re-encoded decodes to %q, %v", h, again, err)
		}

		r, err := DecodeResponse(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("DecodeResponse error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if !ValidStatus(r.Status) {
			t.Fatalf("decoded status %d, which no record may hold", r.Status)
		}
		again, err := DecodeResponse(AppendResponse(nil, r))
		if err != nil {
			t.Fatalf("re-encoding %+v: %v", r, err)
		}
		if !sameResponse(r, again) {
			t.Fatalf("decoded %+v, re-encoded and decoded %+v", r, again)
		}
	})
}

// FuzzAppendDecodeRoundTrip encodes responses built from fuzzed parts
// (headers as "name: value" lines) and checks that they decode to what
// went in, after whatever dst already held; a status ValidStatus refuses
// (an interim 1xx, 42, 1000) must fail to decode with ErrCorrupt instead.
func FuzzAppendDecodeRoundTrip(f *testing.F) {
	f.Add([]byte(nil), uint16(201), false, "Content-Type: application/json\nX-Order: 42", []byte(`{"order":42}`))
	f.Add([]byte("prefix"), uint16(500), true, "Set-Cookie: a=1\nSet-Cookie: b=2\nEmpty", []byte{})
	f.Add([]byte{codecVersion}, uint16(0), false, ":\n:\n\n", []byte{0, 0xff})
	f.Add([]byte(nil), uint16(42), false, "", []byte("x"))
	f.Add([]byte(nil), uint16(199), false, "", []byte(nil))
	f.Add([]byte(nil), uint16(1000), true, "", []byte(nil))
	f.Fuzz(func(t *testing.T, dst []byte, status uint16, omitted bool, header string, body []byte) {
		in := &Response{Status: int(status), BodyOmitted: omitted, Body: body}
		if header != "" {
			in.Header = make(http.Header)
			for line := range strings.SplitSeq(header, "\n") {
				name, value, hasValue := strings.Cut(line, ": ")
				if hasValue {
					in.Header[name] = append(in.Header[name], value)
				} else if _, ok := in.Header[name]; !ok {
					in.Header[name] = []string{} // a name without values
				}
			}
		}
		// A copy: the fuzzer may back dst and body with one array, and
		// appending to dst would then overwrite body.
		dst = bytes.Clone(dst)
		prefix := bytes.Clone(dst)
		enc := AppendResponse(dst, in)
		if !bytes.Equal(enc[:len(prefix)], prefix) {
			t.Fatalf("AppendResponse changed what dst held")
		}
		out, err := DecodeResponse(enc[len(prefix):])
		if !ValidStatus(in.Status) {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decoding status %d: %+v, %v; want an error wrapping ErrCorrupt", in.Status, out, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("decoding %+v: %v", in, err)
		}
		if !sameResponse(in, out) {
			t.Fatalf("encoded %+v, decoded %+v", in, out)
		}
	})
}

// sameResponse compares responses, nil and empty alike.
func sameResponse(a, b *Response) bool {
	return a.Status == b.Status && a.BodyOmitted == b.BodyOmitted &&
		bytes.Equal(a.Body, b.Body) && sameHeader(a.Header, b.Header)
}

// sameHeader compares headers, nil and empty alike (maps and value lists).
func sameHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for name, av := range a {
		bv, ok := b[name]
		if !ok || len(av) != len(bv) {
			return false
		}
		for i := range av {
			if av[i] != bv[i] {
				return false
			}
		}
	}
	return true
}

func FuzzResponseLen(f *testing.F) {
	f.Add(201, "Content-Type", "application/json", []byte("body"), true)
	f.Add(200, "", "", []byte(nil), false)
	f.Fuzz(func(t *testing.T, status int, name, value string, body []byte, omitted bool) {
		r := &Response{Status: status & 0x3ff, Body: body, BodyOmitted: omitted}
		if name != "" {
			r.Header = map[string][]string{name: {value, value + value}}
		}
		if got, want := ResponseLen(r), len(AppendResponse(nil, r)); got != want {
			t.Fatalf("ResponseLen = %d, encoding is %d bytes", got, want)
		}
	})
}

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
	{Status: 504, OutcomeUnknown: true},
	{Status: 502, OutcomeUnknown: true, BodyOmitted: true, Header: http.Header{"X-Order": {"42"}}},
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
	f.Add([]byte{codecVersionMarked, flagOutcomeUnknown, 0xf6, 0x03, 0})
	f.Add([]byte{codecVersion, flagOutcomeUnknown | flagBodyOmitted, 0xf6, 0x03, 0})
	f.Add([]byte{3, 0, 200, 1, 0})
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
		// Into a store's array of values: the same response, and no
		// header's values reach into the next one's.
		var into Response
		values := make([]string, 3)
		if err := DecodeResponseInto(&into, b, values[:1]); err != nil || !sameResponse(r, &into) {
			t.Fatalf("decoded into an array %+v (%v), want %+v", into, err, r)
		}
		for name, v := range into.Header {
			if len(v) != cap(v) {
				t.Fatalf("header %q's values have room past them: %d of %d", name, len(v), cap(v))
			}
		}
	})
}

// FuzzAppendDecodeRoundTrip encodes responses built from fuzzed parts
// (headers as "name: value" lines) and checks that they decode to what
// went in, after whatever dst already held; a status ValidStatus refuses
// (an interim 1xx, 42, 1000) must fail to decode with ErrCorrupt instead.
func FuzzAppendDecodeRoundTrip(f *testing.F) {
	f.Add([]byte(nil), uint16(201), false, false, "Content-Type: application/json\nX-Order: 42", []byte(`{"order":42}`))
	f.Add([]byte("prefix"), uint16(500), true, false, "Set-Cookie: a=1\nSet-Cookie: b=2\nEmpty", []byte{})
	f.Add([]byte{codecVersion}, uint16(0), false, false, ":\n:\n\n", []byte{0, 0xff})
	f.Add([]byte(nil), uint16(42), false, false, "", []byte("x"))
	f.Add([]byte(nil), uint16(199), false, false, "", []byte(nil))
	f.Add([]byte(nil), uint16(1000), true, false, "", []byte(nil))
	f.Add([]byte(nil), uint16(504), false, true, "", []byte(nil))
	f.Add([]byte{codecVersionMarked}, uint16(502), true, true, "X-Order: 42", []byte(nil))
	f.Fuzz(func(t *testing.T, dst []byte, status uint16, omitted, unknown bool, header string, body []byte) {
		in := &Response{Status: int(status), BodyOmitted: omitted, OutcomeUnknown: unknown, Body: body}
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
	return a.Status == b.Status && a.BodyOmitted == b.BodyOmitted && a.OutcomeUnknown == b.OutcomeUnknown &&
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

// Records written before outcome-unknown records existed decode as they
// did (their bytes are version 1, which the encoder still writes for
// every response without the mark), and an outcome-unknown record is
// version 2, which a decoder of version 1 only refused ("unknown version
// 2"): an instance not yet upgraded answers 503 for such a key rather
// than replay it as a response.
func TestRecordsOfEveryVersionDecode(t *testing.T) {
	old := []byte{1, flagBodyOmitted, 0xc9, 0x01, 1, 1, 'X', 1, 2, '4', '2', 'h', 'i'} // 201, X: 42, body "hi", body omitted
	want := &Response{Status: 201, BodyOmitted: true, Header: http.Header{"X": {"42"}}, Body: []byte("hi")}
	got, err := DecodeResponse(old)
	if err != nil || !sameResponse(got, want) {
		t.Fatalf("a version 1 record decodes to %+v, %v; want %+v", got, err, want)
	}
	if enc := AppendResponse(nil, want); !bytes.Equal(enc, old) {
		t.Fatalf("a response without the mark encodes to %v, want version 1's %v", enc, old)
	}
	// A version 1 decoder ignored the flags it did not know.
	if got, err := DecodeResponse([]byte{1, flagOutcomeUnknown, 0xc9, 0x01, 0}); err != nil || got.OutcomeUnknown {
		t.Fatalf("version 1 with an unknown flag: %+v, %v; want a plain response", got, err)
	}
	unknown := AppendResponse(nil, &Response{Status: http.StatusGatewayTimeout, OutcomeUnknown: true})
	if unknown[0] != codecVersionMarked {
		t.Fatalf("an outcome-unknown record is version %d, want %d (which version 1 decoders refuse)", unknown[0], codecVersionMarked)
	}
	if got, err := DecodeResponse(unknown); err != nil || !got.OutcomeUnknown || got.Status != http.StatusGatewayTimeout {
		t.Fatalf("an outcome-unknown record decodes to %+v, %v", got, err)
	}
}

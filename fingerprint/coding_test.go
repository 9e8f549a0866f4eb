package fingerprint

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// encode applies codings to b in order, as a client would.
func encode(t testing.TB, b []byte, codings ...string) []byte {
	t.Helper()
	for _, c := range codings {
		var buf bytes.Buffer
		var w io.WriteCloser
		switch c {
		case "gzip":
			w = gzip.NewWriter(&buf)
		case "deflate":
			w = zlib.NewWriter(&buf)
		case "raw-deflate":
			w, _ = flate.NewWriter(&buf, flate.BestSpeed)
		case "zstd":
			w, _ = zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1)) // streamed: an 8 MiB window, no content size
		case "zstd-frame":
			enc, _ := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
			buf.Write(enc.EncodeAll(b, nil))
		default:
			t.Fatalf("no coding %s", c)
		}
		if w != nil {
			if _, err := w.Write(b); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
		}
		b = buf.Bytes()
	}
	return b
}

func TestParseCodings(t *testing.T) {
	for _, c := range []struct {
		values    []string
		none      bool
		decoded   bool
		undecoded string
		name      string
	}{
		{nil, true, false, "", ""},
		{[]string{""}, true, false, "", ""},
		{[]string{"identity"}, true, false, "", ""},
		{[]string{"gzip"}, false, true, "", "gzip"},
		{[]string{"GZip"}, false, true, "", "gzip"},
		{[]string{"x-gzip"}, false, true, "", "gzip"},
		{[]string{" deflate "}, false, true, "", "deflate"},
		{[]string{"gzip, zstd"}, false, true, "", "gzip, zstd"},
		{[]string{"gzip", "identity", "zstd"}, false, true, "", "gzip, zstd"},
		{[]string{"br"}, false, false, "br", "br"},
		{[]string{"gzip, BR"}, false, false, "gzip, br", "gzip, br"},
		{[]string{"br", "gzip"}, false, false, "br, gzip", "br, gzip"},
		{[]string{"compress"}, false, false, "compress", "compress"},
		{[]string{"gzip, gzip, gzip, gzip"}, false, true, "", "gzip, gzip, gzip, gzip"},
		{[]string{"gzip, gzip, gzip, gzip, gzip"}, false, false, "gzip, gzip, gzip, gzip, gzip", "gzip, gzip, gzip, gzip, gzip"},
		// Each zstd layer holds its own window (8 MiB): one at most.
		{[]string{"zstd, gzip"}, false, true, "", "zstd, gzip"},
		{[]string{"zstd, zstd"}, false, false, "zstd, zstd", "zstd, zstd"},
		{[]string{"zstd", "gzip", "ZSTD"}, false, false, "zstd, gzip, zstd", "zstd, gzip, zstd"},
	} {
		got := ParseCodings(c.values)
		if got.None() != c.none || got.Decoded() != c.decoded || got.Undecoded() != c.undecoded || got.String() != c.name {
			t.Errorf("%q: none %v decoded %v undecoded %q name %q; want %v %v %q %q",
				c.values, got.None(), got.Decoded(), got.Undecoded(), got.String(), c.none, c.decoded, c.undecoded, c.name)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = ParseCodings([]string{"gzip"}) }); n != 0 {
		t.Errorf("reading one coding allocates %v times", n)
	}
}

// TestDecodeContentUndoesEachCodingInOrder: gzip, deflate (zlib's format,
// and raw as some clients send it), zstd (a frame of known size, and a
// streamed one with an 8 MiB window), and codings stacked.
func TestDecodeContentUndoesEachCodingInOrder(t *testing.T) {
	content := []byte(`{"amount":10,"currency":"EUR","note":"` + strings.Repeat("abc", 500) + `"}`)
	for _, codings := range [][]string{{"gzip"}, {"deflate"}, {"raw-deflate"}, {"zstd"}, {"zstd-frame"}, {"gzip", "zstd"}, {"zstd", "deflate", "gzip"}} {
		header := strings.ReplaceAll(strings.ReplaceAll(strings.Join(codings, ", "), "raw-deflate", "deflate"), "zstd-frame", "zstd")
		var dst bytes.Buffer
		if err := DecodeContent(&dst, ParseCodings([]string{header}), encode(t, content, codings...), 1<<20); err != nil || !bytes.Equal(dst.Bytes(), content) {
			t.Errorf("%v: %v, %d bytes", codings, err, dst.Len())
		}
	}
	var dst bytes.Buffer
	if err := DecodeContent(&dst, ParseCodings([]string{"gzip"}), nil, 10); err != nil || dst.Len() != 0 {
		t.Errorf("an empty body: %v, %q", err, dst.Bytes())
	}
}

// TestDecodeContentStopsAtTheLimit: a small body that decodes to far more
// than the limit is refused once the limit is passed, holding no more
// than about the limit: a bomb costs what a body at the limit costs.
func TestDecodeContentStopsAtTheLimit(t *testing.T) {
	bomb := make([]byte, 256<<20) // 256 MiB of zeros: a few hundred KiB sent
	const limit = 1 << 20
	for _, codings := range [][]string{{"gzip"}, {"deflate"}, {"zstd"}, {"zstd-frame"}, {"gzip", "gzip"}} {
		header := strings.ReplaceAll(strings.Join(codings, ", "), "zstd-frame", "zstd")
		body := encode(t, bomb, codings...)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		var dst bytes.Buffer
		err := DecodeContent(&dst, ParseCodings([]string{header}), body, limit)
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrContentTooLarge) {
			t.Errorf("%v (%d bytes sent): %v, want ErrContentTooLarge", codings, len(body), err)
		}
		if dst.Len() > limit+1 {
			t.Errorf("%v: decoded %d bytes past a limit of %d", codings, dst.Len(), limit)
		}
		// The buffer (its growth, doubling past the limit, allocates
		// about twice what it ends with), a zstd window, and the
		// decoders' own state; never the 256 MiB.
		grew := after.TotalAlloc - before.TotalAlloc
		t.Logf("%v: %d KiB sent, %d KiB allocated", codings, len(body)>>10, grew>>10)
		if grew > 4*limit+MaxZstdWindow+(4<<20) && !raceEnabled { // the race detector's pools drop decoders
			t.Errorf("%v: decoding to the limit allocated %d MiB", codings, grew>>20)
		}
	}
	// Exactly the limit is within it.
	var dst bytes.Buffer
	if err := DecodeContent(&dst, ParseCodings([]string{"gzip"}), encode(t, bomb[:limit], "gzip"), limit); err != nil || dst.Len() != limit {
		t.Errorf("content of exactly the limit: %v, %d bytes", err, dst.Len())
	}
}

// TestDecodeContentRefusesWhatDoesNotDecode: a body cut short, one that
// is not of its coding, a zstd window over the coding's 8 MiB.
func TestDecodeContentRefusesWhatDoesNotDecode(t *testing.T) {
	content := []byte(`{"amount":10}`)
	gz := encode(t, content, "gzip")
	// A zstd frame that asks for a 16 MiB window (RFC 8878 3.1.1.1.2),
	// then one raw block holding the content.
	wide := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 14 << 3}
	size := 1 | len(content)<<3 // last block, raw
	wide = append(append(wide, byte(size), byte(size>>8), byte(size>>16)), content...)
	for _, c := range []struct {
		coding string
		body   []byte
	}{
		{"gzip", gz[:len(gz)-4]},
		{"gzip", content},
		{"deflate", encode(t, content, "deflate")[:5]},
		{"zstd", content},
		{"zstd", wide},
		{"gzip, zstd", gz},
		// An outer layer cut short under an inner one that ends cleanly.
		{"zstd, deflate", func() []byte { b := encode(t, content, "zstd-frame", "deflate"); return b[:len(b)-4] }()},
		{"zstd, gzip", func() []byte { b := encode(t, content, "zstd", "gzip"); return b[:len(b)-4] }()},
		// Data after the end of the stream.
		{"deflate", append(encode(t, content, "deflate"), "trailing"...)},
		{"deflate", append(encode(t, content, "raw-deflate"), "trailing"...)},
		{"gzip", append(encode(t, content, "gzip"), "trailing"...)},
		{"zstd", append(encode(t, content, "zstd-frame"), "trailing"...)},
		{"zstd, deflate", encode(t, append(encode(t, content, "zstd-frame"), "trailing"...), "deflate")},
	} {
		var dst bytes.Buffer
		err := DecodeContent(&dst, ParseCodings([]string{c.coding}), c.body, 1<<20)
		var de *DecodeError
		if !errors.As(err, &de) || de.Coding == "" {
			t.Errorf("%s %q: %v, want a DecodeError naming the coding", c.coding, c.body, err)
		}
	}
}

// TestCodedBodiesFingerprintAsTheirContent: a body is fingerprinted by
// its content, however it was coded; a body of a coding not decoded by
// its bytes and codings, never as another body of those bytes.
func TestCodedBodiesFingerprintAsTheirContent(t *testing.T) {
	f := New([]string{"Content-Type"}, true)
	content := []byte(`{"amount":10,"currency":"EUR"}`)
	sum := func(coding string, body []byte) string {
		h := http.Header{"Content-Type": {"application/json"}}
		if coding != "" {
			h.Set("Content-Encoding", coding)
		}
		return string(f.Sum(nil, "POST", "/orders", "", h, body))
	}
	plain := sum("", content)
	for _, coding := range []string{"gzip", "deflate", "zstd", "identity", "gzip, zstd"} {
		if sum(coding, content) != plain {
			t.Errorf("%s: content decoded is fingerprinted otherwise than as it is", coding)
		}
	}
	br := sum("br", content)
	if br == plain || br == sum("compress", content) || br != sum("BR", content) {
		t.Error("a body of a coding not decoded matches a body of other codings")
	}
	if sum("br", []byte(`{ "amount":10,"currency":"EUR"}`)) == br {
		t.Error("a body of a coding not decoded is canonicalised")
	}
	// The 422's detail tells an encoded body from the same bytes as they are.
	d := f.Detail("POST", "/orders", "", http.Header{"Content-Type": {"application/json"}}, content)
	differs, ok := f.Differs(d, "POST", "/orders", "", http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"br"}}, content)
	if !ok || len(differs) != 1 || differs[0] != "body" {
		t.Errorf("differs %q (%v), want body", differs, ok)
	}
}

package model

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/json"
	"io"
	"reflect"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
)

// The spellings the model sends are what it claims: respelt JSON is the
// same JSON in other bytes, and an encoded body decodes to its content.
func TestFormsSpellTheSameRequest(t *testing.T) {
	body := []byte(`{"amount":10,"currency":"EUR","nonce":3,"pad":"p/q\"r","id":"k-1","nested":{"a":[1,2,{"b":null}],"c":true}}`)
	for seed := uint64(1); seed < 200; seed += 2 {
		re := respell(body, seed)
		var a, b any
		if err := json.Unmarshal(body, &a); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(re, &b); err != nil || !reflect.DeepEqual(a, b) {
			t.Fatalf("seed %d: %q is not the same JSON as %q (%v)", seed, re, body, err)
		}
		if !canonEqual(body, re) {
			t.Fatalf("seed %d: %q has another canonical encoding than %q", seed, re, body)
		}
	}
	for seed := uint64(1); seed < 50; seed += 2 {
		// Members named twice keep their order: parsers take the first or the last.
		re := respell([]byte(`{"id":"a","id":"b"}`), seed)
		v, err := readJSON(json.NewDecoder(bytes.NewReader(re)))
		if err != nil || len(v.values) != 2 || v.values[0].str != "a" || v.values[1].str != "b" {
			t.Fatalf("seed %d: respelt %q", seed, re)
		}
	}

	decode := func(list []string, raw bool, b []byte) ([]byte, error) {
		for i := len(list) - 1; i >= 0; i-- {
			var r io.Reader
			var err error
			switch {
			case list[i] == "gzip":
				r, err = gzip.NewReader(bytes.NewReader(b))
			case list[i] == "deflate" && raw:
				r = flate.NewReader(bytes.NewReader(b))
			case list[i] == "deflate":
				r, err = zlib.NewReader(bytes.NewReader(b))
			case list[i] == "zstd":
				var d *zstd.Decoder
				d, err = zstd.NewReader(bytes.NewReader(b))
				r = d
			}
			if err != nil {
				return nil, err
			}
			if b, err = io.ReadAll(r); err != nil {
				return nil, err
			}
		}
		return b, nil
	}
	for _, coding := range []string{"gzip", "x-gzip", "GZip", "deflate", "zstd", "gzip, zstd", "zstd, deflate"} {
		for _, f := range []Form{{Coding: coding}, {Coding: coding, RawDeflate: true}, {Coding: coding, Stream: true}, {Coding: coding, Corrupt: true}} {
			a := &Attempt{Body: body, Form: f}
			list, known := codings(coding)
			if !known {
				t.Fatalf("%q is not known", coding)
			}
			got, err := decode(list, f.RawDeflate, a.bodyOnWire())
			if f.Corrupt {
				if err == nil {
					t.Errorf("%+v: a corrupt body decodes", f)
				}
				continue
			}
			if err != nil || !bytes.Equal(got, body) {
				t.Errorf("%+v: decodes to %q (%v)", f, got, err)
			}
		}
	}
	for _, coding := range []string{"br", "gzip, br", "x-unknown"} {
		a := &Attempt{Body: body, Form: Form{Coding: coding}}
		if v := a.bodyView(); !bytes.Equal(v.wire, body) || v.undecoded == "" {
			t.Errorf("%q: %+v", coding, v)
		}
	}
	a := &Attempt{Host: "g1-a.test", Header: [][2]string{{"Content-Type", "application/json"}, {"Idempotency-Key", "k"}},
		Form: Form{HostCase: "mixed", HostDot: true, Port: "default", Names: "upper", MediaType: "; charset=utf-8", Coding: "gzip"}}
	if h := a.hostOnWire(true); h != "G1-a.tEsT.:443" {
		t.Errorf("host %q", h)
	}
	if got := a.headerOnWire(); got[0] != [2]string{"CONTENT-TYPE", "application/json; charset=utf-8"} || got[2] != [2]string{"CONTENT-ENCODING", "gzip"} {
		t.Errorf("header %q", got)
	}
	if fingerprint.DeclaresJSON(a.httpHeader()) != declaresJSON(spellMediaType("application/json", mediaCase)) {
		t.Error("a media type in other case is not JSON")
	}
}

package fingerprint

import (
	"bytes"
	"net/http"
	"testing"
)

func TestOnlyBodiesDeclaredAsJSONAreCanonicalised(t *testing.T) {
	f := New([]string{"Content-Type"}, true)
	for _, ct := range []string{"text/csv", "text/plain", "application/octet-stream", ""} {
		a, b := baseRequest(), baseRequest()
		a.header = http.Header{"Content-Type": {ct}}
		if ct == "" {
			a.header = nil
		}
		b.header = a.header
		a.body, b.body = "100", "1e2"
		if bytes.Equal(a.sum(f), b.sum(f)) {
			t.Errorf("Content-Type %q: bodies 100 and 1e2 have one fingerprint; only JSON bodies compare by meaning", ct)
		}
	}
	for _, ct := range []string{"application/json", "Application/JSON; charset=UTF-8", "application/problem+json", "application/vnd.api+json"} {
		a, b := baseRequest(), baseRequest()
		a.header = http.Header{"Content-Type": {ct}}
		b.header = a.header
		a.body, b.body = `{"a":100}`, `{ "a": 1e2 }`
		if !bytes.Equal(a.sum(f), b.sum(f)) {
			t.Errorf("Content-Type %q: equivalent JSON bodies differ", ct)
		}
	}
}

func TestDeclaresJSON(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json":                true,
		"application/json; charset=utf-8": true,
		" APPLICATION/JSON ":              true,
		"application/merge-patch+json":    true,
		"text/json+":                      false,
		"+json":                           false,
		"text/csv":                        false,
		"application/jsonl":               false,
		"":                                false,
	} {
		if got := DeclaresJSON(http.Header{"Content-Type": {ct}}); got != want {
			t.Errorf("DeclaresJSON(%q) = %v, want %v", ct, got, want)
		}
	}
	if DeclaresJSON(nil) {
		t.Error("DeclaresJSON(nil) = true")
	}
}

func TestMediaTypeSpellingsShareAFingerprint(t *testing.T) {
	f := New([]string{"Content-Type"}, true)
	same := [][]string{
		{"application/json", "Application/JSON", "application/json; charset=utf-8", "application/json;charset=UTF-8", "application/json; charset=\"utf-8\""},
		{"text/plain; charset=utf-8", "text/plain;charset=UTF-8", "TEXT/PLAIN; Charset=utf-8"},
	}
	for _, group := range same {
		var first []byte
		for _, ct := range group {
			r := baseRequest()
			r.header = http.Header{"Content-Type": {ct}}
			if first == nil {
				first = r.sum(f)
			} else if !bytes.Equal(first, r.sum(f)) {
				t.Errorf("%q and %q have different fingerprints", group[0], ct)
			}
		}
	}
	different := [][2]string{
		{"text/plain", "text/plain; charset=utf-8"}, // charset matters outside JSON
		{"text/plain; charset=utf-8", "text/plain; charset=latin1"},
		{"application/json", "application/json; profile=x"},
		{"application/json", "text/json"},
	}
	for _, p := range different {
		a, b := baseRequest(), baseRequest()
		a.header = http.Header{"Content-Type": {p[0]}}
		b.header = http.Header{"Content-Type": {p[1]}}
		if bytes.Equal(a.sum(f), b.sum(f)) {
			t.Errorf("%q and %q share a fingerprint", p[0], p[1])
		}
	}
}

func TestNormalizeMediaTypeKeepsUsualSpellings(t *testing.T) {
	// Records stored before normalisation existed keep matching: the
	// spellings clients usually send come back unchanged.
	for _, v := range []string{"application/json", "text/plain; charset=utf-8", "application/x-www-form-urlencoded", "not a media type;;"} {
		if got := normalizeMediaType(v); got != v {
			t.Errorf("normalizeMediaType(%q) = %q, want it unchanged", v, got)
		}
	}
	if n := testing.AllocsPerRun(100, func() { normalizeMediaType("application/json") }); n != 0 {
		t.Errorf("normalizeMediaType allocates %v times for a plain type", n)
	}
}

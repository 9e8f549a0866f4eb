package fingerprint

import (
	"bytes"
	"errors"
	"net/http"
	"testing"
)

func TestParsePointer(t *testing.T) {
	for _, bad := range []string{"", "id", "/a~2", "/a~"} {
		if _, err := ParsePointer(bad); err == nil {
			t.Errorf("ParsePointer(%q) accepted", bad)
		}
	}
	p, err := ParsePointer("/a~1b/m~0n/0")
	if err != nil {
		t.Fatal(err)
	}
	if got := p.tokens; len(got) != 3 || got[0] != "a/b" || got[1] != "m~n" || got[2] != "0" {
		t.Fatalf("tokens %q", got)
	}
	if p.String() != "/a~1b/m~0n/0" {
		t.Errorf("String() = %q", p.String())
	}
}

func TestPointerLookup(t *testing.T) {
	doc := []byte(`{"id":"evt_1","data":{"object":{"id":"pi_2","n":[10,{"x":42}]}},"a/b":1,"e":""}`)
	for ptr, want := range map[string]string{
		"/id":                    `"evt_1"`,
		"/data/object/id":        `"pi_2"`,
		"/data/object/n/0":       `10`,
		"/data/object/n/1/x":     `42`,
		"/a~1b":                  `1`,
		"/e":                     `""`,
		"/missing":               "",
		"/data/object/n/2":       "",
		"/data/object/n/01":      "",
		"/data/object/n/-":       "",
		"/data/object/n/+1":      "",
		"/data/object/n/-0":      "",
		"/data/object/n/ 1":      "",
		"/id/deeper":             "",
		"/data/object/id/length": "",
	} {
		p, err := ParsePointer(ptr)
		if err != nil {
			t.Fatal(err)
		}
		v, found, err := p.Lookup(doc)
		if err != nil {
			t.Fatalf("%s: %v", ptr, err)
		}
		if found != (want != "") || string(v) != want {
			t.Errorf("Lookup(%s) = %q, %v; want %q", ptr, v, found, want)
		}
	}
	p, _ := ParsePointer("/id")
	if _, _, err := p.Lookup([]byte(`{"id":`)); err == nil {
		t.Error("Lookup on invalid JSON: no error")
	}
}

func mustPointers(t testing.TB, ss ...string) []Pointer {
	t.Helper()
	var ps []Pointer
	for _, s := range ss {
		p, err := ParsePointer(s)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	return ps
}

func TestIgnoredMembersAreLeftOutOfTheFingerprint(t *testing.T) {
	f, err := NewFingerprinter(Options{Headers: []string{"Content-Type"}, CanonicalJSON: true,
		Ignore: mustPointers(t, "/sent_at", "/metadata/nonce", "/items/1")})
	if err != nil {
		t.Fatal(err)
	}
	sum := func(body string) []byte {
		r := baseRequest()
		r.body = body
		return r.sum(f)
	}
	base := sum(`{"amount":10,"sent_at":"2026-01-01T00:00:00Z","metadata":{"nonce":"a","k":1},"items":[1,2,3]}`)
	same := []string{
		`{"amount":10,"sent_at":"2026-01-01T00:00:09Z","metadata":{"nonce":"b","k":1},"items":[1,99,3]}`,
		`{"amount":10,"metadata":{"k":1},"items":[1,{"any":"thing"},3]}`, // absent is fine
		`{"items":[1,2,3],"metadata":{"k":1,"nonce":null},"amount":10}`,
	}
	for _, b := range same {
		if !bytes.Equal(base, sum(b)) {
			t.Errorf("%s differs from the base only in ignored members, yet its fingerprint differs", b)
		}
	}
	different := []string{
		`{"amount":11,"sent_at":"2026-01-01T00:00:00Z","metadata":{"nonce":"a","k":1},"items":[1,2,3]}`,
		`{"amount":10,"metadata":{"nonce":"a","k":2},"items":[1,2,3]}`,
		`{"amount":10,"metadata":{"k":1},"items":[1,2]}`,         // an element fewer: positions count
		`{"amount":10,"metadata":{"k":1},"items":[1,2,3],"x":1}`, // a member more
	}
	for _, b := range different {
		if bytes.Equal(base, sum(b)) {
			t.Errorf("%s differs outside the ignored members, yet has the base's fingerprint", b)
		}
	}
	if _, err := NewFingerprinter(Options{Ignore: mustPointers(t, "/a")}); err == nil {
		t.Error("ignore without canonical JSON accepted")
	}
	// Raw bodies are not parsed, so nothing is ignored in them.
	r1, r2 := baseRequest(), baseRequest()
	r1.header = http.Header{"Content-Type": {"text/plain"}}
	r2.header = r1.header
	r1.body, r2.body = `{"sent_at":1}`, `{"sent_at":2}`
	if bytes.Equal(r1.sum(f), r2.sum(f)) {
		t.Error("members of a body not declared as JSON were ignored")
	}
}

// TestLookupRefusesAKeyNamedTwice: a member on the pointer's path given
// twice is ambiguous (parsers disagree on which counts), at any level.
func TestLookupRefusesAKeyNamedTwice(t *testing.T) {
	for _, tc := range []struct{ ptr, doc string }{
		{"/id", `{"id":"a","id":"b"}`},
		{"/id", `{"id":"a","id":"a"}`},                  // equal values: still refused
		{"/id", `{"id":"a","x":1,"i\u0064":"b"}`},       // the same name, escaped
		{"/id", `{"id":"a", "data":{}, "id" : null }`},  // after the value found
		{"/data/id", `{"data":{"id":"a"},"data":{}}`},   // a level up: the path is ambiguous
		{"/data/id", `{"data":{},"data":{"id":"a"}}`},   // the first has no key
		{"/data/id", `{"data":{"id":"a","id":"b"}}`},    // deeper
		{"/a~1b/0/id", `{"a/b":[{"id":1,"id":2}]}`},     // through an array
		{"/data/missing", `{"data":{"x":1},"data":{}}`}, // ambiguous, whatever is below
	} {
		p, err := ParsePointer(tc.ptr)
		if err != nil {
			t.Fatal(err)
		}
		v, found, err := p.Lookup([]byte(tc.doc))
		if !errors.Is(err, ErrDuplicateMember) {
			t.Errorf("Lookup(%s) in %s = %q, %v, %v; want ErrDuplicateMember", tc.ptr, tc.doc, v, found, err)
		}
		if tc.ptr == "/data/id" && tc.doc == `{"data":{},"data":{"id":"a"}}` && err.Error() != "the JSON body names a member twice at /data" {
			t.Errorf("error %q does not say where", err)
		}
	}
	for _, tc := range []struct{ ptr, doc, want string }{
		{"/id", `{"id":"a","x":1,"x":2}`, `"a"`},                         // twice, but not on the path
		{"/data/id", `{"data":{"id":"a","n":[{"id":1,"id":2}]}}`, `"a"`}, // below another member
		{"/id", `{"id":{"k":1,"k":2}}`, `{"k":1,"k":2}`},                 // inside the value found
		{"/id", `{"ID":"a","id":"b"}`, `"b"`},                            // names are case-sensitive
	} {
		p, _ := ParsePointer(tc.ptr)
		v, found, err := p.Lookup([]byte(tc.doc))
		if err != nil || !found || string(v) != tc.want {
			t.Errorf("Lookup(%s) in %s = %q, %v, %v; want %s", tc.ptr, tc.doc, v, found, err, tc.want)
		}
	}
}

package fingerprint

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

func differs(t *testing.T, f *Fingerprinter, first, retry request) []string {
	t.Helper()
	d := f.Detail(first.method, first.path, first.query, first.header, []byte(first.body))
	got, ok := f.Differs(d, retry.method, retry.path, retry.query, retry.header, []byte(retry.body))
	if !ok {
		t.Fatal("Differs could not read the detail it made")
	}
	return got
}

func TestDiffersNamesThePartsThatDiffer(t *testing.T) {
	f := New([]string{"Content-Type", "X-Tenant"}, true)
	base := baseRequest()
	tests := []struct {
		name   string
		change func(r *request)
		want   []string
	}{
		{"nothing", func(r *request) {}, nil},
		{"whitespace and order only", func(r *request) { r.body = `{ "currency":"EUR", "amount":1e2 }` }, nil},
		{"method", func(r *request) { r.method = "PATCH" }, []string{"method"}},
		{"path", func(r *request) { r.path = "/v1/other" }, []string{"path"}},
		{"query", func(r *request) { r.query = "dry_run=1" }, []string{"query"}},
		{"header", func(r *request) { r.header = http.Header{"Content-Type": {"application/json"}, "X-Tenant": {"other"}} }, []string{"header X-Tenant"}},
		{"a member's value", func(r *request) { r.body = `{"amount":101,"currency":"EUR"}` }, []string{"body", "/amount"}},
		{"a member on one side only", func(r *request) { r.body = `{"amount":100,"currency":"EUR","note":"x"}` }, []string{"body", "/note"}},
		{"a member missing: not named", func(r *request) { r.body = `{"amount":100}` }, []string{"body"}},
		{"odd member names", func(r *request) { r.body = `{"amount":100,"currency":"EUR","a/b~c":1}` }, []string{"body", "/a~1b~0c"}},
		{"several", func(r *request) { r.query = "x"; r.body = `{"amount":1,"currency":"USD"}` }, []string{"query", "body", "/amount", "/currency"}},
		{"not an object", func(r *request) { r.body = `[1,2]` }, []string{"body"}},
	}
	for _, tt := range tests {
		retry := baseRequest()
		tt.change(&retry)
		if got := differs(t, f, base, retry); !slices.Equal(got, tt.want) {
			t.Errorf("%s: differs %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestDetailKeepsNoValues(t *testing.T) {
	f := New([]string{"Content-Type", "X-Tenant"}, true)
	r := baseRequest()
	r.header = http.Header{"Content-Type": {"application/json"}, "X-Tenant": {"tenant-secret-name"}}
	r.body = `{"card":"4242424242424242","amount":100}`
	d := string(f.Detail(r.method, r.path, r.query, r.header, []byte(r.body)))
	for _, v := range []string{"4242424242424242", "tenant-secret-name", "dry_run=0", "/v1/orders", "100"} {
		if strings.Contains(d, v) {
			t.Errorf("the detail holds the value %q", v)
		}
	}
	// A fresh salt for each record: equal requests give unequal details.
	if d == string(f.Detail(r.method, r.path, r.query, r.header, []byte(r.body))) {
		t.Error("two details of one request are equal: the salt is not fresh")
	}
}

func TestDifferingMembersAreBounded(t *testing.T) {
	f := New(nil, true)
	var big, other strings.Builder
	big.WriteString("{")
	other.WriteString("{")
	for i := range maxMemberParts + 1 {
		if i > 0 {
			big.WriteString(",")
			other.WriteString(",")
		}
		big.WriteString(`"m` + strings.Repeat("x", i%3) + string(rune('a'+i%26)) + string(rune('a'+i/26)) + `":1`)
		other.WriteString(`"m` + strings.Repeat("x", i%3) + string(rune('a'+i%26)) + string(rune('a'+i/26)) + `":2`)
	}
	big.WriteString("}")
	other.WriteString("}")
	a, b := baseRequest(), baseRequest()
	a.header, b.header = nil, nil
	a.header = http.Header{"Content-Type": {"application/json"}}
	b.header = a.header
	a.body, b.body = big.String(), other.String()
	if got := differs(t, f, a, b); !slices.Equal(got, []string{"body"}) {
		t.Errorf("an object of %d members: differs %q, want just body", maxMemberParts+1, got)
	}
}

func TestDiffersRefusesWhatItCannotRead(t *testing.T) {
	f := New(nil, true)
	for _, d := range [][]byte{nil, {}, {2}, {detailVersion, 1, 2}, append([]byte{detailVersion}, make([]byte, saltSize+3)...)} {
		if _, ok := f.Differs(d, "POST", "/", "", nil, nil); ok {
			t.Errorf("Differs read the malformed detail %x", d)
		}
	}
	// A version this build does not know (a newer instance's, in a
	// rolling upgrade) is refused, not misread.
	newer := f.Detail("POST", "/", "", nil, []byte(`{"a":1}`))
	newer[0] = detailVersion + 1
	if _, ok := f.Differs(newer, "POST", "/", "", nil, []byte(`{"a":2}`)); ok {
		t.Error("Differs read a detail of a later version")
	}
}

// TestDiffersNamesOnlyWhatDiffersAndOnlyTheRetrysMembers covers the cases
// of issue 19 item 14 and their neighbours, for a detail of each version.
func TestDiffersNamesOnlyWhatDiffersAndOnlyTheRetrysMembers(t *testing.T) {
	jsonCT := http.Header{"Content-Type": {"application/json"}}
	textCT := http.Header{"Content-Type": {"text/plain"}}
	noCT := http.Header{}
	withCT, _ := NewFingerprinter(Options{Headers: []string{"Content-Type"}, CanonicalJSON: true})
	noHeaders, _ := NewFingerprinter(Options{CanonicalJSON: true})
	ignoring, _ := NewFingerprinter(Options{Headers: []string{"Content-Type"}, CanonicalJSON: true, Ignore: mustPointers(t, "/sent_at")})
	raw := New([]string{"Content-Type"}, false)
	tests := []struct {
		name          string
		f             *Fingerprinter
		first, retry  http.Header
		fBody, rBody  string
		want, wantOld []string // wantOld: from a detail of version 1
	}{
		{"the same bytes without Content-Type", withCT, jsonCT, noCT, `{"amount":10}`, `{"amount":10}`,
			[]string{"header Content-Type"}, []string{"header Content-Type"}},
		{"the same bytes, then declared as JSON", withCT, noCT, jsonCT, `{"amount":10}`, `{"amount":10}`,
			[]string{"header Content-Type"}, []string{"header Content-Type"}},
		{"Content-Type not fingerprinted, but it changed how the body was compared", noHeaders, jsonCT, textCT, `{"amount":10}`, `{"amount":10}`,
			[]string{"header Content-Type"}, nil},
		{"another media type and other bytes", withCT, jsonCT, textCT, `{"amount":10}`, `{"amount":11}`,
			[]string{"header Content-Type", "body"}, []string{"header Content-Type", "body"}},
		// Not known to differ: no digest of the first body's bytes is kept.
		{"the same meaning in other bytes, once as bytes", withCT, jsonCT, textCT, `{"amount":10}`, `{"amount":1e1}`,
			[]string{"header Content-Type"}, []string{"header Content-Type"}},
		{"the same meaning in other bytes, then as JSON", withCT, textCT, jsonCT, `{"amount":10}`, `{"amount":1e1}`,
			[]string{"header Content-Type", "body"}, []string{"header Content-Type", "body"}},
		{"a member only the first request had", withCT, jsonCT, jsonCT, `{"amount":10,"secret_flag":1}`, `{"amount":10}`,
			[]string{"body"}, []string{"body"}},
		{"a member only the retry has", withCT, jsonCT, jsonCT, `{"amount":10}`, `{"amount":10,"note":"x"}`,
			[]string{"body", "/note"}, []string{"body", "/note"}},
		{"a member added to an empty object", withCT, jsonCT, jsonCT, `{}`, `{"note":"x"}`,
			[]string{"body", "/note"}, []string{"body"}},
		{"an object after an array", withCT, jsonCT, jsonCT, `[1]`, `{"note":"x"}`,
			[]string{"body"}, []string{"body"}},
		{"a nested member: its top-level member", withCT, jsonCT, jsonCT, `{"a":{"b":1},"c":1}`, `{"c":1,"a":{"b":2}}`,
			[]string{"body", "/a"}, []string{"body", "/a"}},
		{"a member named twice in the retry", withCT, jsonCT, jsonCT, `{"a":1,"b":1}`, `{"a":1,"a":2,"b":2}`,
			[]string{"body", "/b"}, []string{"body", "/b"}},
		{"a member named twice in the first request", withCT, jsonCT, jsonCT, `{"a":1,"a":2,"b":1}`, `{"a":2,"b":2}`,
			[]string{"body", "/b"}, []string{"body", "/b"}},
		{"an ignored member", ignoring, jsonCT, jsonCT, `{"a":1,"sent_at":1}`, `{"a":2,"sent_at":2}`,
			[]string{"body", "/a"}, []string{"body", "/a"}},
		{"only an ignored member", ignoring, jsonCT, jsonCT, `{"a":1,"sent_at":1}`, `{"sent_at":2,"a":1}`,
			nil, nil},
		{"canonical_json off: spelling counts, no members", raw, jsonCT, jsonCT, `{"a":1}`, `{"a": 1}`,
			[]string{"body"}, []string{"body"}},
		{"canonical_json off: the same bytes in another media type", raw, jsonCT, textCT, `{"a":1}`, `{"a":1}`,
			[]string{"header Content-Type"}, []string{"header Content-Type"}},
	}
	var salt [saltSize]byte
	for _, tt := range tests {
		first, retry := baseRequest(), baseRequest()
		first.header, retry.header, first.body, retry.body = tt.first, tt.retry, tt.fBody, tt.rBody
		if got := differs(t, tt.f, first, retry); !slices.Equal(got, tt.want) {
			t.Errorf("%s: differs %q, want %q", tt.name, got, tt.want)
		}
		old := detailV1(tt.f, salt, first.method, first.path, first.query, first.header, []byte(first.body))
		got, ok := tt.f.Differs(old, retry.method, retry.path, retry.query, retry.header, []byte(retry.body))
		if !ok || !slices.Equal(got, tt.wantOld) {
			t.Errorf("%s, detail of version 1: differs %q (%v), want %q", tt.name, got, ok, tt.wantOld)
		}
	}
}

// TestDiffersAfterTheOptionsChanged: a record made under other fingerprint
// options (a reload between a request and its retry) gives a shorter
// answer, never a wrong name.
func TestDiffersAfterTheOptionsChanged(t *testing.T) {
	jsonCT := http.Header{"Content-Type": {"application/json"}, "X-Tenant": {"a"}}
	opts := func(o Options) *Fingerprinter {
		f, err := NewFingerprinter(o)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	plain := opts(Options{Headers: []string{"Content-Type"}, CanonicalJSON: true})
	tests := []struct {
		name         string
		then, now    *Fingerprinter
		fBody, rBody string
		retryHeader  http.Header
		want         []string
	}{
		{"ignore added, the ignored member differs", plain, opts(Options{Headers: []string{"Content-Type"}, CanonicalJSON: true, Ignore: mustPointers(t, "/sent_at")}),
			`{"a":1,"sent_at":1}`, `{"a":1,"sent_at":2}`, jsonCT, nil},
		{"ignore added, other bytes", plain, opts(Options{Headers: []string{"Content-Type"}, CanonicalJSON: true, Ignore: mustPointers(t, "/sent_at")}),
			`{"a":1,"sent_at":1}`, `{"a":2,"sent_at":1}`, jsonCT, nil},
		{"ignore added, the same bytes", plain, opts(Options{Headers: []string{"Content-Type"}, CanonicalJSON: true, Ignore: mustPointers(t, "/sent_at")}),
			`{"a":1,"sent_at":1}`, `{"a":1,"sent_at":1}`, jsonCT, nil},
		{"ignore in another order: the same options", opts(Options{CanonicalJSON: true, Ignore: mustPointers(t, "/x", "/y")}), opts(Options{CanonicalJSON: true, Ignore: mustPointers(t, "/y", "/x", "/y")}),
			`{"a":1,"x":1}`, `{"a":2,"x":2}`, jsonCT, []string{"body", "/a"}},
		{"canonical_json turned off, the same meaning", plain, New([]string{"Content-Type"}, false),
			`{"a":1}`, `{"a": 1}`, jsonCT, nil},
		{"canonical_json turned off, another meaning", plain, New([]string{"Content-Type"}, false),
			`{"a":1}`, `{"a":2}`, jsonCT, []string{"body"}},
		{"canonical_json turned on, other bytes", New([]string{"Content-Type"}, false), plain,
			`{"a":1}`, `{"a": 1}`, jsonCT, []string{"body"}},
		{"canonical_json turned off, the same bytes", plain, New([]string{"Content-Type"}, false),
			`{"a":1}`, `{"a":1}`, jsonCT, nil},
		{"a header no longer fingerprinted, equal", opts(Options{Headers: []string{"Content-Type", "X-Tenant"}, CanonicalJSON: true}), plain,
			`{}`, `{}`, jsonCT, nil},
		{"a header no longer fingerprinted, different", opts(Options{Headers: []string{"Content-Type", "X-Tenant"}, CanonicalJSON: true}), plain,
			`{}`, `{}`, http.Header{"Content-Type": {"application/json"}, "X-Tenant": {"b"}}, []string{"header X-Tenant"}},
		{"a header fingerprinted now, not then: nothing known of it", plain, opts(Options{Headers: []string{"Content-Type", "X-Tenant"}, CanonicalJSON: true}),
			`{}`, `{}`, http.Header{"Content-Type": {"application/json"}, "X-Tenant": {"b"}}, nil},
	}
	for _, tt := range tests {
		first := baseRequest()
		first.header, first.body = jsonCT, tt.fBody
		d := tt.then.Detail(first.method, first.path, first.query, first.header, []byte(first.body))
		got, ok := tt.now.Differs(d, first.method, first.path, first.query, tt.retryHeader, []byte(tt.rBody))
		if !ok || !slices.Equal(got, tt.want) {
			t.Errorf("%s: differs %q (%v), want %q", tt.name, got, ok, tt.want)
		}
	}
}

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
		{"a member missing", func(r *request) { r.body = `{"amount":100}` }, []string{"body", "/currency"}},
		{"odd member names", func(r *request) { r.body = `{"amount":100,"currency":"EUR","a/b~c":1}` }, []string{"body", "/a~1b~0c"}},
		{"several", func(r *request) { r.query = "x"; r.body = `{"amount":1,"currency":"USD"}` }, []string{"query", "body", "/amount", "/currency"}},
		{"not an object", func(r *request) { r.body = `[1,2]` }, []string{"body", "/amount", "/currency"}},
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
}

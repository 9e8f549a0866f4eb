package fingerprint

import (
	"bytes"
	"net/http"
	"slices"
	"testing"
)

// request is the set of parts Sum hashes.
type request struct {
	method, path, query string
	header              http.Header
	body                string
}

func (r request) sum(f *Fingerprinter) []byte {
	return f.Sum(nil, r.method, r.path, r.query, r.header, []byte(r.body))
}

func baseRequest() request {
	return request{
		method: "POST",
		path:   "/v1/orders",
		query:  "dry_run=0",
		header: http.Header{"Content-Type": {"application/json"}, "X-Tenant": {"acme"}},
		body:   `{"amount":100,"currency":"EUR"}`,
	}
}

func TestSumChangesWithEachPart(t *testing.T) {
	f := New([]string{"content-type", "X-TENANT"}, true)
	base := baseRequest().sum(f)
	if len(base) != Size {
		t.Fatalf("sum has %d bytes, want %d", len(base), Size)
	}
	variants := []struct {
		name   string
		modify func(*request)
	}{
		{"method", func(r *request) { r.method = "PUT" }},
		{"path", func(r *request) { r.path = "/v1/orders/" }},
		{"query", func(r *request) { r.query = "dry_run=1" }},
		{"query moved into path", func(r *request) { r.path, r.query = "/v1/orders?dry_run=0", "" }},
		{"header value", func(r *request) { r.header = http.Header{"Content-Type": {"text/plain"}, "X-Tenant": {"acme"}} }},
		{"second header value", func(r *request) { r.header = http.Header{"Content-Type": {"application/json"}, "X-Tenant": {"other"}} }},
		{"header absent", func(r *request) { r.header = http.Header{"X-Tenant": {"acme"}} }},
		{"header repeated", func(r *request) {
			r.header = http.Header{"Content-Type": {"application/json", "application/json"}, "X-Tenant": {"acme"}}
		}},
		{"header values split differently", func(r *request) {
			r.header = http.Header{"Content-Type": {"application/json", "acme"}}
		}},
		{"nil header", func(r *request) { r.header = nil }},
		{"body value", func(r *request) { r.body = `{"amount":101,"currency":"EUR"}` }},
		{"body not JSON", func(r *request) { r.body = `amount=100&currency=EUR` }},
		{"body empty", func(r *request) { r.body = "" }},
	}
	seen := map[string]string{string(base): "base"}
	for _, v := range variants {
		r := baseRequest()
		v.modify(&r)
		got := r.sum(f)
		if prev, dup := seen[string(got)]; dup {
			t.Errorf("variant %q has the same fingerprint as %q", v.name, prev)
		}
		seen[string(got)] = v.name
	}
}

func TestSumIgnoresUnconfiguredHeaders(t *testing.T) {
	f := New([]string{"Content-Type"}, true)
	a := baseRequest()
	b := baseRequest()
	b.header = http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"123"}}
	if !bytes.Equal(a.sum(f), b.sum(f)) {
		t.Fatal("a header that is not configured changed the fingerprint")
	}
}

func TestSumHeaderAbsentDiffersFromEmpty(t *testing.T) {
	f := New([]string{"X-Tenant"}, true)
	r := baseRequest()
	r.header = http.Header{}
	absent := r.sum(f)
	r.header = http.Header{"X-Tenant": {""}}
	empty := r.sum(f)
	r.header = http.Header{"X-Tenant": {"", ""}}
	twoEmpty := r.sum(f)
	if bytes.Equal(absent, empty) || bytes.Equal(empty, twoEmpty) || bytes.Equal(absent, twoEmpty) {
		t.Fatal("absent, empty and twice-empty headers are not all distinct")
	}
	r.header = nil
	if !bytes.Equal(r.sum(f), absent) {
		t.Fatal("a nil header map differs from an empty one")
	}
}

func TestSumHeaderOrderIsConfiguredOrder(t *testing.T) {
	r := baseRequest()
	r.header = http.Header{"A": {"x"}, "B": {"x"}}
	ab := r.sum(New([]string{"a", "b"}, true))
	ba := r.sum(New([]string{"b", "a"}, true))
	if bytes.Equal(ab, ba) {
		t.Fatal("header order does not take part in the framing")
	}
}

func TestNewCanonicalisesHeaderNames(t *testing.T) {
	f := New([]string{"content-type", "x-TENANT-id"}, false)
	if got, want := f.Headers(), []string{"Content-Type", "X-Tenant-Id"}; !slices.Equal(got, want) {
		t.Fatalf("Headers() = %q, want %q", got, want)
	}
	if f.CanonicalJSON() {
		t.Fatal("CanonicalJSON() = true")
	}
	r := baseRequest()
	if !bytes.Equal(r.sum(f), r.sum(New([]string{"Content-Type", "X-Tenant-Id"}, false))) {
		t.Fatal("header name spelling changed the fingerprint")
	}
}

func TestSumCanonicalJSONBodiesMatch(t *testing.T) {
	f := New([]string{"Content-Type"}, true)
	a, b := baseRequest(), baseRequest()
	a.body = `{"amount":100,"currency":"EUR","items":[{"sku":"A1","qty":1}]}`
	b.body = "{\n  \"items\": [ { \"qty\": 1.0, \"sku\": \"\\u0041\\u0031\" } ],\n  \"currency\": \"EUR\",\n  \"amount\": 1e2\n}\n"
	if !bytes.Equal(a.sum(f), b.sum(f)) {
		t.Fatal("equivalent JSON bodies have different fingerprints")
	}
	raw := New([]string{"Content-Type"}, false)
	if bytes.Equal(a.sum(raw), b.sum(raw)) {
		t.Fatal("with CanonicalJSON off, differently spelled bodies have the same fingerprint")
	}
}

func TestSumNonJSONFallsBackToRaw(t *testing.T) {
	f := New(nil, true)
	a, b := baseRequest(), baseRequest()
	a.body, b.body = "amount=100", "amount=101"
	if bytes.Equal(a.sum(f), b.sum(f)) {
		t.Fatal("two different raw bodies have the same fingerprint")
	}
	// The same raw body hashes alike whether or not canonicalisation is on:
	// it is not JSON, so both hash its raw bytes.
	if !bytes.Equal(a.sum(f), a.sum(New(nil, false))) {
		t.Fatal("a non-JSON body hashes differently depending on CanonicalJSON")
	}
	// Invalid JSON (a lone surrogate) is hashed raw, not rejected.
	a.body, b.body = `"\ud800"`, `"\udc00"`
	if bytes.Equal(a.sum(f), b.sum(f)) {
		t.Fatal("two different invalid JSON bodies have the same fingerprint")
	}
}

// TestSumRawBodyNeverCollidesWithCanonical picks a raw body whose bytes are
// exactly the canonical encoding of a JSON body: without the body tag both
// would hash the same bytes.
func TestSumRawBodyNeverCollidesWithCanonical(t *testing.T) {
	f := New(nil, true)
	j := baseRequest()
	j.body = `{"a":1}`
	enc, err := AppendCanonicalJSON(nil, []byte(j.body))
	if err != nil {
		t.Fatal(err)
	}
	r := baseRequest()
	r.body = string(enc) // not JSON, so hashed raw
	if bytes.Equal(j.sum(f), r.sum(f)) {
		t.Fatal("a raw body collides with the canonical encoding it spells")
	}
}

func TestSumFieldsDoNotRunTogether(t *testing.T) {
	f := New(nil, false)
	pairs := [][2]request{
		{{method: "POST", path: "/a"}, {method: "POST/", path: "a"}},
		{{path: "/a", query: "b"}, {path: "/ab", query: ""}},
		{{query: "x", body: "y"}, {query: "xy", body: ""}},
	}
	for _, p := range pairs {
		if bytes.Equal(p[0].sum(f), p[1].sum(f)) {
			t.Errorf("%+v and %+v collide", p[0], p[1])
		}
	}
}

func TestSumCanonicalJSONOffHashesRaw(t *testing.T) {
	f := New(nil, false)
	a, b := baseRequest(), baseRequest()
	b.body = `{ "amount":100,"currency":"EUR"}`
	if bytes.Equal(a.sum(f), b.sum(f)) {
		t.Fatal("raw hashing ignored a whitespace difference")
	}
}

func TestSumZeroValueAndNil(t *testing.T) {
	r := baseRequest()
	var zero Fingerprinter
	var nilF *Fingerprinter
	if !bytes.Equal(r.sum(&zero), r.sum(nilF)) || !bytes.Equal(r.sum(&zero), r.sum(New(nil, false))) {
		t.Fatal("zero value, nil and New(nil, false) disagree")
	}
}

func TestSumAppendsToDst(t *testing.T) {
	f := New(nil, true)
	r := baseRequest()
	want := r.sum(f)
	got := f.Sum([]byte("prefix"), r.method, r.path, r.query, r.header, []byte(r.body))
	if string(got[:6]) != "prefix" || !bytes.Equal(got[6:], want) {
		t.Fatalf("got %x", got)
	}
}

func TestSumDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	header := http.Header{"Content-Type": {"application/json"}}
	for _, tc := range []struct {
		name string
		f    *Fingerprinter
		body []byte
	}{
		{"1 KiB JSON canonical", New([]string{"Content-Type"}, true), []byte(apiJSON(1<<10, 1))},
		{"64 KiB JSON canonical", New([]string{"Content-Type"}, true), []byte(apiJSON(64<<10, 1))},
		{"1 KiB raw", New([]string{"Content-Type"}, false), []byte(apiJSON(1<<10, 1))},
		{"non-JSON fallback", New([]string{"Content-Type"}, true), bytes.Repeat([]byte("a=b&"), 256)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := make([]byte, 0, Size)
			f := func() { tc.f.Sum(dst[:0], "POST", "/v1/orders", "x=1", header, tc.body) }
			f() // warm the pools
			if allocs := testing.AllocsPerRun(100, f); allocs != 0 {
				t.Fatalf("Sum allocates %v times per call", allocs)
			}
		})
	}
}

func TestSumIsSafeForConcurrentUse(t *testing.T) {
	f := New([]string{"Content-Type"}, true)
	bodies := []string{apiJSON(1<<10, 1), apiJSON(4<<10, 2), "not json", `{"b":1,"a":2}`}
	want := make([][]byte, len(bodies))
	for i, b := range bodies {
		r := baseRequest()
		r.body = b
		want[i] = r.sum(f)
	}
	done := make(chan struct{})
	for g := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 200 {
				k := (g + i) % len(bodies)
				r := baseRequest()
				r.body = bodies[k]
				if got := r.sum(f); !bytes.Equal(got, want[k]) {
					t.Errorf("concurrent sum of body %d differs", k)
					return
				}
			}
		}()
	}
	for range 8 {
		<-done
	}
}

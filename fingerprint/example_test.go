package fingerprint_test

import (
	"bytes"
	"fmt"
	"net/http"

	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
)

func ExampleParseKey() {
	// A bare key and its RFC 8941 string spelling are one key.
	a, _ := fingerprint.ParseKey([]string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, 255)
	b, _ := fingerprint.ParseKey([]string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, 255)
	fmt.Println(a == b)

	// A list, or a key longer than the limit, is refused.
	_, err := fingerprint.ParseKey([]string{"a, b"}, 255)
	fmt.Println(err != nil)
	// Output:
	// true
	// true
}

func ExampleFingerprinter_Sum() {
	f := fingerprint.New([]string{"Content-Type"}, true)
	header := http.Header{"Content-Type": {"application/json"}}
	first := f.Sum(nil, "POST", "/orders", "", header, []byte(`{"amount":100,"currency":"EUR"}`))
	// A retry re-serialised by another client library: same meaning.
	retry := f.Sum(nil, "POST", "/orders", "", header, []byte(`{ "currency": "EUR", "amount": 1e2 }`))
	// Another request under the same key.
	other := f.Sum(nil, "POST", "/orders", "", header, []byte(`{"amount":200,"currency":"EUR"}`))
	fmt.Println(bytes.Equal(first, retry), bytes.Equal(first, other))
	// Output: true false
}

func ExampleFingerprinter_Differs() {
	f := fingerprint.New(nil, true)
	header := http.Header{"Content-Type": {"application/json"}}
	// Kept with the record of the first request: salted digests, no values.
	detail := f.Detail("POST", "/orders", "", header, []byte(`{"amount":100,"currency":"EUR"}`))
	differs, _ := f.Differs(detail, "POST", "/orders", "", header, []byte(`{"amount":250,"currency":"EUR"}`))
	fmt.Println(differs)
	// Output: [body /amount]
}

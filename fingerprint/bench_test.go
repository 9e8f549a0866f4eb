package fingerprint

import (
	"net/http"
	"testing"
)

func BenchmarkParseKey(b *testing.B) {
	for _, bc := range []struct{ name, value string }{
		{"bare UUID", "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{"sf-string", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`},
		{"sf-string with escapes", `"8e03978e-\"40d5\"-43e8-bc93-6894a57f9324"`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			values := []string{bc.value}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ParseKey(values, 255); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkCanonicalJSON1KiB(b *testing.B) {
	src := []byte(apiJSON(1<<10, 1))
	dst := make([]byte, 0, 4*len(src))
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if dst, err = AppendCanonicalJSON(dst[:0], src); err != nil {
			b.Fatal(err)
		}
	}
}

func benchmarkSum(b *testing.B, f *Fingerprinter, body []byte) {
	header := http.Header{"Content-Type": {"application/json"}}
	dst := make([]byte, 0, Size)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		dst = f.Sum(dst[:0], "POST", "/v1/orders", "dry_run=0", header, body)
	}
}

func BenchmarkSum1KiB(b *testing.B) {
	benchmarkSum(b, New([]string{"Content-Type"}, true), []byte(apiJSON(1<<10, 1)))
}

func BenchmarkSum64KiB(b *testing.B) {
	benchmarkSum(b, New([]string{"Content-Type"}, true), []byte(apiJSON(64<<10, 1)))
}

func BenchmarkSumRaw64KiB(b *testing.B) {
	benchmarkSum(b, New([]string{"Content-Type"}, false), []byte(apiJSON(64<<10, 1)))
}

// BenchmarkDetail1KiB is what every new key pays to be able to say, in a
// later 422, what differs.
func BenchmarkDetail1KiB(b *testing.B) {
	f := New([]string{"Content-Type"}, true)
	header := http.Header{"Content-Type": {"application/json"}}
	body := []byte(apiJSON(1<<10, 1))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if len(f.Detail("POST", "/v1/orders", "", header, body)) == 0 {
			b.Fatal("empty detail")
		}
	}
}

func TestDetailAllocatesOnlyItsResult(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items; allocation counts are meaningless")
	}
	f := New([]string{"Content-Type"}, true)
	header := http.Header{"Content-Type": {"application/json"}}
	body := []byte(`{"amount":100,"currency":"EUR","items":[{"sku":"a"}]}`)
	f.Detail("POST", "/v1/orders", "", header, body) // warm the pools
	if n := testing.AllocsPerRun(100, func() { f.Detail("POST", "/v1/orders", "", header, body) }); n > 1 {
		t.Fatalf("Detail costs %v allocations, want 1 (its result)", n)
	}
}

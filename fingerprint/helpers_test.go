package fingerprint

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// apiJSON returns a realistic API request body of about size bytes: an
// order with a customer, line items and metadata, members in the unsorted
// order client libraries emit, with some escapes, non-ASCII text, decimals
// and integers beyond float64 precision. The same seed gives the same text.
func apiJSON(size int, seed uint64) string {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	var b strings.Builder
	fmt.Fprintf(&b, `{"order_id":"ord_%016x","currency":"EUR","customer":{"id":%d,"email":"client%d@example.com",`,
		r.Uint64(), 10000000000000000000+r.Uint64()%1000, r.IntN(1000))
	b.WriteString(`"name":"Jos\u00e9 d'Avila","address":{"street":"Rua das Flores, 12\n2\u00ba andar","city":"S\u00e3o Paulo","zip":"01000-000","country":"BR"}},`)
	b.WriteString(`"metadata":{"source":"mobile\/ios","campaign":null,"retry":false,"note":"caf\u00e9 \"special\""},"items":[`)
	for i := 0; ; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"sku":"SKU-%05d","quantity":%d,"unit_price":%d.%02d,"discount":%.1fe-1,"gift":%t,"tags":["t%d","promo"],"title":"Item n\u00ba %d – ünïcødé"}`,
			r.IntN(100000), 1+r.IntN(5), r.IntN(500), r.IntN(100), float64(r.IntN(50)), r.IntN(2) == 0, r.IntN(9), i)
		if b.Len() >= size-120 {
			break
		}
	}
	fmt.Fprintf(&b, `],"total":%d.%02d,"created_at":"2025-01-%02dT10:00:00Z"}`, r.IntN(100000), r.IntN(100), 1+r.IntN(28))
	return b.String()
}

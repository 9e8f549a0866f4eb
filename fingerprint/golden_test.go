package fingerprint

import (
	"encoding/hex"
	"net/http"
	"testing"
)

// TestSumIsStable pins fingerprints: records written by an earlier build
// are compared with fingerprints of this one, so a change to the framing
// would turn every honest retry across an upgrade into a 422.
func TestSumIsStable(t *testing.T) {
	header := http.Header{"Content-Type": {"application/json; charset=UTF-8"}, "X-Tenant": {"acme", "eu"}}
	for _, tc := range []struct {
		name      string
		canonical bool
		body      string
		want      string
	}{
		{"canonical JSON", true, `{"b":[1,2.50],"a":"x"}`, "7416396fb463aae1334416f5e2366b822ee289c41278c9d46be58722f5981e34"},
		{"bytes", false, `{"b":[1,2.50],"a":"x"}`, "e94187297cd0b8ab416f7d4bcffb60a9dfda4632b38b803a401c941d9365ac9e"},
	} {
		f := New([]string{"Content-Type", "X-Tenant"}, tc.canonical)
		sum := f.Sum(nil, "POST", "/v1/orders", "page=2", header, []byte(tc.body))
		if got := hex.EncodeToString(sum); got != tc.want {
			t.Errorf("%s: Sum = %s, want %s", tc.name, got, tc.want)
		}
	}
}

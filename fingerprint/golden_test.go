package fingerprint

import (
	"crypto/sha256"
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

// TestDetailDigestIsStable pins the part digests of each detail version
// that writes them (sumState.digest): a detail is kept in a record, and
// a 422 after an upgrade reads it with this build's digest.
func TestDetailDigestIsStable(t *testing.T) {
	salt := []byte("0123456789abcdef")
	for _, tc := range []struct {
		version byte
		want    string
	}{
		{detailVersionV2, "d8904221545cc191"},
		{detailVersion, "4c570f0d2e131035"},
	} {
		st := &sumState{h: sha256.New(), seed: append([]byte{tc.version}, salt...)}
		st.frame = append(appendString(nil, "method"), "POST"...)
		d := st.digest([]byte("value"))
		if got := hex.EncodeToString(d[:]); got != tc.want {
			t.Errorf("version %d: digest %s, want %s", tc.version, got, tc.want)
		}
	}
}

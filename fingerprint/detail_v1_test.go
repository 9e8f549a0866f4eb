package fingerprint

import (
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"testing"
)

// detailV1 writes a detail as the first version of Detail did (detail
// version 1), so that tests can check that records written before an
// upgrade still give sound answers: its "body" part digests the hashed
// body (the tag and the canonical or raw bytes), there is no part for the
// raw bytes of a JSON body, and members are listed for objects of up to
// maxMemberParts members, with no mark of completeness.
func detailV1(f *Fingerprinter, salt [saltSize]byte, method, path, rawQuery string, header http.Header, body []byte) []byte {
	var cfg Fingerprinter
	if f != nil {
		cfg = *f
	}
	st := &sumState{h: sumPool.Get().(*sumState).h}
	type namedDigest struct {
		name   string
		digest [partDigestSize]byte
	}
	var parts []namedDigest
	digest := func(name string, frame, value []byte) {
		st.h.Reset()
		st.h.Write(salt[:])
		st.h.Write(frame)
		st.h.Write(value)
		sum := st.h.Sum(nil)
		parts = append(parts, namedDigest{name, [partDigestSize]byte(sum[:partDigestSize])})
	}
	digest("method", append(appendString(nil, "method"), method...), nil)
	digest("path", append(appendString(nil, "path"), path...), nil)
	digest("query", append(appendString(nil, "query"), rawQuery...), nil)
	for _, name := range cfg.headers {
		n := "header " + name
		digest(n, appendHeaderValues(appendString(nil, n), name, header[name]), nil)
	}
	payload, tag := cfg.body(st, header, body, "")
	digest("body", append(appendString(nil, "body"), tag), payload)
	if tag == bodyCanonical {
		var members []namedDigest
		count := 0
		ok := canonicalMembers(payload, func(name, member []byte) bool {
			count++
			if count > maxMemberParts || len(name) > maxMemberName {
				return false
			}
			n := string(appendPointer(nil, name))
			members = append(members, namedDigest{n, [partDigestSize]byte{}})
			st.h.Reset()
			st.h.Write(salt[:])
			st.h.Write(appendString(nil, n))
			st.h.Write(member)
			sum := st.h.Sum(nil)
			members[len(members)-1].digest = [partDigestSize]byte(sum[:partDigestSize])
			return true
		})
		if ok {
			parts = append(parts, members...)
		}
	}
	out := []byte{1}
	out = append(out, salt[:]...)
	out = binary.AppendUvarint(out, uint64(len(parts)))
	for _, p := range parts {
		out = appendString(out, p.name)
		out = append(out, p.digest[:]...)
	}
	return out
}

// TestDetailV1HelperMatchesTheFirstVersion pins detailV1 against a detail
// the first version wrote, so that the compatibility tests test what was
// really stored.
func TestDetailV1HelperMatchesTheFirstVersion(t *testing.T) {
	f, err := NewFingerprinter(Options{Headers: []string{"Content-Type", "X-Tenant"}, CanonicalJSON: true, Ignore: mustPointers(t, "/sent_at")})
	if err != nil {
		t.Fatal(err)
	}
	var salt [saltSize]byte
	for i := range salt {
		salt[i] = byte(i)
	}
	// Written by the first version's Detail with this salt.
	for _, c := range []struct{ contentType, body, want string }{
		{"application/json", "{\"amount\":10,\"currency\":\"EUR\",\"sent_at\":1,\"a/b\":[1,{\"x\":2}],\"a\":1,\"a\":2}", "01000102030405060708090a0b0c0d0e0f0b066d6574686f64999bc86f9258e75904706174681f1f02a26af7a712057175657279c0e70463ec5815ff1368656164657220436f6e74656e742d547970655565756f61e3cd040f68656164657220582d54656e616e7469eef81d625c46eb04626f6479b1bc8195f75a302b022f611ce35cc744e4eff8022f61d9b1cebffbd1bde4052f617e31625122616748627e78072f616d6f756e748d87343a2c50c565092f63757272656e6379c1c3a769e512664c"},
		{"", "{\"amount\":10}", "01000102030405060708090a0b0c0d0e0f06066d6574686f64999bc86f9258e75904706174681f1f02a26af7a712057175657279c0e70463ec5815ff1368656164657220436f6e74656e742d54797065baf15cb6a4bb90a00f68656164657220582d54656e616e7469eef81d625c46eb04626f64795385e18b06c08f07"},
		{"application/json", "[1,2]", "01000102030405060708090a0b0c0d0e0f06066d6574686f64999bc86f9258e75904706174681f1f02a26af7a712057175657279c0e70463ec5815ff1368656164657220436f6e74656e742d547970655565756f61e3cd040f68656164657220582d54656e616e7469eef81d625c46eb04626f64797b0f4f721e5e7a9d"},
		{"application/json", "{}", "01000102030405060708090a0b0c0d0e0f06066d6574686f64999bc86f9258e75904706174681f1f02a26af7a712057175657279c0e70463ec5815ff1368656164657220436f6e74656e742d547970655565756f61e3cd040f68656164657220582d54656e616e7469eef81d625c46eb04626f647951d2f77e9562f4a2"},
		{"text/plain", "hello", "01000102030405060708090a0b0c0d0e0f06066d6574686f64999bc86f9258e75904706174681f1f02a26af7a712057175657279c0e70463ec5815ff1368656164657220436f6e74656e742d54797065b619692e0b3b01050f68656164657220582d54656e616e7469eef81d625c46eb04626f6479af6f84e0c7fa58c5"},
	} {
		h := http.Header{"X-Tenant": {"t1"}}
		if c.contentType != "" {
			h.Set("Content-Type", c.contentType)
		}
		if got := hex.EncodeToString(detailV1(f, salt, "POST", "/p", "q=1", h, []byte(c.body))); got != c.want {
			t.Errorf("%s %s: detailV1 wrote\n%s, the first version\n%s", c.contentType, c.body, got, c.want)
		}
	}
}

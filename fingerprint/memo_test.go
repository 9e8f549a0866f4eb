package fingerprint

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
)

// memoRequest is one request of the memo's tests.
type memoRequest struct {
	method, path, query string
	header              http.Header
	body                string
}

func memoRequests() []memoRequest {
	json := http.Header{"Content-Type": {"application/json"}}
	text := http.Header{"Content-Type": {"text/plain"}}
	tenant := func(t string) http.Header {
		return http.Header{"Content-Type": {"application/json"}, "X-Tenant": {t}}
	}
	return []memoRequest{
		{"POST", "/orders", "", json, `{"a":1,"b":[1,2]}`},
		{"POST", "/orders", "", json, `{"b":[1,2],"a":1}`}, // same canonical JSON
		{"POST", "/orders", "", json, `{ "a" : 1 , "b" : [1,2] }`},
		{"POST", "/orders", "", json, `{"a":1,"b":[2,1]}`},
		{"PUT", "/orders", "", json, `{"a":1,"b":[1,2]}`},
		{"POST", "/orders/2", "", json, `{"a":1,"b":[1,2]}`},
		{"POST", "/orders", "x=1", json, `{"a":1,"b":[1,2]}`},
		{"POST", "/orders", "", tenant("t1"), `{"a":1,"b":[1,2]}`},
		{"POST", "/orders", "", tenant("t2"), `{"a":1,"b":[1,2]}`},
		{"POST", "/orders", "", text, `{"a":1,"b":[1,2]}`}, // not declared JSON: raw
		{"POST", "/orders", "", json, `{"a":1,"b":[1,2]`},  // not JSON: raw
		{"POST", "/orders", "", json, `{"a":1,"sent_at":"now"}`},
		{"POST", "/orders", "", json, `{"a":1,"sent_at":"later"}`},
		{"POST", "/orders", "", json, ``},
		// Over memoRawMax: remembered by digest, not by its bytes.
		{"POST", "/orders", "", json, largeJSON(false, 0)},
		{"POST", "/orders", "", json, largeJSON(true, 0)}, // same canonical JSON
		{"POST", "/orders", "", json, largeJSON(false, 1)},
	}
}

// largeJSON is an object body over memoRawMax, its members reversed or
// not, with one value changed by diff.
func largeJSON(reversed bool, diff int) string {
	var members []string
	for i := range 200 {
		members = append(members, fmt.Sprintf(`"m%03d":%d`, i, i+diff*(i/199)))
	}
	if reversed {
		slices.Reverse(members)
	}
	return "{" + strings.Join(members, ",") + "}"
}

// TestMemoizedSumsAreTheFreshOnes: whatever the memo remembers, every
// request gets the fingerprint a Fingerprinter without memo computes,
// asked in any order and again.
func TestMemoizedSumsAreTheFreshOnes(t *testing.T) {
	configs := map[string]Options{
		"canonical":          {CanonicalJSON: true},
		"canonical, headers": {CanonicalJSON: true, Headers: []string{"X-Tenant", "Content-Type"}},
		"canonical, ignore":  {CanonicalJSON: true, Ignore: []Pointer{mustPointer(t, "/sent_at")}},
	}
	for name, o := range configs {
		t.Run(name, func(t *testing.T) {
			f, err := NewFingerprinter(o)
			if err != nil {
				t.Fatal(err)
			}
			if f.memo == nil {
				t.Fatal("no memo")
			}
			fresh := *f
			fresh.memo = nil
			reqs := memoRequests()
			for round := range 3 {
				for i := range reqs {
					r := reqs[i]
					if round == 1 {
						r = reqs[len(reqs)-1-i]
					}
					got, gotCanonical := f.SumJSON(nil, r.method, r.path, r.query, r.header, []byte(r.body))
					want, wantCanonical := fresh.SumJSON(nil, r.method, r.path, r.query, r.header, []byte(r.body))
					if string(got) != string(want) || gotCanonical != wantCanonical {
						t.Fatalf("round %d, %+v: sum %x (canonical %v), want %x (%v)", round, r, got, gotCanonical, want, wantCanonical)
					}
				}
			}
		})
	}
}

// TestRepeatedJSONRequestIsNotParsedAgain: the second time the same bytes
// come, the sum is the memo's (a poisoned entry shows it is used), and a
// request that differs in any part does not get it.
func TestRepeatedJSONRequestIsNotParsedAgain(t *testing.T) {
	f, err := NewFingerprinter(Options{CanonicalJSON: true, Headers: []string{"X-Tenant"}})
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"Content-Type": {"application/json"}, "X-Tenant": {"t1"}}
	body := []byte(`{"a":1}`)
	first, _ := f.SumJSON(nil, "POST", "/orders", "", h, body)

	// Poison every entry: a request served from the memo now gets
	// all ones.
	poisoned := 0
	for i := range f.memo.shards {
		for j := range f.memo.shards[i].slots {
			if e := &f.memo.shards[i].slots[j]; e.used {
				for k := range e.sum {
					e.sum[k] = 0xff
				}
				poisoned++
			}
		}
	}
	if poisoned != 1 {
		t.Fatalf("%d entries remembered, want 1", poisoned)
	}
	again, _ := f.SumJSON(nil, "POST", "/orders", "", h, body)
	if again[0] != 0xff || string(again) == string(first) {
		t.Fatalf("the same request again was not served from the memo: %x", again)
	}
	for _, r := range []memoRequest{
		{"PUT", "/orders", "", h, `{"a":1}`},
		{"POST", "/order", "", h, `{"a":1}`},
		{"POST", "/orders", "a", h, `{"a":1}`},
		{"POST", "/orders", "", http.Header{"Content-Type": {"application/json"}, "X-Tenant": {"t2"}}, `{"a":1}`},
		{"POST", "/orders", "", h, `{"a":2}`},
		{"POST", "/orders", "", h, `{"a":1} `},
	} {
		if got, _ := f.SumJSON(nil, r.method, r.path, r.query, r.header, []byte(r.body)); got[0] == 0xff {
			t.Errorf("%+v got the remembered sum of another request", r)
		}
	}
}

// TestMemoComparesTheBytes: a remembered request's entry is used only
// for the very same bytes, small (compared as they are) or large
// (compared by SHA-256): an entry whose hash matches but whose bytes or
// digest do not is not.
func TestMemoComparesTheBytes(t *testing.T) {
	h := http.Header{"Content-Type": {"application/json"}}
	for name, body := range map[string]string{"small": `{"a":1}`, "large": largeJSON(false, 0)} {
		t.Run(name, func(t *testing.T) {
			f, err := NewFingerprinter(Options{CanonicalJSON: true})
			if err != nil {
				t.Fatal(err)
			}
			want, _ := f.SumJSON(nil, "POST", "/orders", "", h, []byte(body))
			found := 0
			for i := range f.memo.shards {
				for j := range f.memo.shards[i].slots {
					if e := &f.memo.shards[i].slots[j]; e.used {
						found++
						if len(body) > memoRawMax != (len(e.raw) == 0) {
							t.Fatalf("a %d-byte body kept %d raw bytes", len(body), len(e.raw))
						}
						if len(e.raw) > 0 {
							e.raw[len(e.raw)-1] ^= 1 // the body's last byte
						} else {
							e.digest[0] ^= 1
						}
						e.sum[0] ^= 0xff
					}
				}
			}
			if found != 1 {
				t.Fatalf("%d entries remembered, want 1", found)
			}
			if got, _ := f.SumJSON(nil, "POST", "/orders", "", h, []byte(body)); string(got) != string(want) {
				t.Fatalf("an entry of other bytes with the same hash answered: %x, want %x", got, want)
			}
		})
	}
}

func mustPointer(t *testing.T, s string) Pointer {
	t.Helper()
	p, err := ParsePointer(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDetailOfTheSumsCanonicalJSONIsTheDetail: a detail made from the
// canonical encoding SumJSONCanonical kept tells every later request the
// same differences as one Detail makes from the body.
func TestDetailOfTheSumsCanonicalJSONIsTheDetail(t *testing.T) {
	f, err := NewFingerprinter(Options{CanonicalJSON: true, Headers: []string{"X-Tenant"}, Ignore: []Pointer{mustPointer(t, "/sent_at")}})
	if err != nil {
		t.Fatal(err)
	}
	reqs := memoRequests()
	for _, first := range reqs {
		// A Fingerprinter of its own each time: a remembered request
		// keeps no canonical encoding.
		g := *f
		g.memo = newSumMemo()
		_, canon, canonical := g.SumJSONCanonical(nil, nil, first.method, first.path, first.query, first.header, []byte(first.body))
		if canonical != (len(canon) > 0) {
			t.Fatalf("%+v: canonical %v with %d bytes kept", first, canonical, len(canon))
		}
		if !canonical {
			canon = nil
		}
		kept := g.DetailCanonical(first.method, first.path, first.query, first.header, []byte(first.body), canon)
		made := g.Detail(first.method, first.path, first.query, first.header, []byte(first.body))
		for _, later := range reqs {
			a, okA := g.Differs(kept, later.method, later.path, later.query, later.header, []byte(later.body))
			b, okB := g.Differs(made, later.method, later.path, later.query, later.header, []byte(later.body))
			if okA != okB || strings.Join(a, ",") != strings.Join(b, ",") {
				t.Fatalf("first %+v, later %+v: the kept encoding's detail says %v (%v), Detail's %v (%v)", first, later, a, okA, b, okB)
			}
		}
	}
}

// TestMemoAgreesAcrossTheBoundary: bodies whose raw parts are around
// memoRawMax (kept as bytes below it, as a digest above), many sharing
// slots, some empty, asked concurrently and in any order, always get the
// fresh fingerprint, and no entry keeps more than memoRawMax bytes.
func TestMemoAgreesAcrossTheBoundary(t *testing.T) {
	f, err := NewFingerprinter(Options{CanonicalJSON: true, Headers: []string{"X-A"}})
	if err != nil {
		t.Fatal(err)
	}
	fresh := *f
	fresh.memo = nil
	h := http.Header{"Content-Type": {"application/json"}}
	type req struct{ path, body, want string }
	var reqs []req
	for n := memoRawMax - 200; n <= memoRawMax+10; n++ {
		for _, p := range []string{"/a", "/b"} {
			body := `{"k":"` + strings.Repeat("x", max(0, n-8)) + `"}`
			if n%7 == 0 {
				body = ""
			}
			w, _ := fresh.SumJSON(nil, "POST", p, "", h, []byte(body))
			reqs = append(reqs, req{p, body, string(w)})
		}
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Go(func() {
			for round := range 3 {
				for i := range reqs {
					r := reqs[(i*(g+1)+round)%len(reqs)]
					if got, _ := f.SumJSON(make([]byte, 0, Size), "POST", r.path, "", h, []byte(r.body)); string(got) != r.want {
						errs <- fmt.Sprintf("%s, a body of %d bytes: the memo gave another sum", r.path, len(r.body))
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	for i := range f.memo.shards {
		for j := range f.memo.shards[i].slots {
			if e := &f.memo.shards[i].slots[j]; cap(e.raw) > memoRawMax {
				t.Errorf("an entry of %d bytes keeps %d of capacity, over memoRawMax", len(e.raw), cap(e.raw))
			}
		}
	}
}

// TestMemoEntryCapacityIsBounded: a slot reused by a larger request keeps
// at most memoRawMax bytes of capacity, so that the memo holds at most
// memoShards × memoSlots × memoRawMax bytes (append's growth would leave
// up to 3 KiB in a slot).
func TestMemoEntryCapacityIsBounded(t *testing.T) {
	m := newSumMemo()
	var sum [Size]byte
	for _, n := range []int{100, 1100, 2040, memoRawMax} {
		k := memoKey{framed: make([]byte, 40), body: make([]byte, n-40)}
		m.put(&k, &sum)
		if e := &m.shards[0].slots[0]; cap(e.raw) > memoRawMax {
			t.Fatalf("after a request of %d bytes the entry keeps %d bytes of capacity, over memoRawMax (%d)", n, cap(e.raw), memoRawMax)
		}
	}
}

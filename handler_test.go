package idempotency

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

func TestReplayKeepsMultiValuedHeadersAndDropsHopByHop(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Add("Set-Cookie", "a=1")
		w.Header().Add("Set-Cookie", "b=2")
		w.Header().Set("Date", "Mon, 01 Jan 2001 00:00:00 GMT")
		w.Header().Set("Connection", "X-Private")
		w.Header().Set("X-Private", "per-connection")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.WriteHeader(http.StatusOK)
		return nil
	}}
	serve(h, up, request("k", ""))
	retry := serve(h, up, request("k", ""))
	if got := retry.Header().Values("Set-Cookie"); len(got) != 2 || got[0] != "a=1" || got[1] != "b=2" {
		t.Fatalf("Set-Cookie = %q", got)
	}
	for _, name := range []string{"Date", "Connection", "X-Private", "Keep-Alive"} {
		if v := retry.Header().Get(name); v != "" {
			t.Errorf("replay repeats %s: %q", name, v)
		}
	}
}

func TestSFStringKeyIsTheSameKeyAsBare(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{}
	serve(h, up, request("abc-123", "{}"))
	retry := serve(h, up, request(`"abc-123"`, "{}"))
	if retry.Header().Get("Idempotent-Replayed") != "true" || up.Calls.Load() != 1 {
		t.Fatalf("sf-string key not matched to bare key: replayed=%q calls=%d", retry.Header().Get("Idempotent-Replayed"), up.Calls.Load())
	}
}

func TestKeyReusedForOtherRequestIsMismatch(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{}
	serve(h, up, request("k", `{"amount":10}`))

	cases := map[string]*http.Request{
		"other body": request("k", `{"amount":11}`),
		"other path": func() *http.Request {
			r := request("k", `{"amount":10}`)
			r.URL.Path = "/refunds"
			return r
		}(),
		"other query": func() *http.Request {
			r := request("k", `{"amount":10}`)
			r.URL.RawQuery = "dry_run=1"
			return r
		}(),
		"other method": func() *http.Request {
			r := request("k", `{"amount":10}`)
			r.Method = http.MethodPatch
			return r
		}(),
		"other content type": func() *http.Request {
			r := request("k", `{"amount":10}`)
			r.Header.Set("Content-Type", "text/plain")
			return r
		}(),
	}
	for name, r := range cases {
		t.Run(name, func(t *testing.T) {
			w := serve(h, up, r)
			if w.Code != http.StatusUnprocessableEntity {
				t.Fatalf("status %d, want 422", w.Code)
			}
			if p := problemOf(t, w); p.Title != "Idempotency-Key is already used" {
				t.Fatalf("title %q", p.Title)
			}
		})
	}
	if n := up.Calls.Load(); n != 1 {
		t.Fatalf("upstream ran %d times, want 1", n)
	}
}

func TestMismatchIsCheckedBeforeInFlight(t *testing.T) {
	h := isolated(t, &Handler{})
	up, release, done := holdInFlight(h, request("k", `{"a":1}`))

	if w := serve(h, up, request("k", `{"a":2}`)); w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("other request while in flight: %d, want 422", w.Code)
	}
	w := serve(h, up, request("k", `{"a":1}`))
	if w.Code != http.StatusConflict {
		t.Fatalf("same request while in flight: %d, want 409", w.Code)
	}
	if w.Header().Get("Retry-After") == "" {
		t.Fatal("409 without Retry-After")
	}
	if p := problemOf(t, w); p.Title != "A request is outstanding for this Idempotency-Key" {
		t.Fatalf("title %q", p.Title)
	}
	release()
	<-done
}

func TestCanonicalJSONMatchesReorderedBody(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{}
	serve(h, up, request("k", `{"amount":10,"currency":"EUR"}`))
	retry := serve(h, up, request("k", "{ \"currency\": \"EUR\",\n \"amount\": 10.0 }"))
	if retry.Code != http.StatusCreated || retry.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("reordered JSON not replayed: %d", retry.Code)
	}

	off := false
	raw := isolated(t, &Handler{Fingerprint: &FingerprintConfig{CanonicalJSON: &off}})
	serve(raw, up, request("k", `{"amount":10,"currency":"EUR"}`))
	if w := serve(raw, up, request("k", `{"currency":"EUR","amount":10}`)); w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("canonical_json false: reordered body got %d, want 422", w.Code)
	}
}

func TestFingerprintHeadersAreCompared(t *testing.T) {
	h := isolated(t, &Handler{Fingerprint: &FingerprintConfig{Headers: []string{"X-Tenant"}}})
	up := &upstream{}
	r := request("k", "{}")
	r.Header.Set("X-Tenant", "a")
	serve(h, up, r)

	r = request("k", "{}")
	r.Header.Set("X-Tenant", "b")
	if w := serve(h, up, r); w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("other X-Tenant: %d, want 422", w.Code)
	}
	r = request("k", "{}")
	r.Header.Set("X-Tenant", "a")
	r.Header.Set("X-Other", "z") // not in the fingerprint
	if w := serve(h, up, r); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("same X-Tenant: %d, want a replay", w.Code)
	}
}

func TestMissingKeyPassesThroughUnlessRequired(t *testing.T) {
	up := &upstream{}
	h := isolated(t, &Handler{})
	for range 2 {
		if w := serve(h, up, request("", "{}")); w.Code != http.StatusCreated {
			t.Fatalf("no key: %d", w.Code)
		}
	}
	if up.Calls.Load() != 2 {
		t.Fatalf("requests without a key must each run: %d", up.Calls.Load())
	}

	req := isolated(t, &Handler{Required: true})
	w := serve(req, up, request("", "{}"))
	if w.Code != http.StatusBadRequest {
		t.Fatalf("required, no key: %d", w.Code)
	}
	if p := problemOf(t, w); p.Title != "Idempotency-Key is missing" || p.Type != "urn:caddy-idempotency:key-missing" {
		t.Fatalf("problem %+v", p)
	}
	if up.Calls.Load() != 2 {
		t.Fatal("upstream ran for a rejected request")
	}
}

func TestInvalidKeysAreRejected(t *testing.T) {
	h := isolated(t, &Handler{MaxKeyLength: 16})
	up := &upstream{}
	cases := map[string][]string{
		"empty":            {""},
		"empty sf-string":  {`""`},
		"too long":         {strings.Repeat("a", 17)},
		"too long quoted":  {`"` + strings.Repeat("a", 17) + `"`},
		"10k bytes":        {strings.Repeat("k", 10_000)},
		"control byte":     {"ab\x01c"},
		"DEL":              {"ab\x7fc"},
		"non UTF-8":        {"ab\xffc"},
		"UTF-8 letter":     {"cl\u00e9"},
		"space inside":     {"a b"},
		"several lines":    {"a", "b"},
		"bare list":        {"a,b"},
		"sf list":          {`"a", "b"`},
		"unterminated":     {`"abc`},
		"bad escape":       {`"a\b"`},
		"trailing garbage": {`"abc"x`},
	}
	for name, values := range cases {
		t.Run(name, func(t *testing.T) {
			r := request("", "{}")
			r.Header["Idempotency-Key"] = values
			w := serve(h, up, r)
			if w.Code != http.StatusBadRequest {
				t.Fatalf("status %d, want 400", w.Code)
			}
			p := problemOf(t, w)
			if p.Title != "Idempotency-Key is invalid" || p.Detail == "" {
				t.Fatalf("problem %+v", p)
			}
			if len(p.Detail) > 200 {
				t.Fatalf("detail too long (echoes the key?): %q", p.Detail)
			}
		})
	}
	if up.Calls.Load() != 0 {
		t.Fatalf("upstream ran %d times for invalid keys", up.Calls.Load())
	}
	if n := records(h); n != 0 {
		t.Fatalf("invalid keys left %d records", n)
	}
}

func TestKeyAtMaxLengthIsAccepted(t *testing.T) {
	h := isolated(t, &Handler{MaxKeyLength: 16})
	if w := serve(h, &upstream{}, request(`"`+strings.Repeat("a", 16)+`"`, "{}")); w.Code != http.StatusCreated {
		t.Fatalf("16-char key: %d", w.Code)
	}
}

func TestMethodsNotListedPassThroughUntouched(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{}
	for range 2 {
		r := request("k", "{}")
		r.Method = http.MethodPut
		if w := serve(h, up, r); w.Header().Get("Idempotent-Replayed") != "" {
			t.Fatal("PUT was replayed; only POST and PATCH use keys by default")
		}
	}
	if up.Calls.Load() != 2 {
		t.Fatalf("PUT ran %d times, want 2", up.Calls.Load())
	}

	put := isolated(t, &Handler{Methods: []string{"put"}})
	for range 2 {
		r := request("k", "{}")
		r.Method = http.MethodPut
		serve(put, up, r)
	}
	if up.Calls.Load() != 3 {
		t.Fatalf("methods put: upstream ran %d times in all, want 3", up.Calls.Load())
	}
}

func TestScopesIsolateClientsAndHosts(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{}
	variants := []func(*http.Request){
		func(r *http.Request) { r.Header.Set("Authorization", "Bearer alice") },
		func(r *http.Request) { r.Header.Set("Authorization", "Bearer bob") },
		func(r *http.Request) {},
		func(r *http.Request) { r.Host = "other.example.com"; r.Header.Set("Authorization", "Bearer alice") },
	}
	for _, v := range variants {
		r := request("shared-key", "{}")
		v(r)
		if w := serve(h, up, r); w.Header().Get("Idempotent-Replayed") != "" {
			t.Fatal("a response was replayed across scopes")
		}
	}
	if up.Calls.Load() != int64(len(variants)) {
		t.Fatalf("upstream ran %d times, want %d", up.Calls.Load(), len(variants))
	}
	r := request("shared-key", "{}")
	r.Header.Set("Authorization", "Bearer bob")
	if w := serve(h, up, r); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("same client, same key: want a replay")
	}
}

func TestScopeIsHashedBeforeTheStore(t *testing.T) {
	h := isolated(t, &Handler{})
	r := request("k", "{}")
	r.Header.Set("Authorization", "Bearer secret-token")
	serve(h, &upstream{}, r)
	key := storage.Key{Scope: hashHex("example.com Bearer secret-token"), ID: "k"}
	if _, err := h.rawStore().Get(t.Context(), key, false); err != nil {
		t.Fatalf("record not under the hashed scope: %v", err)
	}
	if strings.Contains(key.Scope, "secret") {
		t.Fatal("scope not hashed")
	}
}

// A blank scope gets a problem of its own naming the scope's
// placeholders, never key-invalid, which blames a good key: a misspelt
// header ({http.request.header.Authorisation}) is a legal placeholder,
// empty in every request (issue 38).
func TestBlankScopeIsRejected(t *testing.T) {
	h := isolated(t, &Handler{Scope: "{http.request.header.X-Client-Id}"})
	up := &upstream{}
	w := serve(h, up, request("k", "{}"))
	if w.Code != http.StatusBadRequest || up.Calls.Load() != 0 {
		t.Fatalf("blank scope: %d, calls %d; want 400 and no call", w.Code, up.Calls.Load())
	}
	p := problemOf(t, w)
	if p.Type != "urn:caddy-idempotency:scope-empty" || !strings.Contains(p.Detail, "{http.request.header.X-Client-Id}") || !strings.Contains(p.Title, "scope") {
		t.Fatalf("blank scope: %+v, want the scope-empty problem naming the scope's placeholder", p)
	}
}

func TestCompletedResponseExpiresAfterTTL(t *testing.T) {
	backends(t).run(func(t *testing.T, b *testStore) {
		h := b.handler(t, &Handler{TTL: caddy.Duration(time.Second)})
		up := &upstream{}
		if w := serve(h, up, request("k", "{}")); w.Code != http.StatusCreated {
			t.Fatalf("first: %d", w.Code)
		}
		if w := serve(h, up, request("k", "{}")); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("within the TTL: %d, not replayed", w.Code)
		}
		time.Sleep(1300 * time.Millisecond)
		if w := serve(h, up, request("k", "{}")); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
			t.Fatalf("after the TTL: %d replayed=%q, want a fresh run", w.Code, w.Header().Get("Idempotent-Replayed"))
		}
		if up.Calls.Load() != 2 {
			t.Fatalf("upstream ran %d times, want 2", up.Calls.Load())
		}
	})
}

func TestReplayHeaderCanBeRenamedOrTurnedOff(t *testing.T) {
	up := &upstream{}
	renamed := isolated(t, &Handler{ReplayHeader: "X-Replayed"})
	serve(renamed, up, request("k", "{}"))
	w := serve(renamed, up, request("k", "{}"))
	if w.Header().Get("X-Replayed") != "true" || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("renamed replay header: %v", w.Header())
	}

	off := isolated(t, &Handler{ReplayHeader: "off"})
	serve(off, up, request("k", "{}"))
	w = serve(off, up, request("k", "{}"))
	if w.Header().Get("Idempotent-Replayed") != "" || w.Code != http.StatusCreated {
		t.Fatalf("replay_header off: %d %v", w.Code, w.Header())
	}
	if up.Calls.Load() != 2 {
		t.Fatalf("upstream ran %d times, want 2", up.Calls.Load())
	}
}

func TestProblemResponsesLinkDocs(t *testing.T) {
	h := isolated(t, &Handler{Required: true, DocsURL: "https://api.example.com/docs/idempotency"})
	w := serve(h, &upstream{}, request("", "{}"))
	if got := w.Header().Get("Link"); got != `<https://api.example.com/docs/idempotency>; rel="describedby"` {
		t.Fatalf("Link = %q", got)
	}
	var raw map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	for _, member := range []string{"type", "title", "status", "detail"} {
		if _, ok := raw[member]; !ok {
			t.Errorf("problem lacks %q: %s", member, w.Body.String())
		}
	}
	if w.Header().Get("Cache-Control") != "no-store" {
		t.Error("problem responses must not be cached")
	}
}

func TestPlaceholdersCarryOutcomeAndKeyHash(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{}
	cases := []struct {
		req     *http.Request
		outcome outcome
	}{
		{request("k", "{}"), outcomeNew},
		{request("k", "{}"), outcomeReplayed},
		{request("k", `{"x":1}`), outcomeMismatch},
		{request("", "{}"), outcomePassed},
		{request("a b", "{}"), outcomeInvalid},
	}
	for _, c := range cases {
		_, repl := servePlaceholders(h, up, c.req)
		if got, _ := repl.GetString(placeholderOutcome); got != string(c.outcome) {
			t.Errorf("outcome %q, want %q", got, c.outcome)
		}
	}
	_, repl := servePlaceholders(h, up, request("k", "{}"))
	if kh, _ := repl.GetString(placeholderKeyHash); len(kh) != 16 {
		t.Errorf("key_hash %q", kh)
	}
}

func TestOuterHandlerOwnsTheRequest(t *testing.T) {
	outer := isolated(t, &Handler{})
	inner := isolated(t, &Handler{Required: true, Header: "X-Other-Key"})
	up := &upstream{}
	chain := handlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return inner.ServeHTTP(w, r, up)
	})
	w := serve(outer, chain, request("k", "{}"))
	if w.Code != http.StatusCreated {
		t.Fatalf("inner handler acted on a request the outer one owns: %d %s", w.Code, w.Body.String())
	}
	if n := records(inner); n != 0 {
		t.Fatalf("inner handler stored %d records", n)
	}
}

type handlerFunc func(http.ResponseWriter, *http.Request) error

func (f handlerFunc) ServeHTTP(w http.ResponseWriter, r *http.Request) error { return f(w, r) }

func TestAnswersThatSayNothingWasDoneFreeTheKeyByDefault(t *testing.T) {
	for _, status := range []int{401, 403, 407, 408, 429, 503} {
		h := isolated(t, &Handler{})
		up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(status)
			return nil
		}}
		serve(h, up, request("k", "{}"))
		serve(h, up, request("k", "{}"))
		if n := up.Calls.Load(); n != 2 || records(h) != 0 {
			t.Errorf("status %d: the upstream ran %d times and %d records are kept; want 2 and none", status, n, records(h))
		}
	}
}

func TestAKeyJSONBodyThatNamesTheKeyTwiceIsRefused(t *testing.T) {
	h := isolated(t, &Handler{KeyJSON: "/data/id"})
	up := &upstream{}
	for _, body := range []string{`{"data":{"id":"a","id":"b"}}`, `{"data":{"id":"a"},"data":{"id":"b"}}`, `{"data":{"i\u0064":"a","id":"a"}}`} {
		r := request("", body)
		w := serve(h, up, r)
		if w.Code != http.StatusBadRequest || problemOf(t, w).Type != "urn:caddy-idempotency:key-invalid" {
			t.Errorf("%s: %d %s, want 400 key-invalid", body, w.Code, w.Body.String())
		}
	}
	if up.Calls.Load() != 0 {
		t.Fatalf("the upstream ran %d times for ambiguous bodies", up.Calls.Load())
	}
}

func TestReplayKeepsTheHeadersOuterHandlersSet(t *testing.T) {
	h := isolated(t, &Handler{})
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("X-Order", "42")
		// reverse_proxy adds the upstream's headers to those already set.
		w.Header().Add("Access-Control-Allow-Origin", "*")
		w.WriteHeader(http.StatusCreated)
		return nil
	}}
	first := serveWithOuterHeaders(h, up, request("k", "{}"), http.Header{
		"Access-Control-Allow-Origin": {"https://a.example"},
		"X-Request-Id":                {"one"},
	})
	if first.Header().Get("X-Order") != "42" {
		t.Fatalf("first: %v", first.Header())
	}
	retry := serveWithOuterHeaders(h, up, request("k", "{}"), http.Header{
		"Access-Control-Allow-Origin": {"https://b.example"},
		"X-Request-Id":                {"two"},
	})
	hdr := retry.Header()
	// The first answer had the outer handler's value and the upstream's
	// after it: so has the replay, with the current request's outer value.
	if got := hdr.Values("Access-Control-Allow-Origin"); !slices.Equal(got, []string{"https://b.example", "*"}) {
		t.Errorf("replay Access-Control-Allow-Origin = %q, want the current request's, then the upstream's", got)
	}
	if got := hdr.Values("X-Request-Id"); len(got) != 1 || got[0] != "two" {
		t.Errorf("replay X-Request-Id = %q, want the current request's", got)
	}
	if hdr.Get("X-Order") != "42" || hdr.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay lost the recorded headers: %v", hdr)
	}
	// A retry whose outer handlers set nothing gets what the inner ones
	// set, and nothing the first request's outer handlers set.
	bare := serve(h, up, request("k", "{}")).Header()
	if got := bare.Values("Access-Control-Allow-Origin"); len(got) != 1 || got[0] != "*" {
		t.Errorf("bare replay Access-Control-Allow-Origin = %q, want the upstream's [*]", got)
	}
	if got := bare.Values("X-Request-Id"); len(got) != 0 {
		t.Errorf("bare replay X-Request-Id = %q, want none: the first request's outer handlers set it", got)
	}
}

func TestNestedRequiredAppliesWhenTheOuterHandlerPassedTheRequestOn(t *testing.T) {
	outer := isolated(t, &Handler{})
	inner := isolated(t, &Handler{Required: true})
	up := &upstream{}
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return inner.ServeHTTP(w, r, up)
	})
	w, repl := servePlaceholders(outer, next, request("", "{}"))
	if w.Code != http.StatusBadRequest || up.Calls.Load() != 0 {
		t.Fatalf("keyless POST on the inner required route: %d, upstream ran %d times; want 400 and 0", w.Code, up.Calls.Load())
	}
	if o, _ := repl.GetString(placeholderOutcome); o != string(outcomeMissing) {
		t.Errorf("outcome %q, want missing", o)
	}
	// Once the outer handler has taken a key, the inner one passes through.
	if w := serve(outer, next, request("k", "{}")); w.Code != http.StatusCreated {
		t.Fatalf("keyed POST: %d", w.Code)
	}
	if w := serve(outer, next, request("k", "{}")); w.Header().Get("Idempotent-Replayed") != "true" || up.Calls.Load() != 1 {
		t.Fatalf("retry: %d, upstream ran %d times", w.Code, up.Calls.Load())
	}
	if records(inner) != 0 {
		t.Errorf("the inner handler stored %d records for a key the outer one took", records(inner))
	}
}

func TestPassedIsCountedOnceThroughNestedHandlers(t *testing.T) {
	outer := isolated(t, &Handler{})
	inner := isolated(t, &Handler{})
	up := &upstream{}
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return inner.ServeHTTP(w, r, up)
	})
	initMetrics()
	before := testCounter(outcomePassed)
	_, repl := servePlaceholders(outer, next, request("", "{}"))
	if o, _ := repl.GetString(placeholderOutcome); o != string(outcomePassed) {
		t.Errorf("outcome %q, want passed", o)
	}
	if got := testCounter(outcomePassed) - before; got != 1 {
		t.Errorf("passed counted %v times, want 1", got)
	}
}

package idempotency

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// adminCall runs one admin API request against the module's handlers.
func adminCall(t *testing.T, method, path string) (int, map[string]any) {
	t.Helper()
	var a adminAPI
	var handler func(http.ResponseWriter, *http.Request) error
	for _, route := range a.Routes() {
		if strings.HasPrefix(path, route.Pattern) {
			handler = route.Handler.ServeHTTP
		}
	}
	if handler == nil {
		t.Fatalf("no admin route for %s", path)
	}
	w := httptest.NewRecorder()
	if err := handler(w, httptest.NewRequest(method, path, nil)); err != nil {
		// As Caddy's admin endpoint renders an error.
		var apiErr caddy.APIError
		if !errors.As(err, &apiErr) || apiErr.HTTPStatus == 0 {
			t.Fatalf("admin handler error %v is not a caddy.APIError with a status", err)
		}
		return apiErr.HTTPStatus, map[string]any{"error": apiErr.Err.Error()}
	}
	var body map[string]any
	if w.Body.Len() > 0 && w.Body.Bytes()[0] == '{' {
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("admin body %q: %v", w.Body.String(), err)
		}
	}
	return w.Code, body
}

// keysPath is the admin API's path for key under the scope of the
// default template given as its values (host, Authorization).
func keysPath(key string, scope []string, extra string) string {
	return "/idempotency/keys?" + url.Values{"key": {key}, "scope": scope}.Encode() + extra
}

// storeID finds the pool id of h's store.
func storeID(t *testing.T, h *Handler) string {
	t.Helper()
	var id string
	for s := range backend.Live("") {
		if s.Store == h.rawStore() {
			id = s.ID
		}
	}
	if id == "" {
		t.Fatal("handler's store is not in the pool")
	}
	return id
}

// TestAdminShowsAndDeletesRecords reads a record through the admin API,
// with and without its body and by scope or scope hash, deletes it, and
// finds the key free again.
func TestAdminShowsAndDeletesRecords(t *testing.T) {
	backends(t).run(func(t *testing.T, b *testStore) {
		h := b.handler(t, &Handler{})
		up := &upstream{}
		r := request("admin-key", `{"a":1}`)
		r.Header.Set("Authorization", "Bearer alice")
		serve(h, up, r)
		scope := []string{"example.com", "Bearer alice"}
		sel := "&store=" + url.QueryEscape(storeID(t, h))

		code, body := adminCall(t, http.MethodGet, keysPath("admin-key", scope, sel))
		if code != http.StatusOK {
			t.Fatalf("GET: %d %v", code, body)
		}
		recs := body["records"].([]any)
		if len(recs) != 1 {
			t.Fatalf("records %v", recs)
		}
		rec := recs[0].(map[string]any)
		if rec["state"] != "completed" || rec["status"] != float64(http.StatusCreated) || rec["key_hash"] == "" {
			t.Fatalf("record %v", rec)
		}
		if _, ok := rec["body"]; ok {
			t.Fatal("body shown without body=true")
		}
		if len(rec["fingerprint"].(string)) != 64 || rec["expires_at"] == "" || rec["created_at"] == "" {
			t.Fatalf("record lacks fingerprint or times: %v", rec)
		}

		code, body = adminCall(t, http.MethodGet, keysPath("admin-key", scope, sel+"&body=true"))
		got, _ := base64.StdEncoding.DecodeString(body["records"].([]any)[0].(map[string]any)["body"].(string))
		if code != http.StatusOK || string(got) != `{"order":42}` {
			t.Fatalf("GET body=true: %d %q", code, got)
		}

		// The hashed form of the scope names the same record.
		code, _ = adminCall(t, http.MethodGet, "/idempotency/keys?key=admin-key&scope_hash="+hashHex("example.com Bearer alice")+sel)
		if code != http.StatusOK {
			t.Fatalf("GET by scope_hash: %d", code)
		}
		// So does the key_hash of the logs alone, in any store.
		kh := rec["key_hash"].(string)
		code, body = adminCall(t, http.MethodGet, "/idempotency/keys?key_hash="+kh)
		if code != http.StatusOK || len(body["records"].([]any)) != 1 || body["records"].([]any)[0].(map[string]any)["key_hash"] != kh {
			t.Fatalf("GET by key_hash: %d %v", code, body)
		}

		if code, _ := adminCall(t, http.MethodDelete, keysPath("admin-key", scope, sel)); code != http.StatusOK {
			t.Fatalf("DELETE: %d", code)
		}
		if code, body := adminCall(t, http.MethodGet, keysPath("admin-key", scope, sel)); code != http.StatusNotFound || body["error"] == nil {
			t.Fatalf("GET after DELETE: %d %v, want a 404 problem", code, body)
		}
		r = request("admin-key", `{"a":2}`) // another body: a fresh run, not a 422
		r.Header.Set("Authorization", "Bearer alice")
		if w := serve(h, up, r); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
			t.Fatalf("after DELETE the key must be free: %d", w.Code)
		}
	})
}

func TestAdminClearsAKeyStuckInFlight(t *testing.T) {
	h := isolated(t, &Handler{})
	up, release, done := holdInFlight(h, request("stuck", "{}"))
	sel := "&store=" + url.QueryEscape(storeID(t, h))
	code, body := adminCall(t, http.MethodGet, keysPath("stuck", []string{"example.com", ""}, sel))
	if code != http.StatusOK || body["records"].([]any)[0].(map[string]any)["state"] != "in_flight" {
		t.Fatalf("GET in flight: %d %v", code, body)
	}
	if code, _ := adminCall(t, http.MethodDelete, keysPath("stuck", []string{"example.com", ""}, sel)); code != http.StatusOK {
		t.Fatalf("DELETE: %d", code)
	}
	up.Serve = nil
	if w := serve(h, up, request("stuck", "{}")); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("a cleared key must run again: %d", w.Code)
	}
	release()
	<-done
	// The first request's late completion is fenced: the second one's
	// record stays.
	if w := serve(h, up, request("stuck", "{}")); w.Body.String() != `{"order":42}` {
		t.Fatalf("replay %q", w.Body.String())
	}
}

func TestAdminErrorsAreCaddyAPIErrors(t *testing.T) {
	isolated(t, &Handler{}) // at least one live store
	cases := []struct {
		method, path string
		status       int
	}{
		{http.MethodGet, "/idempotency/keys?scope=x", http.StatusBadRequest},
		{http.MethodGet, "/idempotency/keys?key=k", http.StatusBadRequest},
		{http.MethodGet, "/idempotency/keys?key=k&scope=x&scope_hash=" + hashHex("x"), http.StatusBadRequest},
		{http.MethodGet, "/idempotency/keys?key=k&scope_hash=zz", http.StatusBadRequest},
		{http.MethodGet, "/idempotency/keys?key=k&scope=x&scope=y&store=nosuch", http.StatusNotFound},
		{http.MethodGet, "/idempotency/keys?key=never-used&scope=x&scope=y", http.StatusNotFound},
		{http.MethodGet, "/idempotency/keys?key=k&scope=x&scope=y&scope=z", http.StatusBadRequest}, // 2 placeholders
		{http.MethodGet, "/idempotency/keys?key=k&scope=nospace", http.StatusBadRequest},           // not host and Authorization
		{http.MethodGet, "/idempotency/keys?key=k&scope=&scope=", http.StatusBadRequest},           // blank: never stored
		{http.MethodGet, "/idempotency/keys?key=k&scope_template=%7Bx%7D&scope_hash=" + hashHex("x"), http.StatusBadRequest},
		{http.MethodGet, "/idempotency/keys?key=k&scope_template=%7Bx%7D%2F%7Bx%7D&scope=a&scope=b", http.StatusBadRequest}, // {x} twice, two values
		{http.MethodGet, "/idempotency/keys?key_hash=0123456789abcdef&scope_template=global", http.StatusBadRequest},
		{http.MethodGet, "/idempotency/keys?key_hash=0123", http.StatusBadRequest},
		{http.MethodGet, "/idempotency/keys?key_hash=0123456789abcdef&key=k", http.StatusBadRequest},
		{http.MethodGet, "/idempotency/keys?key_hash=0123456789abcdef", http.StatusNotFound},
		{http.MethodPost, "/idempotency/keys?key=k&scope=x", http.StatusMethodNotAllowed},
		{http.MethodDelete, "/idempotency/stores", http.StatusMethodNotAllowed},
	}
	for _, c := range cases {
		code, body := adminCall(t, c.method, c.path)
		if code != c.status || body["error"] == nil {
			t.Errorf("%s %s: %d %v, want a %d error", c.method, c.path, code, body, c.status)
		}
	}
}

// listStores is GET /idempotency/stores's answer.
func listStores(t *testing.T) []storeInfo {
	t.Helper()
	var a adminAPI
	w := httptest.NewRecorder()
	if err := a.handleStores(w, httptest.NewRequest(http.MethodGet, "/idempotency/stores", nil)); err != nil {
		t.Fatal(err)
	}
	var list []storeInfo
	if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil {
		t.Fatal(err)
	}
	return list
}

func TestAdminListsLiveStores(t *testing.T) {
	h := isolated(t, &Handler{})
	id := storeID(t, h)
	list := listStores(t)
	for _, s := range list {
		if s.ID == id && s.Backend == "memory" && s.Handlers >= 1 {
			return
		}
	}
	t.Fatalf("store %s not listed: %+v", id, list)
}

// TestAdminListsRecordsInFlightPageByPage: GET /idempotency/in_flight
// lists a store's records in flight in pages, never a completed one, and
// refuses a malformed page.
func TestAdminListsRecordsInFlightPageByPage(t *testing.T) {
	h := isolated(t, &Handler{})
	id := storeID(t, h)
	running := map[string]bool{}
	for i := range 5 {
		key := storage.Key{Scope: "list", ID: fmt.Sprint(i)}
		if _, err := h.rawStore().Reserve(t.Context(), key, []byte("fp"), time.Minute); err != nil {
			t.Fatal(err)
		}
		running[key.Hash()] = true
	}
	done := storage.Key{Scope: "list", ID: "done"}
	res, _ := h.rawStore().Reserve(t.Context(), done, []byte("fp"), time.Minute)
	if err := h.rawStore().Complete(t.Context(), done, res.Token, &storage.Response{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}

	seen, after := map[string]bool{}, ""
	for page := 0; page < 10; page++ {
		path := "/idempotency/in_flight?limit=2&store=" + url.QueryEscape(id)
		if after != "" {
			path += "&after=" + after
		}
		code, body := adminCall(t, http.MethodGet, path)
		stores := body["stores"].([]any)
		if code != http.StatusOK || len(stores) != 1 {
			t.Fatalf("GET %s: %d %v", path, code, body)
		}
		p := stores[0].(map[string]any)
		for _, r := range p["records"].([]any) {
			rec := r.(map[string]any)
			if rec["state"] != "in_flight" {
				t.Fatalf("listed %v", rec)
			}
			seen[rec["key_hash"].(string)] = true
		}
		next, _ := p["next"].(string)
		if next == "" {
			break
		}
		after = next
	}
	for kh := range running {
		if !seen[kh] {
			t.Errorf("%s, in flight, was never listed", kh)
		}
	}
	if seen[done.Hash()] {
		t.Error("a completed record was listed")
	}
	for _, bad := range []string{"?limit=0", "?limit=1001", "?after=zz&store=" + url.QueryEscape(id), "?after=" + strings.Repeat("0", 16)} {
		if code, body := adminCall(t, http.MethodGet, "/idempotency/in_flight"+bad); code != http.StatusBadRequest {
			t.Errorf("GET in_flight%s: %d %v, want 400", bad, code, body)
		}
	}
	if code, _ := adminCall(t, http.MethodGet, "/idempotency/in_flight?store=nope"); code != http.StatusNotFound {
		t.Errorf("an unknown store: %d, want 404", code)
	}
}

// TestAdminStoresSayWhetherEachAnsweredItsLastPing: GET
// /idempotency/stores pings each store now and says whether it answered
// and when; ping=false shows that last ping without pinging again.
func TestAdminStoresSayWhetherEachAnsweredItsLastPing(t *testing.T) {
	addr := redistest.Addr()
	redistest.Require(t, addr)
	up := provision(t, &Handler{StorageRaw: json.RawMessage(fmt.Sprintf(`{"backend":"redis","url":"redis://%s/0","key_prefix":"ping-up-%s:"}`, addr, redistest.RandomHex(4)))})
	down := provision(t, &Handler{StorageRaw: json.RawMessage(`{"backend":"redis","url":"redis://127.0.0.1:1/0","timeout":"200ms","key_prefix":"ping-down:"}`)})
	stores := func(query string) map[string]storeInfo {
		var a adminAPI
		w := httptest.NewRecorder()
		if err := a.handleStores(w, httptest.NewRequest(http.MethodGet, "/idempotency/stores"+query, nil)); err != nil {
			t.Fatal(err)
		}
		var list []storeInfo
		if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil {
			t.Fatal(err)
		}
		byID := map[string]storeInfo{}
		for _, s := range list {
			byID[s.ID] = s
		}
		return byID
	}
	before := time.Now()
	now := stores("")
	upInfo, downInfo := now[storeID(t, up)], now[storeID(t, down)]
	if upInfo.Ping == nil || !upInfo.Ping.OK || upInfo.Ping.At.Before(before.Add(-time.Second)) {
		t.Fatalf("reachable Redis: ping %+v, want ok just now", upInfo.Ping)
	}
	if downInfo.Ping == nil || downInfo.Ping.OK || downInfo.Ping.Error == "" {
		t.Fatalf("unreachable Redis: ping %+v, want not ok, with the error", downInfo.Ping)
	}
	last := stores("?ping=false")[storeID(t, up)]
	if last.Ping == nil || !last.Ping.At.Equal(upInfo.Ping.At) {
		t.Fatalf("ping=false: %+v, want the last ping (%v) again", last.Ping, upInfo.Ping.At)
	}
}

// TestAdminScopeIsTheHandlersScope: the values of a client's scope, with
// spaces and backslashes, under the default template and templates whose
// values are escaped or length-prefixed, find the record the handler
// stored for that client, and the same text split into other values (a
// client the handler keeps apart) finds nothing.
func TestAdminScopeIsTheHandlersScope(t *testing.T) {
	const tenantUser = "{http.request.header.X-Tenant} {http.request.header.X-User}"
	cases := []struct {
		name     string
		template string // "": the default, and no scope_template
		header   map[string]string
		values   []string
		others   [][]string
	}{
		{"default", "", map[string]string{"Authorization": `Basic a\b  c`}, []string{"example.com", `Basic a\b  c`},
			[][]string{{"example.com Basic", `a\b  c`}}},
		{"default, the evaluated scope", "", map[string]string{"Authorization": `Basic a\b  c`}, []string{`example.com Basic a\b  c`}, nil},
		{"default, no Authorization", "", nil, []string{"example.com", ""}, nil},
		{"escaped", tenantUser, map[string]string{"X-Tenant": `acme corp\`, "X-User": `bo\b x`},
			[]string{`acme corp\`, `bo\b x`}, [][]string{{"acme", `corp\ bo\b x`}, {`acme corp\ bo\b`, "x"}}},
		{"length-prefixed: placeholders touch", "{http.request.header.X-Tenant}{http.request.header.X-User}",
			map[string]string{"X-Tenant": "a b", "X-User": `c\d`}, []string{"a b", `c\d`}, [][]string{{"a", `bc\d`}, {"", `a bc\d`}}},
		{"length-prefixed: a backslash follows", `t:{http.request.header.X-Tenant}\x{http.request.header.X-User}`,
			map[string]string{"X-Tenant": `a\x`, "X-User": "b"}, []string{`a\x`, "b"}, [][]string{{"a", `x\xb`}}},
		{"a placeholder twice", "{http.request.header.X-Tenant}/{http.request.header.X-Tenant}",
			map[string]string{"X-Tenant": "a/b"}, []string{"a/b", "a/b"}, nil},
		{"no placeholder", "global", nil, nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := isolated(t, &Handler{Scope: tc.template})
			r := request("scoped", "{}")
			for k, v := range tc.header {
				r.Header.Set(k, v)
			}
			w, repl := servePlaceholders(h, &upstream{}, r)
			if w.Code != http.StatusCreated {
				t.Fatalf("first request: %d %s", w.Code, w.Body.String())
			}
			keyHash, _ := repl.GetString(placeholderKeyHash)
			find := func(values []string) (int, map[string]any) {
				q := url.Values{"key": {"scoped"}, "scope": values, "store": {storeID(t, h)}}
				if tc.template != "" {
					q.Set("scope_template", tc.template)
				}
				return adminCall(t, http.MethodGet, "/idempotency/keys?"+q.Encode())
			}
			code, body := find(tc.values)
			if code != http.StatusOK {
				t.Fatalf("scope %q: %d %v, want the handler's record", tc.values, code, body)
			}
			if got := body["records"].([]any)[0].(map[string]any)["key_hash"]; got != keyHash {
				t.Fatalf("scope %q found key_hash %v, the handler stored %s", tc.values, got, keyHash)
			}
			for _, other := range tc.others {
				if code, body := find(other); code != http.StatusNotFound {
					t.Errorf("scope %q, another client: %d %v, want 404", other, code, body)
				}
			}
		})
	}
}

// TestAdminDocumentedScopeRecipesGiveTheHandlersHash runs the shell
// recipes of docs/operations.md that compute a scope_hash, and checks that
// each names the record the handler keeps for that client: its key_hash
// is the one the handler computed.
func TestAdminDocumentedScopeRecipesGiveTheHandlersHash(t *testing.T) {
	doc, err := os.ReadFile("docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var recipes []string
	for _, block := range strings.Split(string(doc), "```sh\n")[1:] {
		if body, _, _ := strings.Cut(block, "```"); strings.Contains(body, "scope_hash=$(") {
			recipes = append(recipes, body)
		}
	}
	// The clients of the recipes, in the page's order.
	clients := []struct {
		template string
		header   map[string]string
	}{
		{"", nil}, // the README's quick start: localhost, no Authorization
		{"{http.request.header.X-Tenant} {http.request.header.X-User}", map[string]string{"X-Tenant": "acme corp", "X-User": "bob"}},
		{"{http.request.header.X-Tenant}{http.request.header.X-User}", map[string]string{"X-Tenant": "acme corp", "X-User": "bob"}},
	}
	if len(recipes) != len(clients) {
		t.Fatalf("docs/operations.md has %d scope_hash recipes, this test knows %d", len(recipes), len(clients))
	}
	for i, c := range clients {
		out, err := exec.Command("sh", "-c", recipes[i]+`printf '%s' "$scope_hash"`).CombinedOutput()
		if err != nil {
			t.Fatalf("recipe %d: %v: %s", i+1, err, out)
		}
		h := isolated(t, &Handler{Scope: c.template})
		r := httptest.NewRequest(http.MethodPost, "http://localhost/orders", strings.NewReader("{}"))
		r.Header.Set("Idempotency-Key", "k")
		for k, v := range c.header {
			r.Header.Set(k, v)
		}
		_, repl := servePlaceholders(h, &upstream{}, r)
		want, _ := repl.GetString(placeholderKeyHash)
		if got := (storage.Key{Scope: string(out), ID: "k"}).Hash(); got != want {
			t.Errorf("recipe %d gives scope_hash %s, whose key_hash %s is not the handler's %s:\n%s", i+1, out, got, want, recipes[i])
		}
	}
}

// TestAdminStoresSayWhenTheirDurabilityFactsWereTaken: the durability
// facts are asked only after a ping that answered, so while a store is
// down they are the ones of its last answer; durability_at says when
// that was, so that they are not read as the facts of now.
func TestAdminStoresSayWhenTheirDurabilityFactsWereTaken(t *testing.T) {
	srv := redistest.StartServer(t)
	h := provision(t, &Handler{StorageRaw: json.RawMessage(fmt.Sprintf(`{"backend":"redis","url":"redis://%s/0","timeout":"200ms"}`, srv.Addr))})
	stores := func() storeInfo {
		list := listStores(t)
		for _, s := range list {
			if s.ID == storeID(t, h) {
				return s
			}
		}
		t.Fatalf("store %s not listed: %+v", storeID(t, h), list)
		return storeInfo{}
	}
	up := stores()
	if up.Durability == nil || up.DurabilityAt == nil || up.Ping == nil || up.DurabilityAt.Before(up.Ping.At) {
		t.Fatalf("store up: ping %+v, durability at %v; want facts taken after the ping", up.Ping, up.DurabilityAt)
	}
	// The start-up check may still be asking for the facts as well: what
	// counts is that the facts shown while the store is down were taken
	// before it went down, not when.
	srv.Kill()
	killed := time.Now()
	down := stores()
	if down.Ping == nil || down.Ping.OK || down.DurabilityAt == nil || down.DurabilityAt.Before(*up.DurabilityAt) || down.DurabilityAt.After(killed) {
		t.Fatalf("store down: ping %+v, durability at %v; want the failed ping and facts taken before the store went down (%v), as at %v or later", down.Ping, down.DurabilityAt, killed, up.DurabilityAt)
	}
}

// TestAdminListsAndReleasesOutcomeUnknownKeys: GET
// /idempotency/outcome_unknown lists the keys whose outcome is unknown
// (and no other record), with the status their client got; DELETE
// ?key_hash= releases one, and only such a record: its next request runs.
func TestAdminListsAndReleasesOutcomeUnknownKeys(t *testing.T) {
	backends(t).run(func(t *testing.T, b *testStore) {
		h := b.handler(t, &Handler{})
		id := storeID(t, h)
		fail := true
		up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
			if fail {
				return caddyhttp.Error(http.StatusGatewayTimeout, timeoutError{})
			}
			w.WriteHeader(http.StatusCreated)
			return nil
		}}
		unknown := map[string]string{} // key hash -> key
		for i := range 3 {
			key := fmt.Sprint("unknown-", i)
			serve(h, up, request(key, "{}"))
			unknown[h.keyOf(t, request(key, "{}")).Hash()] = key
		}
		fail = false
		serve(h, up, request("answered", "{}"))
		answered := h.keyOf(t, request("answered", "{}")).Hash()

		code, body := adminCall(t, http.MethodGet, "/idempotency/outcome_unknown?store="+url.QueryEscape(id))
		stores, _ := body["stores"].([]any)
		if code != http.StatusOK || len(stores) != 1 {
			t.Fatalf("GET outcome_unknown: %d %v", code, body)
		}
		seen := map[string]bool{}
		for _, r := range stores[0].(map[string]any)["records"].([]any) {
			rec := r.(map[string]any)
			if rec["outcome_unknown"] != true || rec["status"] != float64(http.StatusGatewayTimeout) {
				t.Fatalf("listed %v, want an outcome-unknown record of status 504", rec)
			}
			seen[rec["key_hash"].(string)] = true
		}
		for kh := range unknown {
			if !seen[kh] {
				t.Errorf("%s, whose outcome is unknown, was not listed (listed %v)", kh, seen)
			}
		}
		if seen[answered] {
			t.Error("a record that holds a response was listed")
		}

		if code, body := adminCall(t, http.MethodDelete, "/idempotency/outcome_unknown?key_hash="+answered); code != http.StatusNotFound {
			t.Fatalf("releasing a record that holds a response: %d %v, want 404", code, body)
		}
		if w := serve(h, up, request("answered", "{}")); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("the answered key after a refused release: %d, want its replay", w.Code)
		}
		for kh, key := range unknown {
			code, body := adminCall(t, http.MethodDelete, "/idempotency/outcome_unknown?key_hash="+kh+"&store="+url.QueryEscape(id))
			if code != http.StatusOK || body["key_hash"] != kh {
				t.Fatalf("DELETE outcome_unknown %s: %d %v", kh, code, body)
			}
			if w := serve(h, up, request(key, "{}")); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
				t.Fatalf("a released key must run again: %d", w.Code)
			}
			break
		}
		for _, c := range []struct {
			method, path string
			status       int
		}{
			{http.MethodDelete, "/idempotency/outcome_unknown", http.StatusBadRequest},
			{http.MethodDelete, "/idempotency/outcome_unknown?key_hash=zz", http.StatusBadRequest},
			{http.MethodDelete, "/idempotency/outcome_unknown?key_hash=" + answered + "&key=k", http.StatusBadRequest},
			{http.MethodDelete, "/idempotency/outcome_unknown?key_hash=" + answered + "&store=nosuch", http.StatusNotFound},
			{http.MethodPost, "/idempotency/outcome_unknown", http.StatusMethodNotAllowed},
			{http.MethodGet, "/idempotency/outcome_unknown?limit=0", http.StatusBadRequest},
		} {
			if code, body := adminCall(t, c.method, c.path); code != c.status || body["error"] == nil {
				t.Errorf("%s %s: %d %v, want a %d error", c.method, c.path, code, body, c.status)
			}
		}
	})
}
